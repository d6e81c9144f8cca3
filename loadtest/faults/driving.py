"""The run: the control plane, the reference, warmwatch, the clients, traffic and faults
started and stopped in order, then everything checked."""

from __future__ import annotations

import asyncio
import itertools
import random
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp

from loadtest import goclient, kubeapi, toxiproxy
from loadtest.checking import (
    ClientLog,
    Counts,
    EventType,
    Item,
    Report,
    Run,
    Violation,
    check_run,
    format_run,
)
from loadtest.cluster import ControlPlane
from loadtest.faults import CRD_MANIFEST, WRITE_TIMEOUT, Key, RunFailed, say
from loadtest.faults.cachelog import CacheLog
from loadtest.faults.clients import WatchClient, client_specs
from loadtest.faults.informers import GoInformer
from loadtest.faults.injecting import Injector
from loadtest.faults.options import Options
from loadtest.faults.resources import CONFIGMAPS, RESOURCES, WIDGETS, Resource, as_item
from loadtest.faults.traffic import Traffic
from loadtest.history import EtcdHistory
from loadtest.sidecar import Sidecar


def combine(
    reports: Sequence[Report], extra: Sequence[Violation], go_events: int, faults: int
) -> Report:
    def total(name: str) -> int:
        return sum(int(getattr(report.counts, name)) for report in reports)

    counts = Counts(
        clients=total("clients"),
        reference_changes=total("reference_changes"),
        events=total("events") + go_events,
        snapshots=total("snapshots"),
        bookmarks=total("bookmarks"),
        resumes=total("resumes"),
        expired=total("expired"),
        relists=total("relists"),
    )
    violations = tuple(v for report in reports for v in report.violations) + tuple(extra)
    return Report(faults=faults, counts=counts, violations=violations)


def _replay(history: EtcdHistory) -> dict[Key, int]:
    state = {item.key: item.rv for item in history.initial}
    for change in history.changes:
        key = (change.namespace, change.name)
        if change.type is EventType.DELETED:
            state.pop(key, None)
        else:
            state[key] = change.rv
    return state


def _kubectl(plane: ControlPlane, *args: str) -> str:
    result = subprocess.run(
        [str(plane.kubectl()), f"--kubeconfig={plane.admin_kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if result.returncode != 0:
        raise RunFailed(f"kubectl {' '.join(args)}: {result.stderr}")
    return result.stdout


class Driver:
    def __init__(self, options: Options) -> None:
        self.options = options
        self.rng = random.Random(options.seed)
        self.directory = options.directory.resolve()
        self.plane = ControlPlane(options.plane_dir or self.directory / "cp")
        self.own_plane = options.plane_dir is None

    async def _apiserver_state(self, api: kubeapi.RawClient, resource: Resource) -> list[Item]:
        body = await api.get(resource.collection(None))
        return [as_item(obj, labels=True) for obj in body.get("items") or []]

    async def _setup_plane(self) -> None:
        await asyncio.to_thread(self.plane.up)
        await asyncio.to_thread(_kubectl, self.plane, "apply", "-f", str(CRD_MANIFEST))
        await asyncio.to_thread(
            _kubectl,
            self.plane,
            "wait",
            "--for=condition=established",
            "--timeout=60s",
            "crd/widgets.example.com",
        )

    async def run(self) -> tuple[Report, dict[str, Any]]:
        # SIGTERM (a CI timeout) cancels the run, so everything started is stopped.
        main = asyncio.current_task()
        assert main is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main.cancel)
        self.directory.mkdir(parents=True, exist_ok=True)
        for stale in self.directory.glob("warmwatch.*"):
            stale.unlink()
        for stale in [*self.directory.glob("go-*.log"), *self.directory.glob("toxiproxy.log")]:
            stale.unlink()
        say(f"control plane in {self.plane.directory}")
        await self._setup_plane()
        try:
            return await self._run()
        finally:
            if self.own_plane:
                say("stopping the control plane")
                await asyncio.to_thread(self.plane.down)

    async def _run(self) -> tuple[Report, dict[str, Any]]:
        options = self.options
        rng = self.rng
        plane = self.plane
        started = time.monotonic()
        async with (
            kubeapi.RawClient(
                base_url=plane.server,
                ssl_context=kubeapi.client_ssl(plane.pki, identity="admin"),
                concurrency=Traffic.CONCURRENCY + 8,
            ) as api,
            aiohttp.ClientSession() as etcd,
        ):
            for namespace in options.namespace_names:
                await kubeapi.ensure_namespace(api, namespace)
            deadline = time.monotonic() + 60
            while True:  # the CRD is served (a configured shape whose list fails is not kept)
                try:
                    await api.get(WIDGETS.collection(None))
                    break
                except kubeapi.ApiError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.5)

            # -- the reference, before any traffic
            histories = {
                r.name: EtcdHistory(endpoint=plane.etcd_endpoint, prefix=r.prefix)
                for r in RESOURCES
            }
            recording = asyncio.Event()
            recorders = []
            for history in histories.values():
                await history.snapshot(etcd)
                recorders.append(asyncio.create_task(history.record(etcd, stop=recording)))

            # -- toxiproxy between warmwatch and the apiserver
            link_server = await asyncio.to_thread(
                toxiproxy.Toxiproxy.start, log=self.directory / "toxiproxy.log"
            )
            try:
                link = await asyncio.to_thread(
                    link_server.create_proxy,
                    "apiserver",
                    upstream=f"127.0.0.1:{plane.state().apiserver_port}",
                )
                upstream = await asyncio.to_thread(
                    toxiproxy.kubeconfig_through,
                    link,
                    pki=plane.pki,
                    identity="admin",
                    path=self.directory / "upstream.kubeconfig",
                )
                say(f"warmwatch's upstream through toxiproxy 127.0.0.1:{link.port}")

                # -- warmwatch
                db = self.directory / "warmwatch.db"
                shapes = [r.flag for r in RESOURCES] + [f"{CONFIGMAPS.flag};protobuf"]
                sidecar = await asyncio.to_thread(
                    Sidecar.start,
                    upstream_kubeconfig=upstream,
                    db=db,
                    resources=shapes,
                    extra=[
                        f"--retention-events={options.retention_events}",
                        "--bookmark-interval=2",
                        f"--watch-write-timeout={WRITE_TIMEOUT:g}",
                        f"--upstream-idle-timeout={options.idle_timeout:g}",
                    ],
                )
            except BaseException:
                await asyncio.to_thread(link_server.stop)
                raise
            cache = CacheLog(db)
            tasks: list[asyncio.Task[Any]] = [asyncio.create_task(cache.follow())]
            go: list[GoInformer] = []
            clients: list[WatchClient] = []
            traffic_stop = asyncio.Event()
            try:
                # -- clients
                clients = [
                    WatchClient(spec=spec, base_url=sidecar.url, rng=random.Random(rng.random()))
                    for spec in client_specs(options.namespace_names)
                ]
                client_tasks = [asyncio.create_task(client.run()) for client in clients]
                tasks += client_tasks
                if options.go_clients:
                    binary = await asyncio.to_thread(goclient.build)
                    for resource in RESOURCES:
                        encodings = (False, True) if resource is CONFIGMAPS else (False,)
                        for protobuf, watch_list in itertools.product(encodings, (False, True)):
                            informer = GoInformer(
                                binary=binary,
                                kubeconfig=sidecar.kubeconfig,
                                resource=resource,
                                watch_list=watch_list,
                                protobuf=protobuf,
                                log=self.directory
                                / f"go-{resource.name}-{protobuf}-{watch_list}.log",
                            )
                            informer.start()
                            go.append(informer)
                async with asyncio.timeout(120):
                    await asyncio.gather(*(client.synced.wait() for client in clients))
                    while not all(informer.synced() for informer in go):  # noqa: ASYNC110
                        await asyncio.sleep(0.2)
                say(f"{len(clients)} raw clients and {len(go)} Go informers synced")

                # -- traffic and faults
                traffic = Traffic(api=api, options=options, rng=random.Random(rng.random()))
                await traffic.seed()
                traffic_task = asyncio.create_task(traffic.run(traffic_stop))
                tasks.append(traffic_task)
                injector = Injector(
                    options=options,
                    plane=plane,
                    sidecar=sidecar,
                    histories=list(histories.values()),
                    cache=cache,
                    clients=clients,
                    rng=random.Random(rng.random()),
                    link=link,
                    shapes=shapes,
                )
                watchdog = asyncio.create_task(self._watchdog(injector, recorders))
                tasks.append(watchdog)
                say(f"traffic at {options.rate:g}/s and faults for {options.minutes:g} min")
                fault_run = asyncio.create_task(injector.run(options.minutes * 60))
                await asyncio.wait({fault_run, watchdog}, return_when=asyncio.FIRST_COMPLETED)
                if watchdog.done():
                    fault_run.cancel()
                    await asyncio.gather(fault_run, return_exceptions=True)
                    watchdog.result()
                await fault_run
                traffic_stop.set()
                await traffic_task
                say(f"traffic stopped: {dict(traffic.ops)}; faults {dict(injector.counts)}")

                # -- quiet: wait for every client to equal the apiserver
                for client in clients:
                    client.final_phase = True
                    client.come_back()
                finals, go_finals = await self._settle(api, histories, clients, go)
                watchdog.cancel()
                for task in client_tasks:
                    task.cancel()
                await asyncio.gather(*client_tasks, return_exceptions=True)
            finally:
                traffic_stop.set()
                for informer in go:
                    await asyncio.to_thread(informer.stop)
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await asyncio.to_thread(sidecar.stop)
                await asyncio.to_thread(link_server.stop)
                recording.set()
                await asyncio.gather(*recorders, return_exceptions=True)
            for recorder in recorders:
                recorder.result()  # a gap in the reference fails the run
            await asyncio.to_thread(cache.poll)

        # -- check
        runs: dict[str, Run] = {}
        faults = sum(injector.counts.values())
        for resource in RESOURCES:
            logs = [client.log() for client in clients if client.spec.resource is resource]
            for informer in go:
                if informer.resource is resource:
                    logs.append(
                        ClientLog(
                            name=informer.name,
                            observations=[],
                            shape=informer.shape,
                            final=go_finals[informer.name],
                        )
                    )
            runs[resource.name] = Run(
                reference=histories[resource.name].reference(),
                clients=logs,
                relists=[
                    *cache.relists_of(resource.flag),
                    *(
                        cache.relists_of(f"{resource.flag};protobuf")
                        if resource is CONFIGMAPS
                        else []
                    ),
                ],
                apiserver_final=finals[resource.name],
                faults=faults,
            )
        for name, run in runs.items():
            path = self.directory / f"run-{name}.jsonl"
            with path.open("w") as out:
                for line in format_run(run):
                    out.write(line + "\n")
        say(f"checking ({', '.join(str(self.directory / f'run-{n}.jsonl') for n in runs)})")
        reports = [await asyncio.to_thread(check_run, run) for run in runs.values()]
        go_violations: list[Violation] = []
        go_events = 0
        go_relists: dict[str, int] = {}
        for informer in go:
            relist_rvs = frozenset(r.rv for r in cache.relists_of(informer.shape))
            found, events, relists = informer.check(relist_rvs)
            go_violations += found
            go_events += events
            go_relists[informer.name] = relists
        report = combine(reports, go_violations, go_events, faults)
        summary = {
            "faults": dict(injector.counts),
            "fault_total": faults,
            "events": report.counts.events,
            "go_events": go_events,
            "violations": len(report.violations),
            "by_rule": {str(rule): n for rule, n in report.by_rule().items()},
            "reference_changes": report.counts.reference_changes,
            "relists": {name: len(run.relists) for name, run in runs.items()},
            "client_expired": {client.name: client.expired for client in clients},
            "client_lists": {client.name: client.lists for client in clients},
            "client_errors": {client.name: dict(client.errors) for client in clients},
            "slow_stalls": sum(client.stalls for client in clients),
            "slow_cutoffs": sum(client.cutoffs for client in clients),
            "go_relists": go_relists,
            "traffic": dict(traffic.ops),
            "notes": injector.notes,
            "fault_failures": injector.failures,
            "blackholes": injector.blackholes,
            "seconds": round(time.monotonic() - started, 1),
        }
        return report, summary

    async def _watchdog(self, injector: Injector, recorders: Sequence[asyncio.Task[None]]) -> None:
        """Fail the run when warmwatch exits on its own or the reference breaks."""
        while True:
            await asyncio.sleep(0.5)
            code = injector.sidecar_died()
            if code is not None:
                raise RunFailed(
                    f"warmwatch exited by itself with code {code}; see {injector.sidecar.log}"
                )
            for recorder in recorders:
                if recorder.done():
                    recorder.result()
                    raise RunFailed("a reference recorder stopped")

    async def _settle(
        self,
        api: kubeapi.RawClient,
        histories: Mapping[str, EtcdHistory],
        clients: Sequence[WatchClient],
        go: Sequence[GoInformer],
    ) -> tuple[dict[str, list[Item]], dict[str, list[Item]]]:
        """The apiserver's final state and the Go informers' stores, once the reference and
        every client reached it (or the bounded wait ran out: the checker then reports who did
        not converge)."""
        deadline = time.monotonic() + self.options.settle
        started = time.monotonic()
        digests: dict[str, list[Item]] = {}
        while True:
            finals = {r.name: await self._apiserver_state(api, r) for r in RESOURCES}
            behind = [
                f"(reference {name})"
                for name, history in histories.items()
                if _replay(history) != {item.key: item.rv for item in finals[name]}
            ]
            behind += [
                client.name
                for client in clients
                if not client.converged(finals[client.spec.resource.name])
            ]
            for informer in go:
                digest = await asyncio.to_thread(informer.digest)
                if digest is not None:  # None: no answer (yet); the last one stands
                    digests[informer.name] = digest
                want = {item.key: item.rv for item in finals[informer.resource.name]}
                if digest is None or {item.key: item.rv for item in digest} != want:
                    behind.append(informer.name)
            if not behind:
                say(f"every client converged after {time.monotonic() - started:.1f}s")
                return finals, digests
            if time.monotonic() > deadline:
                say(f"not converged after {self.options.settle:g}s: {', '.join(behind)}")
                return finals, {informer.name: digests.get(informer.name, []) for informer in go}
            await asyncio.sleep(1.0)
