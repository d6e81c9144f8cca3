"""Client kinds on fast and slow links (``--clients``)::

    python -m loadtest.bench --clients --dir /tmp/warmwatch-bench-clients \\
        [--sizes 10000,100000] [--kb 2] [--runs 1] [--out FILE] \\
        [--link-latency-ms 25] [--link-jitter-ms 0] [--link-kb 5000] \\
        [--warmwatch-only-from N] [--link-copy-from N] \\
        [--kinds dynamic,typed-json,typed-protobuf,metadata,controller-manager]

Time-to-synced of four client-go clients (tests/goclient), one informer each on ConfigMaps of
~KB KiB of incompressible data (base64 of random bytes, which gzip shrinks only to ~75%: the
apiserver gzips large LISTs and watch streams for client-go, which accepts gzip, so repetitive
data would hide the link) in one namespace, N objects for each N in --sizes
(cumulative). The kinds: dynamic informer, JSON (``--mode informer``); typed informer, JSON
(``--mode typed --json``: client-go 1.37's typed clients default to protobuf); typed informer,
protobuf (``--mode typed --protobuf``, kube-controller-manager's content types); metadata
informer, protobuf (``--mode metadata --protobuf``); and kube-controller-manager's informer set
(kube-controller-manager v1.37.2 itself with loadtest.controllers.TEST_CONTROLLERS: about 60
collections in protobuf, the N ConfigMaps among them, in full for its root-CA publisher and as
metadata for its garbage collector; synced = every informer and monitor synced, from its log).
Each under four conditions, side by side in one run, in this order for each kind (every other
run in reverse, with 2 s of quiet before each measurement, so that no condition always
follows the same one):

- (a) directly against the local apiserver, idle (the control plane's own
  kube-controller-manager is paused);
- (b) through a warm warmwatch: started with the collection configured in JSON and in
  protobuf (``--resource ...;protobuf``) and filled before any client; each kind runs once
  through it unmeasured, so the measured run is the client's restart (the warm-restart case);
- (c) directly against the apiserver through toxiproxy (loadtest/toxiproxy.py): a link of
  2 x --link-latency-ms RTT (a latency toxic of --link-latency-ms +/- --link-jitter-ms in each
  direction) and --link-kb KB/s (1 KB = 1000 bytes; 5000 KB/s = 40 Mbit/s; a bandwidth toxic
  in each direction; toxiproxy limits each TCP connection separately);
- (d) through a warm warmwatch whose upstream kubeconfig points through that same link
  (filled through it beforehand, primed like (b)).

``--kinds`` picks some of the kinds (their keys above, in this order). With
``--link-copy-from N``, at sizes of N and more the link warmwatch starts on a copy of the
local one's database, taken after every kind's first start through the local one (filling a
million objects over the link would take most of an hour); it resumes its watches from the
copy's resourceVersions over the link, like any warm restart. Each first start is repeated
until the client syncs (kube-controller-manager's garbage collector gives up after 30 s) and
the attempts are noted. ``--warmwatch-only-from N`` does the same and also measures (b) and
(d) only.

"Time-to-synced" is seconds from starting the program until its informer reports synced
(discovery, LIST or WatchList, decoding: everything a restarted controller waits for);
the median of --runs. The client prints no line per object (``--no-events``): writing and
parsing them cost more than the sync itself at 300,000 objects.

Around each measurement through warmwatch its metrics are read: more passed-through requests
than the client's one discovery request (kube-controller-manager writes and is not checked)
mean its LIST or WATCH went to the apiserver instead of the cache (initial events of a
WatchList are not counted in ``warmwatch_events_out_total``, so passthrough is the signal);
upstream relists and failed passthroughs are noted too. Before the runs each warmwatch is
asked a one-object LIST and WatchList with each kind's Accept header to see which encoding it
answers. Around each measured cell the CPU time of the client, warmwatch, the apiserver and
toxiproxy is read from /proc, and the client's peak RSS (VmHWM) before it stops: a second
table gives their medians and µs per object, to show where the time goes.

After the runs of each size, each informer kind's WatchList is also read in (a) and (b) by a
reader that decodes nothing (``drain_watch_list``: the same Accept header and gzip as
client-go, the stream searched for the initial-events-end bookmark in C, no object decoded):
how long the server alone takes to send the initial state, and its CPU per object. When the
client's sync takes much longer than that, what the restart waits for is the client.

Prints markdown tables (with their conditions, and notes on anything odd) to stdout, and to
--out FILE; progress goes to stderr. Warmwatch logs sit next to their databases in DIR
(``ww-*.log``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import http.client
import math
import os
import shutil
import statistics
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from loadtest import charting, controllers, exposition, goclient, kubeapi, processes, toxiproxy
from loadtest.bench import million, say, scan_log
from loadtest.cluster import ControlPlane
from loadtest.sidecar import Sidecar

CLIENTS_NAMESPACE = "bench-clients"


CLIENTS_PATH = f"/api/v1/namespaces/{CLIENTS_NAMESPACE}/configmaps"


CLIENTS_RESOURCE = f"v1/configmaps@{CLIENTS_NAMESPACE}"


CLIENTS_SHAPES = (CLIENTS_RESOURCE, f"{CLIENTS_RESOURCE};protobuf")
"""What each warmwatch caches from the start: the collection for JSON and for protobuf
clients."""


SYNC_TIMEOUT = 1800.0


FIRST_START_ATTEMPTS = 10


PROTOBUF = "application/vnd.kubernetes.protobuf"


_METADATA_ACCEPT = (
    f"{PROTOBUF};as={{kind}};g=meta.k8s.io;v=v1,"
    "application/json;as={kind};g=meta.k8s.io;v=v1,application/json"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class ClientKind:
    key: str
    """Its name in ``--kinds``."""
    label: str
    mode: str
    protobuf: bool
    """``--protobuf`` (GoClient.start's ``protobuf``): it prefers protobuf, and warmwatch
    should answer it in protobuf."""
    list_accept: str
    watch_accept: str
    """The Accept headers client-go sends for it (tests/goclient/typed_test.go)."""
    extra: tuple[str, ...] = ()
    """More goclient flags."""

    @property
    def is_controller_manager(self) -> bool:
        return self.mode == CONTROLLER_MANAGER


CONTROLLER_MANAGER = "controller-manager"
"""Not the goclient: kube-controller-manager v1.37.2 itself with the test controller set
(loadtest.controllers.TEST_CONTROLLERS: about 60 collections in protobuf, its garbage
collector's metadata informers included, which list the N ConfigMaps), time from process
start until every informer and monitor is synced."""


CLIENT_KINDS = (
    ClientKind(
        key="dynamic",
        label="dynamic informer, JSON",
        mode="informer",
        protobuf=False,
        list_accept="application/json",
        watch_accept="application/json",
    ),
    ClientKind(
        key="typed-json",
        label="typed informer, JSON",
        mode="typed",
        protobuf=False,
        extra=("--json",),
        list_accept="application/json, */*",
        watch_accept="application/json, */*",
    ),
    ClientKind(
        key="typed-protobuf",
        label="typed informer, protobuf",
        mode="typed",
        protobuf=True,
        list_accept=f"{PROTOBUF},application/json",
        watch_accept=f"{PROTOBUF},application/json",
    ),
    ClientKind(
        key="metadata",
        label="metadata informer, protobuf",
        mode="metadata",
        protobuf=True,
        list_accept=_METADATA_ACCEPT.format(kind="PartialObjectMetadataList"),
        watch_accept=_METADATA_ACCEPT.format(kind="PartialObjectMetadata"),
    ),
    ClientKind(
        key="controller-manager",
        label="kube-controller-manager's informer set",
        mode=CONTROLLER_MANAGER,
        protobuf=True,
        list_accept="",
        watch_accept="",
    ),
)


SETTLE = 2.0
"""Seconds of quiet before each measured sync (``ClientsBench.run_size``)."""


CONDITIONS = {
    "a": "apiserver",
    "b": "warm warmwatch",
    "c": "apiserver over the link",
    "d": "warm warmwatch over the link",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Costs:
    """What one measurement cost each process: CPU seconds from the client's start until it
    was stopped after syncing, and the client's peak memory (VmHWM)."""

    client_cpu: float
    client_peak: int
    warmwatch_cpu: float
    apiserver_cpu: float
    toxiproxy_cpu: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Synced:
    seconds: float
    """From starting the client until synced; NaN when it failed."""
    cpu: float
    peak: int


def _finish(pid: int, seconds: float) -> Synced:
    """The client's figures once synced, read before it is stopped."""
    return Synced(
        seconds=seconds, cpu=processes.cpu_seconds(pid), peak=processes.rss_bytes(pid, "VmHWM")
    )


FAILED = Synced(seconds=float("nan"), cpu=float("nan"), peak=0)


def random_configmap(name: str, *, kb: int) -> dict[str, Any]:
    """A ConfigMap of ``kb`` KiB of base64 of random bytes (gzip saves only its 25%)."""
    body = kubeapi.configmap(name=name, namespace=CLIENTS_NAMESPACE)
    body["data"] = {"payload": base64.b64encode(os.urandom(kb * 1024 * 3 // 4)).decode()}
    return body


async def _count(api: kubeapi.RawClient) -> int:
    page = await api.get(CLIENTS_PATH, limit="1")
    return len(page["items"]) + int(page["metadata"].get("remainingItemCount") or 0)


async def grow_random(plane: ControlPlane, *, to: int, kb: int) -> None:
    """Create ConfigMaps cm-NNNNNNN of random data until the namespace holds ``to``, with
    GROW_WRITERS concurrent POSTs: the local apiserver's pace on two cores (~1,200-1,800/s
    at 1 KiB), so a million take 10-15 minutes."""
    async with kubeapi.RawClient(
        base_url=plane.server,
        concurrency=GROW_WRITERS,
        ssl_context=kubeapi.client_ssl(plane.pki, identity="admin"),
    ) as api:
        await kubeapi.ensure_namespace(api, CLIENTS_NAMESPACE)
        have = await _count(api)
        if have >= to:
            return
        pool = await million.run_pool(
            "create",
            to - have,
            lambda i: api.ensure(CLIENTS_PATH, random_configmap(f"cm-{have + i:07d}", kb=kb)),
            api=api,
        )
        say(f"  {to:,} ConfigMaps: {pool.done:,} created in {pool.seconds:.0f} s")


GROW_WRITERS = 256
"""Concurrent creates while growing: enough to keep the apiserver's two cores busy."""


DISCOVERY_REQUESTS = 1
"""Requests a goclient start passes through warmwatch besides its list and watch (its
discovery check). More during a run mean its LIST or WATCH went to the apiserver instead of
the cache, or retries. (Initial events of a WatchList are not counted in
warmwatch_events_out_total, so passthrough is the signal.)"""


@dataclass(frozen=True, kw_only=True, slots=True)
class Served:
    """A warmwatch's counters: what it served from its cache, what it passed through."""

    events_out: float
    list_bytes: float
    passthrough: dict[str, float]
    """By ``verb code``."""
    relists: float

    @classmethod
    def read(cls, sidecar: Sidecar) -> Served:
        text = sidecar.metrics()
        passthrough: dict[str, float] = {}
        for labels, value in exposition.samples(text, "warmwatch_passthrough_requests_total"):
            key = f"{labels.get('verb')} {labels.get('code')}"
            passthrough[key] = passthrough.get(key, 0.0) + value
        return cls(
            events_out=exposition.total(text, "warmwatch_events_out_total"),
            list_bytes=exposition.total(text, "warmwatch_list_bytes_total", {"source": "cache"}),
            passthrough=passthrough,
            relists=exposition.total(text, "warmwatch_upstream_relists_total"),
        )

    def since(self, before: Served) -> Served:
        return Served(
            events_out=self.events_out - before.events_out,
            list_bytes=self.list_bytes - before.list_bytes,
            passthrough={
                k: v - before.passthrough.get(k, 0.0)
                for k, v in self.passthrough.items()
                if v - before.passthrough.get(k, 0.0)
            },
            relists=self.relists - before.relists,
        )

    def describe(self) -> str:
        passed = ", ".join(f"{k}: {v:.0f}" for k, v in sorted(self.passthrough.items()))
        parts = [f"passed through: {passed or 'nothing'}"]
        if self.events_out:
            parts.append(f"watch events out {self.events_out:.0f}")
        if self.list_bytes:
            parts.append(f"LIST bytes from the cache {self.list_bytes:.0f}")
        if self.relists:
            parts.append(f"upstream relists {self.relists:.0f}")
        return ", ".join(parts)


def probe_encoding(sidecar: Sidecar, *, accept: str, watch: bool) -> tuple[int, str]:
    """Status and Content-Type of a one-object LIST (or WatchList, 1 s) asked of ``sidecar``
    with ``accept``; the body is read to its end."""
    query = {"fieldSelector": "metadata.name=cm-0000000"}
    if watch:
        query |= {
            "watch": "true",
            "sendInitialEvents": "true",
            "resourceVersionMatch": "NotOlderThan",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": "1",
        }
    connection = http.client.HTTPConnection("127.0.0.1", sidecar.port, timeout=30)
    try:
        connection.request(
            "GET", f"{CLIENTS_PATH}?{urllib.parse.urlencode(query)}", headers={"Accept": accept}
        )
        answer = connection.getresponse()
        answer.read()
        return answer.status, answer.getheader("Content-Type") or ""
    finally:
        connection.close()


INITIAL_EVENTS_END = b"k8s.io/initial-events-end"


@dataclass(frozen=True, kw_only=True, slots=True)
class Drained:
    """A WatchList's initial state read without decoding (``drain_watch_list``)."""

    seconds: float
    """From sending the request until the initial-events-end bookmark arrived."""
    received: int
    """Bytes received, after gzip."""
    server_cpu: float
    """CPU seconds the answering process spent meanwhile."""


async def drain_watch_list(
    *, base_url: str, ssl_context: Any, accept: str, server_pid: int, path: str = CLIENTS_PATH
) -> Drained:
    """Ask for the collection's WatchList as client-go does (``accept``, ``Accept-Encoding:
    gzip``) and read it until its initial-events-end bookmark without decoding anything: the
    stream is inflated (zlib, in C) and searched for the bookmark's annotation, which no
    object of the benchmark holds."""
    query = {
        "watch": "true",
        "sendInitialEvents": "true",
        "resourceVersionMatch": "NotOlderThan",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "1800",
    }
    cpu_before = processes.cpu_seconds(server_pid)
    started = time.monotonic()
    received = 0
    async with (
        aiohttp.ClientSession(
            base_url=base_url,
            connector=aiohttp.TCPConnector(ssl=ssl_context or False),
            timeout=aiohttp.ClientTimeout(total=SYNC_TIMEOUT),
        ) as session,
        session.get(
            path, params=query, headers={"Accept": accept, "Accept-Encoding": "gzip"}
        ) as response,
    ):
        response.raise_for_status()
        tail = b""
        async for chunk in response.content.iter_chunked(1 << 20):
            received += len(chunk)
            if INITIAL_EVENTS_END in tail + chunk[: len(INITIAL_EVENTS_END)] or (
                INITIAL_EVENTS_END in chunk
            ):
                break
            tail = chunk[-len(INITIAL_EVENTS_END) :]
        else:
            raise RuntimeError("the WatchList ended before its initial-events-end bookmark")
        seconds = time.monotonic() - started
    return Drained(
        seconds=seconds,
        received=received,
        server_cpu=processes.cpu_seconds(server_pid) - cpu_before,
    )


@dataclass
class ClientsBench:
    plane: ControlPlane
    directory: Path
    binary: Path
    link: toxiproxy.Link
    samples: dict[tuple[str, int, str], list[float]] = field(default_factory=dict)
    costs: dict[tuple[str, int, str], list[Costs]] = field(default_factory=dict)
    drained: dict[tuple[str, int, str], list[Drained]] = field(default_factory=dict)
    """``drain``: (kind, N, condition) -> the WatchList read without decoding."""
    kinds: tuple[ClientKind, ...] = CLIENT_KINDS
    """``--kinds``."""
    toxiproxy_pid: int = 0
    fills: dict[tuple[int, str], float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    watch_list: set[str] = field(default_factory=set)
    started_managers: int = 0
    warmwatch_only_from: float = math.inf
    """Sizes from this on measure (b) and (d) only (``--warmwatch-only-from``)."""
    link_copy_from: float = math.inf
    """Sizes from this on start (d)'s warmwatch on a copy of (b)'s (``--link-copy-from``;
    implied by ``warmwatch_only_from``)."""

    def note(self, message: str) -> None:
        if message not in self.notes:
            self.notes.append(message)
        say(f"NOTE: {message}")

    def sync(self, kind: ClientKind, kubeconfig: Path, *, expect: int, what: str) -> Synced:
        """The client started, waited for until its informer synced, and stopped."""
        if kind.is_controller_manager:
            return self.sync_controller_manager(kubeconfig, what=f"{what}, N={expect}")
        started = time.monotonic()
        client = goclient.GoClient.start(
            self.binary,
            kubeconfig=kubeconfig,
            resources=[CLIENTS_RESOURCE],
            mode=kind.mode,
            protobuf=kind.protobuf,
            extra=[*kind.extra, "--no-items", "--no-events"],
        )
        try:
            synced = client.wait_synced(timeout=SYNC_TIMEOUT)[0]
            figures = _finish(client.process.pid, time.monotonic() - started)
            start = client.start_line()
        except (RuntimeError, TimeoutError) as error:
            self.note(f"{kind.label}, {what}, N={expect}: failed: {error}")
            return FAILED
        finally:
            client.stop()
        self.watch_list.add(str(start.get("watchList")).lower())
        if bool(start.get("protobuf")) != kind.protobuf or bool(start.get("json")) != (
            "--json" in kind.extra
        ):
            self.note(f"{kind.label}: the client's start line does not show its flags: {start}")
        if synced["count"] != expect:
            self.note(f"{kind.label}, {what}: synced {synced['count']} objects, expected {expect}")
        return figures

    def sync_controller_manager(self, kubeconfig: Path, *, what: str) -> Synced:
        self.started_managers += 1
        label = what.split(")")[0].strip("(")
        manager = controllers.ControllerManager.start(
            binaries=Path(self.plane.state().binaries),
            kubeconfig=kubeconfig,
            service_account_key=self.plane.pki.service_account_key,
            root_ca=self.plane.pki.ca_cert,
            log=self.directory / "logs" / f"kcm-{self.started_managers:03d}-{label}.log",
        )
        try:
            return _finish(manager.process.pid, manager.wait_synced(SYNC_TIMEOUT))
        except (RuntimeError, TimeoutError, controllers.NotSynced) as error:
            # Its garbage collector gives up after 30 s, e.g. on its first start through a
            # warmwatch that fills every collection it asks for (not a measured run).
            self.note(f"kube-controller-manager, {what}: failed: {str(error)[:300]}")
            return FAILED
        finally:
            manager.stop()

    def measure(
        self,
        kind: ClientKind,
        condition: str,
        kubeconfig: Path,
        *,
        size: int,
        sidecar: Sidecar | None = None,
        record: bool = True,
    ) -> float:
        """Seconds to synced (NaN: it failed), recorded as a sample unless ``record`` is
        False."""
        what = f"({condition}) {CONDITIONS[condition]}" + ("" if record else ", first start")
        before = Served.read(sidecar) if sidecar else None
        apiserver = self.plane.state().pids.get("kube-apiserver", 0)
        cpu_before = [
            processes.cpu_seconds(pid)
            for pid in (sidecar.process.pid if sidecar else 0, apiserver, self.toxiproxy_pid)
        ]
        synced = self.sync(kind, kubeconfig, expect=size, what=what)
        seconds = synced.seconds
        warmwatch_cpu, apiserver_cpu, toxiproxy_cpu = (
            processes.cpu_seconds(pid) - before_cpu
            for pid, before_cpu in zip(
                (sidecar.process.pid if sidecar else 0, apiserver, self.toxiproxy_pid),
                cpu_before,
                strict=True,
            )
        )
        detail = ""
        if sidecar is not None and before is not None:
            served = Served.read(sidecar).since(before)
            detail = f"; {served.describe()}"
            too_many = sum(served.passthrough.values()) > DISCOVERY_REQUESTS
            if too_many and not kind.is_controller_manager:  # it writes and discovers a lot
                self.note(
                    f"{kind.label}, {what}, N={size}: more requests passed through than "
                    f"discovery ({served.describe()})"
                )
            failed = {k: v for k, v in served.passthrough.items() if k.split()[-1][0] in "5e"}
            if failed:
                self.note(f"{kind.label}, {what}, N={size}: passthrough failures {failed}")
            if served.relists:
                self.note(f"{kind.label}, {what}, N={size}: warmwatch relisted upstream")
        say(
            f"{kind.label}, {what}, N={size}: synced in {seconds:.2f} s{detail}; CPU s: client "
            f"{synced.cpu:.1f} (peak {synced.peak / 1e6:.0f} MB), warmwatch {warmwatch_cpu:.1f}, "
            f"apiserver {apiserver_cpu:.1f}, toxiproxy {toxiproxy_cpu:.1f}"
        )
        if record:
            self.samples.setdefault((kind.label, size, condition), []).append(seconds)
            self.costs.setdefault((kind.label, size, condition), []).append(
                Costs(
                    client_cpu=synced.cpu,
                    client_peak=synced.peak,
                    warmwatch_cpu=warmwatch_cpu,
                    apiserver_cpu=apiserver_cpu,
                    toxiproxy_cpu=toxiproxy_cpu,
                )
            )
        return seconds

    def probe(self, sidecar: Sidecar, condition: str) -> None:
        before = Served.read(sidecar)
        for kind in self.kinds:
            if kind.is_controller_manager:
                continue
            for watch in (False, True):
                verb = "WatchList" if watch else "LIST"
                accept = kind.watch_accept if watch else kind.list_accept
                try:
                    status, content_type = probe_encoding(sidecar, accept=accept, watch=watch)
                except OSError as error:
                    self.note(f"probe ({condition}) {kind.label} {verb}: {error}")
                    continue
                wanted = PROTOBUF if kind.protobuf else "application/json"
                say(f"probe ({condition}) {kind.label} {verb}: {status} {content_type}")
                if status != 200 or not content_type.startswith(wanted):
                    self.note(
                        f"({condition}) {kind.label}: a one-object {verb} with its Accept "
                        f"header was answered {status} {content_type!r}, expected {wanted}"
                    )
        served = Served.read(sidecar).since(before)
        if served.passthrough:
            self.note(f"({condition}) probes passed through: {served.describe()}")

    def start_sidecar(
        self, name: str, *, upstream: Path, size: int, copy_of: Sidecar | None = None
    ) -> Sidecar:
        """A warmwatch filled before any client: from scratch, or (``copy_of``, stopped)
        started on a copy of that one's database."""
        db = self.directory / f"ww-{name}-{size}.db"
        for stale in self.directory.glob(f"ww-{name}-{size}.*"):
            stale.unlink()
        started = time.monotonic()
        if copy_of is not None:
            for part in self.directory.glob(f"{copy_of.db.name}*"):  # the file, its WAL
                shutil.copyfile(part, db.with_name(db.name + part.name[len(copy_of.db.name) :]))
        sidecar = Sidecar.start(upstream_kubeconfig=upstream, db=db, resources=CLIENTS_SHAPES)
        self.fills[(size, name)] = time.monotonic() - started
        how = f"started on a copy of {copy_of.db.name} in" if copy_of else "filled"
        say(
            f"warmwatch {name}: {how} {size} objects twice (JSON, protobuf) in "
            f"{self.fills[(size, name)]:.1f} s; log {sidecar.log}"
        )
        return sidecar

    def run_size(self, size: int, *, runs: int, link_kubeconfig: Path) -> None:
        direct = self.plane.admin_kubeconfig
        only_warmwatch = size >= self.warmwatch_only_from
        copy = only_warmwatch or size >= self.link_copy_from
        conditions = "bd" if only_warmwatch else "abcd"
        local = self.start_sidecar("local", upstream=direct, size=size)
        if copy:
            try:  # the clients' first start, before the copy: it holds what they learned
                for kind in self.kinds:
                    self.first_start(kind, local, size=size)
            finally:
                local.stop()
            slow = self.start_sidecar("link", upstream=link_kubeconfig, size=size, copy_of=local)
            local.restart()
        else:
            try:
                slow = self.start_sidecar("link", upstream=link_kubeconfig, size=size)
            except BaseException:
                local.stop()
                raise
        kubeconfigs = {
            "a": direct,
            "b": local.kubeconfig,
            "c": link_kubeconfig,
            "d": slow.kubeconfig,
        }
        sidecars = {"b": local, "d": slow}
        try:
            self.probe(local, "b")
            self.probe(slow, "d")
            if not copy:
                for kind in self.kinds:  # the clients' first start: measured are restarts
                    for condition in "bd":
                        self.measure(
                            kind,
                            condition,
                            kubeconfigs[condition],
                            size=size,
                            sidecar=sidecars[condition],
                            record=False,
                        )
            for run in range(1, runs + 1):
                say(f"N={size}: run {run} of {runs}")
                for kind in self.kinds:
                    # Every other run in reverse, and a pause before each: a condition must
                    # not inherit the previous one's aftermath (the apiserver freeing a
                    # 100,000-object answer it sent over the link, toxiproxy draining).
                    for condition in conditions if run % 2 else conditions[::-1]:
                        time.sleep(SETTLE)
                        self.measure(
                            kind,
                            condition,
                            kubeconfigs[condition],
                            size=size,
                            sidecar=sidecars.get(condition),
                        )
            for _ in range(runs):
                for condition in conditions:
                    if condition in "ab":
                        self.drain(condition, size=size, sidecar=sidecars.get(condition))
        finally:
            local.stop()
            slow.stop()
        for sidecar in (local, slow):
            odd = scan_log(sidecar.log)
            if odd:
                self.note(
                    f"{sidecar.log.name}: {len(odd)} warning/error lines, e.g. "
                    + " | ".join(line[:300] for line in odd[:3])
                )

    def drain(self, condition: str, *, size: int, sidecar: Sidecar | None) -> None:
        """Each informer kind's WatchList read without decoding, in (a) or (b) (``sidecar``),
        after :data:`SETTLE` s of quiet."""
        if sidecar is None:
            base_url, ssl_context = (
                self.plane.server,
                kubeapi.client_ssl(self.plane.pki, identity="admin"),
            )
            pid = self.plane.state().pids.get("kube-apiserver", 0)
        else:
            base_url, ssl_context, pid = (
                f"http://127.0.0.1:{sidecar.port}",
                None,
                sidecar.process.pid,
            )
        for kind in self.kinds:
            if kind.is_controller_manager:
                continue
            time.sleep(SETTLE)
            before = Served.read(sidecar) if sidecar else None
            drained = asyncio.run(
                drain_watch_list(
                    base_url=base_url,
                    ssl_context=ssl_context,
                    accept=kind.watch_accept,
                    server_pid=pid,
                )
            )
            if sidecar is not None and before is not None:
                served = Served.read(sidecar).since(before)
                if served.passthrough or served.relists:
                    self.note(f"{kind.label}, ({condition}) read alone: {served.describe()}")
            say(
                f"{kind.label}, ({condition}) WatchList read without decoding, N={size}: "
                f"{drained.seconds:.2f} s, {drained.received / 1e6:.0f} MB, server CPU "
                f"{drained.server_cpu:.1f} s"
            )
            self.drained.setdefault((kind.label, size, condition), []).append(drained)

    def first_start(self, kind: ClientKind, sidecar: Sidecar, *, size: int) -> None:
        """The client's first start through ``sidecar``, until it syncs: kube-controller-
        manager's garbage collector gives up after 30 s while warmwatch still fills what it
        learned from it. The attempts it took are noted."""
        for attempt in range(1, FIRST_START_ATTEMPTS + 1):
            seconds = self.measure(
                kind, "b", sidecar.kubeconfig, size=size, sidecar=sidecar, record=False
            )
            if seconds == seconds:
                if attempt > 1 or kind.is_controller_manager:
                    self.note(
                        f"{kind.label}, first start through warmwatch, N={size:,}: synced on "
                        f"attempt {attempt} in {seconds:.1f} s"
                    )
                return
        self.note(f"{kind.label}, first start through warmwatch, N={size:,}: never synced")

    def table(self, *, sizes: Sequence[int], runs: int, kb: int) -> list[str]:
        def median(label: str, size: int, condition: str) -> float:
            values = [v for v in self.samples.get((label, size, condition), []) if v == v]
            return statistics.median(values) if values else float("nan")

        def ratio(x: float, y: float) -> str:
            return f"{x / y:.2f}x" if x == x and y == y and y > 0 else "n/a"

        def seconds(value: float) -> str:
            return f"{value:.2f}" if value == value else "—"

        fills = "; ".join(
            f"N={size:,}: {self.fills[(size, 'local')]:.0f} s local, "
            + (
                f"{self.fills[(size, 'link')]:.0f} s on a copy of it"
                if size >= min(self.warmwatch_only_from, self.link_copy_from)
                else f"{self.fills[(size, 'link')]:.0f} s over the link"
            )
            for size in sizes
            if (size, "local") in self.fills and (size, "link") in self.fills
        )
        lines = [
            f"Client-go time-to-synced, seconds (median of {runs}): one informer on N "
            f"ConfigMaps of {kb} KiB of random data in one namespace. (a) the local apiserver; "
            "(b) a warm warmwatch, the client restarted; (c) the apiserver over a link of "
            f"{self.link.describe()} (toxiproxy); (d) a warm warmwatch whose upstream is that "
            f"link. client-go WatchList: {', '.join(sorted(self.watch_list)) or '?'}. "
            f"warmwatch fill (JSON and protobuf shapes, before any client): {fills or 'n/a'}.",
            "",
            "| client | objects | (a) apiserver s | (b) warm warmwatch s | (c) apiserver over "
            "link s | (d) warm warmwatch over link s | b/a | d/b | c/d |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for size in sizes:
            for kind in self.kinds:
                a, b, c, d = (median(kind.label, size, x) for x in CONDITIONS)
                lines.append(
                    f"| {kind.label} | {size:,} | {seconds(a)} | {seconds(b)} | {seconds(c)} | "
                    f"{seconds(d)} | {ratio(b, a)} | {ratio(d, b)} | {ratio(c, d)} |"
                )
        lines += self.costs_table(sizes=sizes)
        lines += self.drained_table(sizes=sizes)
        if self.notes:
            lines += ["", "Notes:", *(f"- {note}" for note in self.notes)]
        return lines

    def costs_table(self, *, sizes: Sequence[int]) -> list[str]:
        """Where the time goes: each process's CPU per measured cell (medians), per object."""

        def median(values: list[float]) -> float:
            values = [v for v in values if v == v]
            return statistics.median(values) if values else float("nan")

        lines = [
            "",
            "CPU seconds each process spent from the client's start until it synced (medians; "
            "µs per object in brackets), and the client's peak RSS:",
            "",
            "| client | objects | cell | synced s | client CPU s | client peak MB | warmwatch "
            "CPU s | apiserver CPU s | toxiproxy CPU s |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for size in sizes:
            for kind in self.kinds:
                for condition in CONDITIONS:
                    costs = self.costs.get((kind.label, size, condition))
                    if not costs:
                        continue
                    synced = median(self.samples[(kind.label, size, condition)])
                    client, warmwatch, apiserver = (
                        median([c.client_cpu for c in costs]),
                        median([c.warmwatch_cpu for c in costs]),
                        median([c.apiserver_cpu for c in costs]),
                    )
                    peak = median([c.client_peak / 1e6 for c in costs])
                    toxiproxy = median([c.toxiproxy_cpu for c in costs])
                    client_s, warmwatch_s, apiserver_s = (
                        f"{v:.1f} ({v / size * 1e6:.1f})" for v in (client, warmwatch, apiserver)
                    )
                    lines.append(
                        f"| {kind.label} | {size:,} | ({condition}) | {synced:.2f} | {client_s} "
                        f"| {peak:.0f} | {warmwatch_s} | {apiserver_s} | {toxiproxy:.1f} |"
                    )
        return lines

    def drained_table(self, *, sizes: Sequence[int]) -> list[str]:
        """The server alone: each informer's WatchList read without decoding, beside the
        client's sync (medians)."""
        if not self.drained:
            return []
        lines = [
            "",
            "The same WatchList read by a reader that decodes nothing (the server alone), "
            "beside the client's sync (medians; server CPU µs per object in brackets):",
            "",
            "| client | objects | cell | read alone s | MB received | server CPU s | "
            "client synced s | synced / read alone |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for size in sizes:
            for kind in self.kinds:
                for condition in "ab":
                    drained = self.drained.get((kind.label, size, condition))
                    if not drained:
                        continue
                    alone = statistics.median(d.seconds for d in drained)
                    received = statistics.median(d.received for d in drained) / 1e6
                    cpu = statistics.median(d.server_cpu for d in drained)
                    synced = [
                        v for v in self.samples.get((kind.label, size, condition), []) if v == v
                    ]
                    synced_s = statistics.median(synced) if synced else float("nan")
                    lines.append(
                        f"| {kind.label} | {size:,} | ({condition}) | {alone:.2f} | "
                        f"{received:.0f} | {cpu:.1f} ({cpu / size * 1e6:.1f}) | {synced_s:.2f} | "
                        f"{synced_s / alone:.1f}x |"
                    )
        return lines


def clients_main(args: argparse.Namespace) -> int:
    sizes = [int(s) for s in (args.sizes or "10000,100000").split(",")]
    args.dir.mkdir(parents=True, exist_ok=True)
    directory = args.dir.resolve()
    plane = ControlPlane(directory / "cp")
    plane.up()
    plane.stop_controller_manager()  # (a) is the idle apiserver
    binary = goclient.build()
    link = toxiproxy.Link(
        latency_ms=args.link_latency_ms, jitter_ms=args.link_jitter_ms, rate_kb=args.link_kb
    )
    kinds = {kind.key: kind for kind in CLIENT_KINDS}
    wanted = (args.kinds or ",".join(kinds)).split(",")
    unknown = [key for key in wanted if key not in kinds]
    if unknown:
        raise SystemExit(f"--kinds: unknown {unknown}; known: {', '.join(kinds)}")
    server = toxiproxy.Toxiproxy.start(log=directory / "toxiproxy.log")
    bench = ClientsBench(
        plane=plane,
        directory=directory,
        binary=binary,
        link=link,
        kinds=tuple(kinds[key] for key in wanted),
        toxiproxy_pid=server.process.pid,
        warmwatch_only_from=args.warmwatch_only_from or math.inf,
        link_copy_from=args.link_copy_from or math.inf,
    )
    try:
        proxy = server.create_proxy(
            "apiserver", upstream=f"127.0.0.1:{plane.state().apiserver_port}"
        )
        link.apply(proxy)
        link_kubeconfig = toxiproxy.kubeconfig_through(
            proxy, pki=plane.pki, identity="admin", path=directory / "link.kubeconfig"
        )
        say(f"link: 127.0.0.1:{proxy.port} -> {proxy.upstream}, {link.describe()}")
        for size in sizes:
            say(f"growing to {size} ConfigMaps of {args.kb} KiB of random data ...")
            asyncio.run(grow_random(plane, to=size, kb=args.kb))
            bench.run_size(size, runs=args.runs, link_kubeconfig=link_kubeconfig)
    finally:
        server.stop()
        if args.keep:
            plane.start_controller_manager()
        else:
            plane.down()
            shutil.rmtree(directory / "cp", ignore_errors=True)
    text = "\n".join(bench.table(sizes=sizes, runs=args.runs, kb=args.kb))
    if args.chart:
        charting.draw(args.chart, synced=bench.samples, title="Time to synced per client kind")
    print(f"\n{text}")
    if args.out:
        args.out.write_text(text + "\n")
    return 0
