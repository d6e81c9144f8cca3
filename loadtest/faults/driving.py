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
from dataclasses import dataclass
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


@dataclass(frozen=True, kw_only=True)
class Ended:
    """What a run left to check: the reference, the clients and their final states, what
    warmwatch's database showed, the faults and the traffic."""

    histories: dict[str, EtcdHistory]
    clients: list[WatchClient]
    go: list[GoInformer]
    finals: dict[str, list[Item]]
    go_finals: dict[str, list[Item]]
    cache: CacheLog
    injector: Injector
    traffic: Traffic

    def run_of(self, resource: Resource, *, faults: int) -> Run:
        """The run of one resource: its reference, every client's log (a Go informer's as
        its final state only) and warmwatch's relists of its shapes."""
        logs = [client.log() for client in self.clients if client.spec.resource is resource]
        for informer in self.go:
            if informer.resource is resource:
                logs.append(
                    ClientLog(
                        name=informer.name,
                        observations=[],
                        shape=informer.shape,
                        final=self.go_finals[informer.name],
                    )
                )
        return Run(
            reference=self.histories[resource.name].reference(),
            clients=logs,
            relists=[
                *self.cache.relists_of(resource.flag),
                *(
                    self.cache.relists_of(f"{resource.flag};protobuf")
                    if resource is CONFIGMAPS
                    else []
                ),
            ],
            apiserver_final=self.finals[resource.name],
            faults=faults,
        )

    def summary(
        self,
        report: Report,
        *,
        runs: Mapping[str, Run],
        go_events: int,
        go_relists: dict[str, int],
    ) -> dict[str, Any]:
        """``summary.json`` (without the run's ``seconds``)."""
        injector, clients = self.injector, self.clients
        return {
            "faults": dict(injector.counts),
            "fault_total": report.faults,
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
            "traffic": dict(self.traffic.ops),
            "notes": injector.notes,
            "fault_failures": injector.failures,
            "blackholes": injector.blackholes,
        }


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
        started = time.monotonic()
        async with (
            kubeapi.RawClient(
                base_url=self.plane.server,
                ssl_context=kubeapi.client_ssl(self.plane.pki, identity="admin"),
                concurrency=Traffic.CONCURRENCY + 8,
            ) as api,
            aiohttp.ClientSession() as etcd,
        ):
            await self._prepare(api)
            histories, recording, recorders = await self._start_reference(etcd)
            link_server = await asyncio.to_thread(
                toxiproxy.Toxiproxy.start, log=self.directory / "toxiproxy.log"
            )
            try:
                link, sidecar, shapes = await self._start_warmwatch(link_server)
            except BaseException:
                await asyncio.to_thread(link_server.stop)
                raise
            cache = CacheLog(self.directory / "warmwatch.db")
            tasks: list[asyncio.Task[Any]] = [asyncio.create_task(cache.follow())]
            go: list[GoInformer] = []
            clients: list[WatchClient] = []
            traffic_stop = asyncio.Event()
            try:
                clients, client_tasks = await self._start_clients(sidecar, tasks=tasks, go=go)
                traffic = Traffic(
                    api=api, options=self.options, rng=random.Random(self.rng.random())
                )
                traffic_task = await self._start_traffic(traffic, stop=traffic_stop)
                tasks.append(traffic_task)
                injector = Injector(
                    options=self.options,
                    plane=self.plane,
                    sidecar=sidecar,
                    histories=list(histories.values()),
                    cache=cache,
                    clients=clients,
                    rng=random.Random(self.rng.random()),
                    link=link,
                    shapes=shapes,
                )
                watchdog = asyncio.create_task(self._watchdog(injector, recorders))
                tasks.append(watchdog)
                await self._faults(injector, watchdog=watchdog)
                traffic_stop.set()
                await traffic_task
                say(f"traffic stopped: {dict(traffic.ops)}; faults {dict(injector.counts)}")
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
        ended = Ended(
            histories=histories,
            clients=clients,
            go=go,
            finals=finals,
            go_finals=go_finals,
            cache=cache,
            injector=injector,
            traffic=traffic,
        )
        return await self._check(ended, started=started)

    async def _prepare(self, api: kubeapi.RawClient) -> None:
        """The namespaces exist and the CRD is served (a configured shape whose list fails is
        not kept)."""
        for namespace in self.options.namespace_names:
            await kubeapi.ensure_namespace(api, namespace)
        deadline = time.monotonic() + 60
        while True:
            try:
                await api.get(WIDGETS.collection(None))
                return
            except kubeapi.ApiError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)

    async def _start_reference(
        self, etcd: aiohttp.ClientSession
    ) -> tuple[dict[str, EtcdHistory], asyncio.Event, list[asyncio.Task[None]]]:
        """The reference, before any traffic: etcd's history of each resource, recorded until
        the returned event is set."""
        histories = {
            r.name: EtcdHistory(endpoint=self.plane.etcd_endpoint, prefix=r.prefix)
            for r in RESOURCES
        }
        recording = asyncio.Event()
        recorders = []
        for history in histories.values():
            await history.snapshot(etcd)
            recorders.append(asyncio.create_task(history.record(etcd, stop=recording)))
        return histories, recording, recorders

    async def _start_warmwatch(
        self, link_server: toxiproxy.Toxiproxy
    ) -> tuple[toxiproxy.Proxy, Sidecar, list[str]]:
        """warmwatch, its upstream through a toxiproxy link to the apiserver: the link, the
        sidecar and the shapes it caches."""
        link = await asyncio.to_thread(
            link_server.create_proxy,
            "apiserver",
            upstream=f"127.0.0.1:{self.plane.state().apiserver_port}",
        )
        upstream = await asyncio.to_thread(
            toxiproxy.kubeconfig_through,
            link,
            pki=self.plane.pki,
            identity="admin",
            path=self.directory / "upstream.kubeconfig",
        )
        say(f"warmwatch's upstream through toxiproxy 127.0.0.1:{link.port}")
        shapes = [r.flag for r in RESOURCES] + [f"{CONFIGMAPS.flag};protobuf"]
        sidecar = await asyncio.to_thread(
            Sidecar.start,
            upstream_kubeconfig=upstream,
            db=self.directory / "warmwatch.db",
            resources=shapes,
            extra=[
                f"--retention-events={self.options.retention_events}",
                "--bookmark-interval=2",
                f"--watch-write-timeout={WRITE_TIMEOUT:g}",
                f"--upstream-idle-timeout={self.options.idle_timeout:g}",
            ],
        )
        return link, sidecar, shapes

    async def _start_clients(
        self, sidecar: Sidecar, *, tasks: list[asyncio.Task[Any]], go: list[GoInformer]
    ) -> tuple[list[WatchClient], list[asyncio.Task[None]]]:
        """The raw clients (their tasks added to ``tasks``) and the Go informers (added to
        ``go`` as each starts), once all of them synced."""
        clients = [
            WatchClient(spec=spec, base_url=sidecar.url, rng=random.Random(self.rng.random()))
            for spec in client_specs(self.options.namespace_names)
        ]
        client_tasks = [asyncio.create_task(client.run()) for client in clients]
        tasks += client_tasks
        if self.options.go_clients:
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
                        log=self.directory / f"go-{resource.name}-{protobuf}-{watch_list}.log",
                    )
                    informer.start()
                    go.append(informer)
        async with asyncio.timeout(120):
            await asyncio.gather(*(client.synced.wait() for client in clients))
            while not all(informer.synced() for informer in go):  # noqa: ASYNC110
                await asyncio.sleep(0.2)
        say(f"{len(clients)} raw clients and {len(go)} Go informers synced")
        return clients, client_tasks

    async def _start_traffic(self, traffic: Traffic, *, stop: asyncio.Event) -> asyncio.Task[None]:
        """The traffic, its objects seeded first; it runs until ``stop`` is set."""
        await traffic.seed()
        return asyncio.create_task(traffic.run(stop))

    async def _faults(self, injector: Injector, *, watchdog: asyncio.Task[None]) -> None:
        """Faults for ``--minutes``, or until the watchdog fails the run."""
        options = self.options
        say(f"traffic at {options.rate:g}/s and faults for {options.minutes:g} min")
        fault_run = asyncio.create_task(injector.run(options.minutes * 60))
        await asyncio.wait({fault_run, watchdog}, return_when=asyncio.FIRST_COMPLETED)
        if watchdog.done():
            fault_run.cancel()
            await asyncio.gather(fault_run, return_exceptions=True)
            watchdog.result()
        await fault_run

    async def _check(self, ended: Ended, *, started: float) -> tuple[Report, dict[str, Any]]:
        """Every run checked (a run per resource, written to ``run-<resource>.jsonl``), and
        the Go informers as far as their output allows; the report and the summary."""
        faults = sum(ended.injector.counts.values())
        runs = {resource.name: ended.run_of(resource, faults=faults) for resource in RESOURCES}
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
        for informer in ended.go:
            relist_rvs = frozenset(r.rv for r in ended.cache.relists_of(informer.shape))
            found, events, relists = informer.check(relist_rvs)
            go_violations += found
            go_events += events
            go_relists[informer.name] = relists
        report = combine(reports, go_violations, go_events, faults)
        summary = ended.summary(report, runs=runs, go_events=go_events, go_relists=go_relists)
        summary["seconds"] = round(time.monotonic() - started, 1)
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
        not converge). Quiet: the clients come back and stop going away first."""
        for client in clients:
            client.final_phase = True
            client.come_back()
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
