"""Memory and LIST throughput of warmwatch, measured side by side with the apiserver.

    python -m loadtest.bench --dir /tmp/warmwatch-bench [--sizes 10000,50000,200000] [--kb 2]

For each size N (cumulative: the collection grows between rows), with ConfigMaps of ~KB KiB:
- warmwatch starts on a fresh database and fills the shape from the apiserver; its RSS is
  read after the fill and again after serving full LISTs (memory must not grow with N);
- a full LIST of the collection is read by one HTTP client, as fast as it can, from warmwatch
  and from the apiserver (RV "0": its watch cache; RV unset: a consistent read from etcd);
  MB/s and the ratio are printed side by side, best of three;
- the client-go informer program syncs through warmwatch and directly; seconds side by side.

Prints one table; nothing is asserted (this is a measurement, not a test).

Client kinds on fast and slow links (``--clients``)::

    python -m loadtest.bench --clients --dir /tmp/warmwatch-bench-clients \\
        [--sizes 10000,100000] [--kb 2] [--runs 1] [--out FILE] \\
        [--link-latency-ms 25] [--link-jitter-ms 0] [--link-kb 5000] \\
        [--warmwatch-only-from N]

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

With ``--warmwatch-only-from N``, sizes of N and more measure (b) and (d) only (the
apiserver's own LIST of a million objects takes minutes, over the link an hour), and the
link warmwatch starts on a copy of the local one's database, taken after every kind's first
start (filling it over the link would take as long); it resumes its watches from the copy's
resourceVersions over the link, like any warm restart.

"Time-to-synced" is seconds from starting the program until its informer reports synced
(discovery, LIST or WatchList, decoding: everything a restarted controller waits for);
the median of --runs. Around each measurement through warmwatch its metrics are read: more
passed-through requests than the client's one discovery request (kube-controller-manager writes
and is not checked) mean its LIST or WATCH went
to the apiserver instead of the cache (initial events of a WatchList are not counted in
``warmwatch_events_out_total``, so passthrough is the signal); upstream relists and failed
passthroughs are noted too. Before the runs each warmwatch is asked a one-object LIST and
WatchList with each kind's Accept header to see which encoding it answers. Anything odd goes to the notes under the table. Prints one
markdown table (with its conditions and notes) to stdout, and to --out FILE; progress goes to
stderr. Warmwatch logs sit next to their databases in DIR (``ww-*.log``).

The million-object bar (``--million``)::

    python -m loadtest.bench --million --dir /tmp/warmwatch-million \\
        [--sizes 1000000] [--concurrency 256] [--create-budget-min 25] \\
        [--restarts 3] [--list-runs 3] [--out FILE]

For each N in --sizes (default 1,000,000; each N in its own namespace ``million-N``, created
from empty, so run ``--sizes 100000`` first to validate), on an idle apiserver (the control
plane's kube-controller-manager is paused: its garbage collector would watch every object):

- create: N ConfigMaps of 1 KiB (base64 of random bytes) by --concurrency concurrent POSTs
  (loadtest/kubeapi.py; the apiserver allows 2000 requests in flight); objects/s. When after
  90 s the rate says N would take longer than --create-budget-min, creating stops at the
  largest multiple of 50,000 that fits, and that N is measured (a note says so);
- cold fill: warmwatch on a fresh database with ``--resource v1/configmaps@million-N``,
  seconds from its start until /readyz on its metrics port answers 200; its VmHWM then;
- RSS once filled;
- warm restarts (--restarts, median): stop warmwatch (SIGTERM), start it on the same
  database; from the spawn: when its API port accepts a connection, when the first body
  byte of a 200 answer to a LIST (resourceVersion=0, JSON; polled every few ms) arrives,
  when /readyz says ready, and a LIST's time to first byte once ready. ``python -m proxy
  --help`` (median of 3) gives the interpreter-and-imports start-up for reference. proxy/
  is compiled to bytecode first, as the image is (``compile_bytecode``);
- full LIST MB/s, best of --list-runs: warmwatch (JSON) and the apiserver
  (``resourceVersion=0``, its watch cache), side by side, one client reading the whole body
  (aiohttp, which accepts gzip like client-go; the encodings answered are stated), and the
  apiserver once more with ``Accept-Encoding: identity`` (no gzip work on its side);
- RSS with 100 idle watchers (watch from the cache's RV, bookmarks on), and its peak
  (VmRSS sampled every 50 ms) while it also serves 4 concurrent full LISTs;
- relist: warmwatch stopped, the even-numbered half of the objects deleted upstream by
  concurrent DELETEs, the apiserver restarted (a new watch cache: warmwatch's resume from
  its old RV gets 410), warmwatch started on its database: seconds from its spawn until its
  log says ``listed at RV ... (K events appended)``, and its peak RSS meanwhile (VmRSS samples
  and VmHWM);
- SQLite file sizes (db + wal) after the fill and after the relist.

Prints ONE markdown table (a column per N) with the wall time of each phase, the relist log
lines and notes (warnings, errors and tracebacks in warmwatch's log ``DIR/ww-million-N.log``,
object counts that do not match); to --out FILE too. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import compileall
import functools
import http.client
import math
import os
import shutil
import sqlite3
import ssl
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from loadtest import charting, controllers, goclient, kubeapi, toxiproxy
from loadtest.cluster import ControlPlane
from loadtest.sidecar import Sidecar

NAMESPACE = "bench"
SHAPE = f"v1/configmaps@{NAMESPACE}"
PATH = f"/api/v1/namespaces/{NAMESPACE}/configmaps"


async def read_list(url: str, *, ssl_context: ssl.SSLContext | None) -> tuple[int, float]:
    """Bytes of one full LIST and the seconds it took, body read and discarded."""
    connector = aiohttp.TCPConnector(ssl=ssl_context or False)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        async with session.get(url, headers={"Accept": "application/json"}) as response:
            assert response.status == 200, await response.text()
            size = 0
            async for chunk in response.content.iter_chunked(1 << 20):
                size += len(chunk)
        return size, time.perf_counter() - started


def best_rate(url: str, *, ssl_context: ssl.SSLContext | None, runs: int = 3) -> float:
    """Best MB/s of ``runs`` full LISTs."""
    rates = []
    for _ in range(runs):
        size, seconds = asyncio.run(read_list(url, ssl_context=ssl_context))
        rates.append(size / seconds / 1e6)
    return max(rates)


def informer_sync(binary: Path, kubeconfig: Path) -> float:
    started = time.monotonic()
    client = goclient.GoClient.start(
        binary, kubeconfig=kubeconfig, resources=[SHAPE], extra=["--no-items"]
    )
    try:
        client.wait_synced(timeout=900)
        return time.monotonic() - started
    finally:
        client.stop()


async def grow(plane: ControlPlane, *, to: int, kb: int) -> None:
    async with kubeapi.RawClient(
        base_url=plane.server,
        concurrency=64,
        ssl_context=kubeapi.client_ssl(plane.pki, identity="admin"),
    ) as api:
        await kubeapi.ensure_namespace(api, NAMESPACE)
        have = len((await api.get(PATH))["items"])
        if have >= to:
            return
        path = PATH
        await api.gather(
            api.create(
                path, kubeapi.configmap(name=f"cm-{i:07d}", namespace=NAMESPACE, size=kb * 1024)
            )
            for i in range(have, to)
        )


# -- client kinds on fast and slow links (--clients) -------------------------------------------

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
        label="dynamic informer, JSON",
        mode="informer",
        protobuf=False,
        list_accept="application/json",
        watch_accept="application/json",
    ),
    ClientKind(
        label="typed informer, JSON",
        mode="typed",
        protobuf=False,
        extra=("--json",),
        list_accept="application/json, */*",
        watch_accept="application/json, */*",
    ),
    ClientKind(
        label="typed informer, protobuf",
        mode="typed",
        protobuf=True,
        list_accept=f"{PROTOBUF},application/json",
        watch_accept=f"{PROTOBUF},application/json",
    ),
    ClientKind(
        label="metadata informer, protobuf",
        mode="metadata",
        protobuf=True,
        list_accept=_METADATA_ACCEPT.format(kind="PartialObjectMetadataList"),
        watch_accept=_METADATA_ACCEPT.format(kind="PartialObjectMetadata"),
    ),
    ClientKind(
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


def _say(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def random_configmap(name: str, *, kb: int) -> dict[str, Any]:
    """A ConfigMap of ``kb`` KiB of base64 of random bytes (gzip saves only its 25%)."""
    body = kubeapi.configmap(name=name, namespace=CLIENTS_NAMESPACE)
    body["data"] = {"payload": base64.b64encode(os.urandom(kb * 1024 * 3 // 4)).decode()}
    return body


async def _count(api: kubeapi.RawClient) -> int:
    page = await api.get(CLIENTS_PATH, limit="1")
    return len(page["items"]) + int(page["metadata"].get("remainingItemCount") or 0)


async def grow_random(plane: ControlPlane, *, to: int, kb: int) -> None:
    """Create ConfigMaps of random data (64 at a time) until the namespace holds ``to``."""
    async with kubeapi.RawClient(
        base_url=plane.server,
        concurrency=64,
        ssl_context=kubeapi.client_ssl(plane.pki, identity="admin"),
    ) as api:
        await kubeapi.ensure_namespace(api, CLIENTS_NAMESPACE)
        have = await _count(api)
        index, started, before = have, time.monotonic(), have
        while have < to:
            end = index + min(to - have, 5000)
            await api.gather(
                api.ensure(CLIENTS_PATH, random_configmap(f"cm-{i:07d}", kb=kb))
                for i in range(index, end)
            )
            index = end
            have = await _count(api)
            rate = (have - before) / (time.monotonic() - started)
            _say(f"  {have} of {to} ConfigMaps ({rate:.0f}/s)")


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
        for labels, value in _samples(text, "warmwatch_passthrough_requests_total"):
            key = f"{labels.get('verb')} {labels.get('code')}"
            passthrough[key] = passthrough.get(key, 0.0) + value
        return cls(
            events_out=sum(v for _, v in _samples(text, "warmwatch_events_out_total")),
            list_bytes=sum(
                v
                for labels, v in _samples(text, "warmwatch_list_bytes_total")
                if labels.get("source") == "cache"
            ),
            passthrough=passthrough,
            relists=sum(v for _, v in _samples(text, "warmwatch_upstream_relists_total")),
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


def _samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    found = []
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        metric, _, label_text = series.partition("{")
        if metric != name:
            continue
        labels = dict(
            part.split("=", 1) for part in label_text.rstrip("}").split(",") if "=" in part
        )
        found.append(({k: v.strip('"') for k, v in labels.items()}, float(value)))
    return found


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


def scan_log(log: Path) -> list[str]:
    """Lines of a warmwatch log worth a look: warnings, errors, tracebacks."""
    if not log.exists():
        return []
    return [
        line
        for line in log.read_text(errors="replace").splitlines()
        if any(mark in line for mark in (" WARNING ", " ERROR ", " CRITICAL ", "Traceback"))
        and "--client-auth none" not in line  # the expected warning of a test setup
    ]


@dataclass
class ClientsBench:
    plane: ControlPlane
    directory: Path
    binary: Path
    link: toxiproxy.Link
    samples: dict[tuple[str, int, str], list[float]] = field(default_factory=dict)
    fills: dict[tuple[int, str], float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    watch_list: set[str] = field(default_factory=set)
    started_managers: int = 0
    warmwatch_only_from: float = math.inf
    """Sizes from this on measure (b) and (d) only (``--warmwatch-only-from``)."""

    def note(self, message: str) -> None:
        if message not in self.notes:
            self.notes.append(message)
        _say(f"NOTE: {message}")

    def sync(self, kind: ClientKind, kubeconfig: Path, *, expect: int, what: str) -> float:
        """Seconds from starting the client until its informer synced (NaN when it failed)."""
        if kind.is_controller_manager:
            return self.sync_controller_manager(kubeconfig, what=f"{what}, N={expect}")
        started = time.monotonic()
        client = goclient.GoClient.start(
            self.binary,
            kubeconfig=kubeconfig,
            resources=[CLIENTS_RESOURCE],
            mode=kind.mode,
            protobuf=kind.protobuf,
            extra=[*kind.extra, "--no-items"],
        )
        try:
            synced = client.wait_synced(timeout=SYNC_TIMEOUT)[0]
            seconds = time.monotonic() - started
            start = client.start_line()
        except (RuntimeError, TimeoutError) as error:
            self.note(f"{kind.label}, {what}, N={expect}: failed: {error}")
            return float("nan")
        finally:
            client.stop()
        self.watch_list.add(str(start.get("watchList")).lower())
        if bool(start.get("protobuf")) != kind.protobuf or bool(start.get("json")) != (
            "--json" in kind.extra
        ):
            self.note(f"{kind.label}: the client's start line does not show its flags: {start}")
        if synced["count"] != expect:
            self.note(f"{kind.label}, {what}: synced {synced['count']} objects, expected {expect}")
        return seconds

    def sync_controller_manager(self, kubeconfig: Path, *, what: str) -> float:
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
            return manager.wait_synced(SYNC_TIMEOUT)
        except (RuntimeError, TimeoutError, controllers.NotSynced) as error:
            # Its garbage collector gives up after 30 s, e.g. on its first start through a
            # warmwatch that fills every collection it asks for (not a measured run).
            self.note(f"kube-controller-manager, {what}: failed: {str(error)[:300]}")
            return float("nan")
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
        seconds = self.sync(kind, kubeconfig, expect=size, what=what)
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
        _say(f"{kind.label}, {what}, N={size}: synced in {seconds:.2f} s{detail}")
        if record:
            self.samples.setdefault((kind.label, size, condition), []).append(seconds)
        return seconds

    def probe(self, sidecar: Sidecar, condition: str) -> None:
        before = Served.read(sidecar)
        for kind in CLIENT_KINDS:
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
                _say(f"probe ({condition}) {kind.label} {verb}: {status} {content_type}")
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
        _say(
            f"warmwatch {name}: {how} {size} objects twice (JSON, protobuf) in "
            f"{self.fills[(size, name)]:.1f} s; log {sidecar.log}"
        )
        return sidecar

    def run_size(self, size: int, *, runs: int, link_kubeconfig: Path) -> None:
        direct = self.plane.admin_kubeconfig
        only_warmwatch = size >= self.warmwatch_only_from
        conditions = "bd" if only_warmwatch else "abcd"
        local = self.start_sidecar("local", upstream=direct, size=size)
        if only_warmwatch:
            try:  # the clients' first start, before the copy: it holds what they learned
                for kind in CLIENT_KINDS:
                    # Until it syncs: kube-controller-manager's garbage collector gives up
                    # after 30 s while warmwatch still fills what it learned from it.
                    for _ in range(FIRST_START_ATTEMPTS):
                        seconds = self.measure(
                            kind, "b", local.kubeconfig, size=size, sidecar=local, record=False
                        )
                        if seconds == seconds:
                            break
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
            if not only_warmwatch:
                for kind in CLIENT_KINDS:  # the clients' first start: measured are restarts
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
                _say(f"N={size}: run {run} of {runs}")
                for kind in CLIENT_KINDS:
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
                if size >= self.warmwatch_only_from
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
            for kind in CLIENT_KINDS:
                a, b, c, d = (median(kind.label, size, x) for x in CONDITIONS)
                lines.append(
                    f"| {kind.label} | {size:,} | {seconds(a)} | {seconds(b)} | {seconds(c)} | "
                    f"{seconds(d)} | {ratio(b, a)} | {ratio(d, b)} | {ratio(c, d)} |"
                )
        if self.notes:
            lines += ["", "Notes:", *(f"- {note}" for note in self.notes)]
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
    bench = ClientsBench(
        plane=plane,
        directory=directory,
        binary=binary,
        link=link,
        warmwatch_only_from=args.warmwatch_only_from or math.inf,
    )
    server = toxiproxy.Toxiproxy.start(log=directory / "toxiproxy.log")
    try:
        proxy = server.create_proxy(
            "apiserver", upstream=f"127.0.0.1:{plane.state().apiserver_port}"
        )
        link.apply(proxy)
        link_kubeconfig = toxiproxy.kubeconfig_through(
            proxy, pki=plane.pki, identity="admin", path=directory / "link.kubeconfig"
        )
        _say(f"link: 127.0.0.1:{proxy.port} -> {proxy.upstream}, {link.describe()}")
        for size in sizes:
            _say(f"growing to {size} ConfigMaps of {args.kb} KiB of random data ...")
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


# -- the million-object bar (--million) --------------------------------------------------------

MILLION_KB = 1
"""Data per ConfigMap for --million: base64 of 768 random bytes, 1 KiB."""
MILLION_SIZES = "1000000"
MILLION_FILL_TIMEOUT = 3600.0
MILLION_RELIST_TIMEOUT = 3600.0
WATCHERS = 100
CONCURRENT_LISTS = 4


def _million_namespace(size: int) -> str:
    return f"million-{size}"


def _name(index: int) -> str:
    return f"cm-{index:07d}"


def _status_kb(pid: int, field_name: str) -> int:
    """A ``/proc/PID/status`` field in bytes (VmRSS, VmHWM); 0 when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith(f"{field_name}:"):
            return int(line.split()[1]) * 1024
    return 0


class RssSampler:
    """Samples a process's VmRSS on a thread; ``peak`` is the largest sample, ``hwm`` its
    VmHWM at the last sample (the kernel's own peak since the process started)."""

    def __init__(self, pid: int, *, interval: float = 0.05) -> None:
        self.pid = pid
        self.interval = interval
        self.peak = 0
        self.hwm = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _status_kb(self.pid, "VmRSS"))
            self.hwm = max(self.hwm, _status_kb(self.pid, "VmHWM"))
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _status_kb(self.pid, "VmRSS"))
        self.hwm = max(self.hwm, _status_kb(self.pid, "VmHWM"))


async def _with_retries(call: Any, what: str, *, attempts: int = 8) -> None:
    """``await call()``, retried on 429/5xx and connection errors with a short backoff."""
    for attempt in range(attempts):
        try:
            await call()
            return
        except kubeapi.ApiError as error:
            if (error.status != 429 and error.status < 500) or attempt == attempts - 1:
                raise
        except (TimeoutError, aiohttp.ClientError):
            if attempt == attempts - 1:
                raise
        await asyncio.sleep(0.2 * 2**attempt)
    raise AssertionError(what)


@dataclass(kw_only=True, slots=True)
class Pool:
    """Progress of one concurrent create or delete run."""

    done: int = 0
    seconds: float = 0.0
    stopped_at: int | None = None
    """The count it stopped at when the budget would have been exceeded."""

    @property
    def rate(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else float("nan")


async def _run_pool(
    what: str,
    count: int,
    make: Any,
    *,
    api: kubeapi.RawClient,
    budget: float | None = None,
    round_to: int = 50_000,
) -> Pool:
    """Run ``make(i)`` for i in 0..count-1 with ``api.concurrency`` workers; progress to
    stderr every 10 s. With ``budget`` (seconds): after 90 s, when the rate says ``count``
    will not be reached within it, stop at the largest multiple of ``round_to`` that fits."""
    pool = Pool()
    limit = count
    next_index = 0
    started = time.monotonic()

    async def worker() -> None:
        nonlocal next_index
        while next_index < limit:
            index = next_index
            next_index += 1
            await _with_retries(functools.partial(make, index), f"{what} {index}")
            pool.done += 1

    async def report() -> None:
        nonlocal limit
        checked = False
        while True:
            await asyncio.sleep(10)
            elapsed = time.monotonic() - started
            rate = pool.done / elapsed
            eta = (limit - pool.done) / rate if rate else float("inf")
            _say(f"  {what}: {pool.done:,} of {limit:,} ({rate:.0f}/s, ~{eta:.0f} s to go)")
            if budget is not None and not checked and elapsed >= 90:
                checked = True
                fits = int(rate * budget) // round_to * round_to
                if count / rate > budget and fits < count:
                    fits = max(fits, round_to, pool.done)
                    _say(
                        f"  {what}: {count:,} would take {count / rate / 60:.0f} min at "
                        f"{rate:.0f}/s, over the budget of {budget / 60:.0f} min: "
                        f"stopping at {fits:,}"
                    )
                    limit = pool.stopped_at = fits

    reporter = asyncio.create_task(report())
    try:
        await asyncio.gather(*(worker() for _ in range(api.concurrency)))
    finally:
        reporter.cancel()
    pool.seconds = time.monotonic() - started
    return pool


def _million_configmap(name: str, namespace: str) -> dict[str, Any]:
    body = kubeapi.configmap(name=name, namespace=namespace)
    body["data"] = {"payload": base64.b64encode(os.urandom(MILLION_KB * 1024 * 3 // 4)).decode()}
    return body


async def fill_upstream(
    plane: ControlPlane, *, namespace: str, count: int, concurrency: int, budget: float
) -> Pool:
    """Create ``count`` ConfigMaps cm-0000000... in an empty ``namespace``."""
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    async with kubeapi.RawClient(
        base_url=plane.server,
        concurrency=concurrency,
        ssl_context=kubeapi.client_ssl(plane.pki, identity="admin"),
    ) as api:
        await kubeapi.ensure_namespace(api, namespace)
        page = await api.get(path, limit="1")
        if page["items"]:
            raise SystemExit(f"namespace {namespace} is not empty: use a fresh --dir")
        return await _run_pool(
            "create",
            count,
            lambda i: api.ensure(path, _million_configmap(_name(i), namespace)),
            api=api,
            budget=budget,
        )


async def delete_half(plane: ControlPlane, *, namespace: str, count: int, concurrency: int) -> Pool:
    """Delete the even-numbered half of cm-0000000..cm-{count-1}: concurrent DELETEs."""
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    async with kubeapi.RawClient(
        base_url=plane.server,
        concurrency=concurrency,
        ssl_context=kubeapi.client_ssl(plane.pki, identity="admin"),
    ) as api:
        return await _run_pool(
            "delete", (count + 1) // 2, lambda i: api.delete(f"{path}/{_name(2 * i)}"), api=api
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class ListRead:
    size: int
    seconds: float
    first_byte: float
    encoding: str
    """The answer's Content-Encoding ("" for identity)."""
    error: str = ""
    """Why the answer ended before its end (cut by the server): size and seconds are up to
    then."""

    @property
    def rate(self) -> float:
        return self.size / self.seconds / 1e6

    def describe(self) -> str:
        if self.error:
            return f"cut after {self.seconds:.0f} s, {self.size / 1e6:,.0f} MB read ({self.error})"
        return f"{self.rate:,.0f} ({self.seconds:.1f} s)"


async def _read_list(
    session: aiohttp.ClientSession,
    url: str,
    *,
    params: dict[str, str] | None = None,
    identity: bool = False,
) -> ListRead:
    """One full LIST, read to its end and discarded (aiohttp's default Accept-Encoding,
    gzip, as client-go sends, unless ``identity``; sizes are of the decoded body)."""
    started = time.perf_counter()
    headers = {"Accept": "application/json"}
    if identity:
        headers["Accept-Encoding"] = "identity"
    async with session.get(url, params=params, headers=headers) as answer:
        if answer.status != 200:
            raise RuntimeError(f"LIST {url}: {answer.status} {(await answer.read())[:300]!r}")
        size = 0
        first = 0.0
        error = ""
        encoding = answer.headers.get("Content-Encoding", "")
        try:
            async for chunk in answer.content.iter_chunked(1 << 20):
                if not first:
                    first = time.perf_counter() - started
                size += len(chunk)
        except aiohttp.ClientPayloadError as cut:
            error = type(cut.__cause__ or cut).__name__
    return ListRead(
        size=size,
        seconds=time.perf_counter() - started,
        first_byte=first,
        encoding=encoding,
        error=error,
    )


async def list_reads(
    url: str,
    *,
    ssl_context: ssl.SSLContext | None,
    runs: int,
    concurrent: int = 1,
    params: dict[str, str] | None = None,
    identity: bool = False,
) -> list[ListRead]:
    connector = aiohttp.TCPConnector(ssl=ssl_context or False, limit=concurrent)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        reads: list[ListRead] = []
        for _ in range(runs):
            reads += await asyncio.gather(
                *(
                    _read_list(session, url, params=params, identity=identity)
                    for _ in range(concurrent)
                )
            )
        return reads


@dataclass(frozen=True, kw_only=True, slots=True)
class Restart:
    """One warm restart: seconds from spawning the process."""

    port_open: float
    first_list_byte: float
    status: int
    ready: float
    list_ttfb_ready: float
    """Time to first byte of a LIST asked once /readyz said ready (from the request)."""


def _first_list_byte(port: int, path: str, *, deadline: float) -> tuple[float, float, int]:
    """Poll the API port until a LIST answers: (seconds until the port accepted a
    connection, until the first body byte of a 200 answer, its status), from now."""
    started = time.monotonic()
    opened = 0.0
    while time.monotonic() < deadline:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            connection.connect()
            if not opened:
                opened = time.monotonic() - started
            connection.request("GET", path, headers={"Accept": "application/json"})
            answer = connection.getresponse()
            if answer.status == 200 and answer.read(1):
                return opened, time.monotonic() - started, answer.status
            answer.read()
        except OSError:
            pass
        finally:
            connection.close()
        time.sleep(0.002)
    raise TimeoutError(f"no LIST answer on port {port}")


def _ready(sidecar: Sidecar) -> bool:
    try:
        return sidecar.readyz()[0] == 200
    except OSError:  # polled right after a restart: the metrics port is not open yet
        return False


def warm_restart(sidecar: Sidecar, path: str) -> Restart:
    """Stop warmwatch, start it on the same database; time the first LIST byte from its
    cache, then /readyz, then a LIST's time to first byte once ready."""
    sidecar.stop()
    started = time.monotonic()
    sidecar.restart(wait_ready=False)
    opened, first, status = _first_list_byte(
        sidecar.port, f"{path}?resourceVersion=0", deadline=started + 600
    )
    while not _ready(sidecar):
        if time.monotonic() - started > 600:
            raise TimeoutError("warmwatch not ready after a warm restart")
        time.sleep(0.002)
    ready = time.monotonic() - started
    _, ttfb, _ = _first_list_byte(
        sidecar.port, f"{path}?resourceVersion=0", deadline=time.monotonic() + 60
    )
    return Restart(
        port_open=opened, first_list_byte=first, status=status, ready=ready, list_ttfb_ready=ttfb
    )


def compile_bytecode() -> None:
    """Compile warmwatch's own modules to bytecode, as the image does at build time
    (Dockerfile: ``compileall``). Under ``PYTHONDONTWRITEBYTECODE`` (set in the image, and
    often in CI) a source checkout is never compiled to files, so every start would compile
    proxy/ again: about 100 ms more than a real start on the 2-core test machine, measured
    in the start-up figures. Files already up to date are left alone."""
    compileall.compile_dir(Path(__file__).resolve().parents[1] / "proxy", quiet=1)


def import_startup(runs: int = 3) -> float:
    """Seconds for ``python -m proxy --help`` (median of ``runs``): the interpreter and the
    imports of warmwatch's command line."""
    seconds = []
    for _ in range(runs):
        started = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "proxy", "--help"],
            check=True,
            stdout=subprocess.DEVNULL,
            cwd=Path(__file__).resolve().parents[1],
        )
        seconds.append(time.monotonic() - started)
    return statistics.median(seconds)


async def _watch_idle(
    session: aiohttp.ClientSession, url: str, rv: str, opened: asyncio.Event, counter: list[int]
) -> None:
    params = {
        "watch": "true",
        "resourceVersion": rv,
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "3600",
    }
    async with session.get(url, params=params) as answer:
        if answer.status != 200:
            raise RuntimeError(f"watch: {answer.status} {(await answer.read())[:300]!r}")
        counter[0] += 1
        if counter[0] == WATCHERS:
            opened.set()
        async for _ in answer.content.iter_any():
            pass


@dataclass(frozen=True, kw_only=True, slots=True)
class Served4:
    rss_idle_watchers: int
    rss_peak: int
    hwm: int
    watchers_gauge: float
    reads: list[ListRead]
    seconds: float


async def serve_under_load(sidecar: Sidecar, path: str) -> Served4:
    """RSS of warmwatch holding 100 idle watchers, then also serving 4 concurrent full LISTs."""
    connection = http.client.HTTPConnection("127.0.0.1", sidecar.port, timeout=300)
    try:
        connection.request("GET", f"{path}?fieldSelector=metadata.name%3Dcm-none")
        rv = str(orjson.loads(connection.getresponse().read())["metadata"]["resourceVersion"])
    finally:
        connection.close()
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        opened = asyncio.Event()
        counter = [0]
        watchers = [
            asyncio.create_task(_watch_idle(session, f"{sidecar.url}{path}", rv, opened, counter))
            for _ in range(WATCHERS)
        ]
        try:
            await asyncio.wait_for(opened.wait(), 120)
            await asyncio.sleep(2)
            gauge = await asyncio.to_thread(sidecar.metric, "warmwatch_watchers")
            rss_idle = sidecar.rss_bytes()
            with RssSampler(sidecar.process.pid) as sampler:
                started = time.monotonic()
                reads = await list_reads(
                    f"{sidecar.url}{path}", ssl_context=None, runs=1, concurrent=CONCURRENT_LISTS
                )
                seconds = time.monotonic() - started
            failed = [w for w in watchers if w.done()]
            if failed:
                raise RuntimeError(f"{len(failed)} watchers ended: {failed[0]!r}")
        finally:
            for task in watchers:
                task.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
    return Served4(
        rss_idle_watchers=rss_idle,
        rss_peak=sampler.peak,
        hwm=sampler.hwm,
        watchers_gauge=gauge,
        reads=reads,
        seconds=seconds,
    )


def _db_bytes(db: Path) -> tuple[int, int]:
    """Sizes of the database file and its WAL."""
    wal = db.with_name(db.name + "-wal")
    return db.stat().st_size, wal.stat().st_size if wal.exists() else 0


def _count_objects(db: Path) -> int:
    """Objects in warmwatch's database (read-only; one shape here)."""
    connection = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return int(connection.execute("SELECT count(*) FROM objects").fetchone()[0])
    finally:
        connection.close()


def _log_lines(log: Path, offset: int) -> list[str]:
    with open(log, "rb") as handle:
        handle.seek(offset)
        return handle.read().decode(errors="replace").splitlines()


def wait_relisted(
    sidecar: Sidecar, *, offset: int, started: float, timeout: float
) -> tuple[float, str]:
    """Seconds from ``started`` until the log (after ``offset``) says the shape was listed;
    that line."""
    while time.monotonic() - started < timeout:
        if sidecar.process.poll() is not None:
            raise RuntimeError(f"warmwatch exited {sidecar.process.returncode} while relisting")
        for line in _log_lines(sidecar.log, offset):
            if "listed at RV" in line:
                return time.monotonic() - started, line
        time.sleep(0.05)
    raise TimeoutError("warmwatch did not relist")


@dataclass(kw_only=True)
class MillionResult:
    requested: int
    size: int = 0
    create: Pool | None = None
    fill: float = float("nan")
    fill_hwm: int = 0
    rss_filled: int = 0
    objects_filled: int = 0
    db_filled: tuple[int, int] = (0, 0)
    restarts: list[Restart] = field(default_factory=list)
    ww_lists: list[ListRead] = field(default_factory=list)
    api_lists: list[ListRead] = field(default_factory=list)
    api_plain_lists: list[ListRead] = field(default_factory=list)
    served: Served4 | None = None
    delete: Pool | None = None
    apiserver_restart: float = float("nan")
    relist: float = float("nan")
    relist_line: str = ""
    relist_peak: int = 0
    relist_hwm: int = 0
    objects_relisted: int = 0
    db_relisted: tuple[int, int] = (0, 0)
    phases: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


class Phase:
    """Times one phase into ``result.phases`` and says so on stderr."""

    def __init__(self, result: MillionResult, name: str) -> None:
        self.result, self.name = result, name

    def __enter__(self) -> Phase:
        _say(f"N={self.result.requested:,}: {self.name} ...")
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc_info: object) -> None:
        seconds = time.monotonic() - self.started
        self.result.phases[self.name] = seconds
        _say(f"N={self.result.requested:,}: {self.name} took {seconds:.1f} s")


def run_million(
    plane: ControlPlane, directory: Path, result: MillionResult, args: argparse.Namespace
) -> None:
    requested = result.requested
    namespace = _million_namespace(requested)
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    admin_ssl = kubeapi.client_ssl(plane.pki, identity="admin")
    with Phase(result, "create upstream"):
        result.create = asyncio.run(
            fill_upstream(
                plane,
                namespace=namespace,
                count=requested,
                concurrency=args.concurrency,
                budget=args.create_budget_min * 60,
            )
        )
    size = result.size = result.create.done
    if result.create.stopped_at is not None:
        result.notes.append(
            f"N={requested:,} would have taken {requested / result.create.rate / 60:.0f} min to "
            f"create at {result.create.rate:.0f}/s (budget {args.create_budget_min:.0f} min): "
            f"measured at N={size:,} instead"
        )
    db = directory / f"ww-million-{requested}.db"
    for stale in directory.glob(f"ww-million-{requested}.*"):
        stale.unlink()
    with Phase(result, "warmwatch cold fill"):
        started = time.monotonic()
        sidecar = Sidecar.start(
            upstream_kubeconfig=plane.admin_kubeconfig,
            db=db,
            resources=[f"v1/configmaps@{namespace}"],
            wait_ready=False,
        )
        with RssSampler(sidecar.process.pid, interval=0.2) as sampler:
            sidecar.wait_ready(timeout=MILLION_FILL_TIMEOUT)
            result.fill = time.monotonic() - started
        result.fill_hwm = sampler.hwm
    try:
        time.sleep(2)
        result.rss_filled = sidecar.rss_bytes()
        result.objects_filled = _count_objects(db)
        result.db_filled = _db_bytes(db)
        _say(
            f"  filled in {result.fill:.1f} s, {result.objects_filled:.0f} objects, RSS "
            f"{result.rss_filled / 1e6:.0f} MB (peak {result.fill_hwm / 1e6:.0f} MB)"
        )
        with Phase(result, "warm restarts"):
            for _ in range(args.restarts):
                restart = warm_restart(sidecar, path)
                _say(f"  {restart}")
                result.restarts.append(restart)
            passed = sidecar.metric("warmwatch_passthrough_requests_total")
            if passed:
                result.notes.append(
                    f"N={size:,}: {passed:.0f} requests passed through during the last warm "
                    "restart (a LIST answered by the apiserver, not the cache?)"
                )
        with Phase(result, "full LISTs"):
            result.ww_lists = asyncio.run(
                list_reads(f"{sidecar.url}{path}", ssl_context=None, runs=args.list_runs)
            )
            result.api_lists = asyncio.run(
                list_reads(
                    f"{plane.server}{path}",
                    ssl_context=admin_ssl,
                    runs=args.list_runs,
                    params={"resourceVersion": "0"},
                )
            )
            result.api_plain_lists = asyncio.run(
                list_reads(
                    f"{plane.server}{path}",
                    ssl_context=admin_ssl,
                    runs=args.list_runs,
                    params={"resourceVersion": "0"},
                    identity=True,
                )
            )
            for read in result.ww_lists + result.api_lists + result.api_plain_lists:
                _say(f"  {read}")
            cut = [
                r for r in result.ww_lists + result.api_lists + result.api_plain_lists if r.error
            ]
            for read in cut:
                source = "warmwatch" if read in result.ww_lists else "the apiserver"
                result.notes.append(
                    f"N={size:,}: a full LIST from {source} "
                    f"({read.encoding or 'identity'}) was {read.describe()}"
                )
        with Phase(result, "4 LISTs + 100 watchers"):
            result.served = asyncio.run(serve_under_load(sidecar, path))
            _say(f"  {result.served}")
            for read in result.served.reads:
                if read.error:
                    result.notes.append(
                        f"N={size:,}: one of the 4 concurrent LISTs was {read.describe()}"
                    )
    finally:
        sidecar.stop()
    with Phase(result, "delete half upstream"):
        result.delete = asyncio.run(
            delete_half(plane, namespace=namespace, count=size, concurrency=args.concurrency)
        )
    with Phase(result, "apiserver restart"):
        plane.stop_apiserver()
        for attempt in range(10):  # its watch cache of N/2 objects may take a while
            try:
                plane.start_apiserver()
                break
            except TimeoutError:
                _say(f"  apiserver not ready yet (attempt {attempt + 1}); waiting on")
        else:
            raise TimeoutError("the apiserver did not get ready after its restart")
    result.apiserver_restart = result.phases["apiserver restart"]
    with Phase(result, "warmwatch relist"):
        offset = sidecar.log.stat().st_size
        started = time.monotonic()
        sidecar.restart(wait_ready=False)
        try:
            with RssSampler(sidecar.process.pid) as sampler:
                result.relist, result.relist_line = wait_relisted(
                    sidecar, offset=offset, started=started, timeout=MILLION_RELIST_TIMEOUT
                )
            result.relist_peak, result.relist_hwm = sampler.peak, sampler.hwm
            time.sleep(2)
            result.db_relisted = _db_bytes(db)
            _say(f"  {result.relist_line}")
        finally:
            sidecar.stop()
    result.objects_relisted = _count_objects(db)
    relist_log = _log_lines(sidecar.log, offset)
    if not any("410" in line or "too old" in line.lower() for line in relist_log):
        result.notes.append(f"N={size:,}: no 410 seen in the log before the relist")
    expected = size - result.delete.done
    if result.objects_relisted != expected:
        result.notes.append(
            f"N={size:,}: after the relist warmwatch holds {result.objects_relisted:.0f} "
            f"objects, expected {expected:,}"
        )
    if result.objects_filled != size:
        result.notes.append(
            f"N={size:,}: after the fill warmwatch held {result.objects_filled:.0f} objects"
        )
    odd = scan_log(sidecar.log)
    if odd:
        result.notes.append(
            f"{sidecar.log.name}: {len(odd)} warning/error lines, e.g. "
            + " | ".join(line[:300] for line in odd[:5])
        )


def _mb(value: float) -> str:
    return f"{value / 1e6:,.0f}" if value else "n/a"


def million_table(results: Sequence[MillionResult], *, machine: str, startup: float) -> list[str]:
    def median(values: Sequence[float]) -> float:
        return statistics.median(values) if values else float("nan")

    def cells(render: Any) -> str:
        out = []
        for result in results:
            try:
                out.append(str(render(result)))
            except (TypeError, ValueError, AttributeError, ZeroDivisionError):
                out.append("n/a")
        return " | ".join(out)

    def ms(value: float) -> str:
        return f"{value * 1000:,.0f} ms"

    def best(reads: Sequence[ListRead]) -> ListRead:
        """The fastest complete read; the longest cut one when none completed."""
        whole = [read for read in reads if not read.error]
        if whole:
            return max(whole, key=lambda r: r.rate)
        return max(reads, key=lambda r: r.seconds)

    def ratio(x: ListRead, y: ListRead) -> str:
        return "n/a (cut)" if x.error or y.error else f"{x.rate / y.rate:.2f}x"

    rows: list[tuple[str, Any]] = [
        ("objects N (1 KiB random data each)", lambda r: f"{r.size:,}"),
        (
            "create upstream: s (objects/s)",
            lambda r: f"{r.create.seconds:,.0f} s ({r.create.rate:,.0f}/s)",
        ),
        (
            "warmwatch cold fill to /readyz: s (objects/s)",
            lambda r: f"{r.fill:.1f} s ({r.size / r.fill:,.0f}/s)",
        ),
        ("warmwatch peak RSS during the fill (VmHWM), MB", lambda r: _mb(r.fill_hwm)),
        ("objects in warmwatch's database after the fill", lambda r: f"{r.objects_filled:,}"),
        ("warmwatch RSS filled, MB", lambda r: _mb(r.rss_filled)),
        (
            "warm restart: process start → API port open (median)",
            lambda r: ms(median([x.port_open for x in r.restarts])),
        ),
        (
            "warm restart: process start → first LIST byte from the cache (median; min-max)",
            lambda r: (
                f"{ms(median([x.first_list_byte for x in r.restarts]))} "
                f"({ms(min(x.first_list_byte for x in r.restarts))}-"
                f"{ms(max(x.first_list_byte for x in r.restarts))})"
            ),
        ),
        (
            "warm restart: first LIST byte minus port open (median)",
            lambda r: ms(median([x.first_list_byte - x.port_open for x in r.restarts])),
        ),
        (
            "warm restart: process start → /readyz 200 (median)",
            lambda r: ms(median([x.ready for x in r.restarts])),
        ),
        (
            "LIST time to first byte once ready (median)",
            lambda r: ms(median([x.list_ttfb_ready for x in r.restarts])),
        ),
        ("full LIST size, MB (JSON)", lambda r: _mb(best(r.ww_lists).size)),
        (
            "full LIST from warmwatch: MB/s (s), best of runs",
            lambda r: best(r.ww_lists).describe(),
        ),
        (
            "full LIST from the apiserver rv=0: MB/s (s), best of runs",
            lambda r: best(r.api_lists).describe(),
        ),
        (
            "full LIST from the apiserver rv=0, Accept-Encoding identity: MB/s (s)",
            lambda r: best(r.api_plain_lists).describe(),
        ),
        (
            "warmwatch / apiserver LIST rate (gzip; identity)",
            lambda r: (
                f"{ratio(best(r.ww_lists), best(r.api_lists))}; "
                f"{ratio(best(r.ww_lists), best(r.api_plain_lists))}"
            ),
        ),
        ("warmwatch RSS with 100 idle watchers, MB", lambda r: _mb(r.served.rss_idle_watchers)),
        (
            "warmwatch peak RSS, 4 concurrent full LISTs + 100 idle watchers, MB",
            lambda r: _mb(r.served.rss_peak),
        ),
        (
            "4 concurrent full LISTs: s (aggregate MB/s)",
            lambda r: (
                f"{r.served.seconds:.1f} s "
                f"({sum(x.size for x in r.served.reads) / r.served.seconds / 1e6:,.0f})"
            ),
        ),
        ("SQLite db + wal filled, MB", lambda r: f"{_mb(r.db_filled[0])} + {_mb(r.db_filled[1])}"),
        (
            "delete half upstream while warmwatch is down: s (objects/s)",
            lambda r: f"{r.delete.seconds:,.0f} s ({r.delete.done:,} at {r.delete.rate:,.0f}/s)",
        ),
        ("apiserver restart (stop, start, /readyz), s", lambda r: f"{r.apiserver_restart:.1f}"),
        (
            "relist after half vanished: process start → 'listed at RV', s",
            lambda r: f"{r.relist:.1f}",
        ),
        (
            "warmwatch peak RSS during the relist, MB",
            lambda r: _mb(max(r.relist_peak, r.relist_hwm)),
        ),
        (
            "SQLite db + wal after the relist, MB",
            lambda r: f"{_mb(r.db_relisted[0])} + {_mb(r.db_relisted[1])}",
        ),
    ]
    encodings = sorted(
        {f"warmwatch {x.encoding or 'identity'}" for r in results for x in r.ww_lists}
        | {f"apiserver {x.encoding or 'identity'}" for r in results for x in r.api_lists}
    )
    lines = [
        f"The million-object bar ({machine}): N ConfigMaps of 1 KiB of random data in one "
        "namespace; warmwatch caches `v1/configmaps@NS` (JSON). LIST rates: one client reading "
        f"the whole body, Accept-Encoding gzip (answers: {', '.join(encodings) or '?'}). "
        f"Process start-up reference, `python -m proxy --help`: {startup * 1000:,.0f} ms.",
        "",
        "| measure | " + " | ".join(f"N={r.size:,}" for r in results) + " |",
        "|---|" + "---|" * len(results),
    ]
    lines += [f"| {label} | {cells(render)} |" for label, render in rows]
    notes = [note for r in results for note in r.notes]
    phases = [
        f"N={r.size:,}: " + ", ".join(f"{name} {s:,.0f} s" for name, s in r.phases.items())
        for r in results
    ]
    relisted = [f"N={r.size:,}: {r.relist_line.strip()}" for r in results if r.relist_line]
    lines += ["", "Phases (wall time):", *(f"- {p}" for p in phases)]
    if relisted:
        lines += ["", "Relist log lines:", *(f"- `{line}`" for line in relisted)]
    if notes:
        lines += ["", "Notes:", *(f"- {note}" for note in notes)]
    return lines


def million_main(args: argparse.Namespace) -> int:
    sizes = [int(s) for s in (args.sizes or MILLION_SIZES).split(",")]
    args.dir.mkdir(parents=True, exist_ok=True)
    directory = args.dir.resolve()
    plane = ControlPlane(directory / "cp")
    plane.up()
    plane.stop_controller_manager()  # an idle apiserver; its garbage collector would watch all
    results: list[MillionResult] = []
    startup = float("nan")
    try:
        compile_bytecode()
        startup = import_startup()
        _say(f"process start-up reference (python -m proxy --help): {startup:.2f} s")
        for size in sizes:
            result = MillionResult(requested=size)
            results.append(result)
            try:
                run_million(plane, directory, result, args)
            except Exception as error:  # the table still shows what was measured
                result.notes.append(f"N={size:,}: FAILED: {error!r}"[:2000])
                _say(f"N={size:,}: FAILED: {error!r}")
                break
    finally:
        if args.keep:
            plane.start_controller_manager()
        else:
            plane.down()
            shutil.rmtree(directory / "cp", ignore_errors=True)
    machine = f"{os.cpu_count()} cores, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB"
    text = "\n".join(million_table(results, machine=machine, startup=startup))
    print(f"\n{text}")
    if args.out:
        args.out.write_text(text + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dir", type=Path, default=Path("/tmp/warmwatch-bench"))
    parser.add_argument(
        "--sizes",
        default=None,
        help="default 10000,50000,200000; with --clients 10000,100000; with --million 1000000",
    )
    parser.add_argument("--kb", type=int, default=2, help="data per ConfigMap, KiB")
    parser.add_argument("--keep", action="store_true", help="leave the control plane running")
    clients = parser.add_argument_group("--clients: client kinds on fast and slow links")
    clients.add_argument("--clients", action="store_true", help="run this benchmark instead")
    clients.add_argument("--runs", type=int, default=1, help="measurements per cell (median)")
    clients.add_argument("--link-latency-ms", type=int, default=25, help="each direction")
    clients.add_argument("--link-jitter-ms", type=int, default=0, help="each direction")
    clients.add_argument("--link-kb", type=int, default=5000, help="KB/s each direction")
    clients.add_argument(
        "--warmwatch-only-from",
        type=int,
        default=None,
        help="sizes from this on: (b) and (d) only, the link warmwatch on a copy",
    )
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    parser.add_argument("--chart", type=Path, help="also draw the results as a PNG chart here")
    million = parser.add_argument_group("--million: the million-object bar")
    million.add_argument("--million", action="store_true", help="run this benchmark instead")
    million.add_argument(
        "--concurrency", type=int, default=256, help="concurrent creates and deletes"
    )
    million.add_argument(
        "--create-budget-min",
        type=float,
        default=25,
        help="stop creating at the largest N (a multiple of 50,000) that fits in this",
    )
    million.add_argument("--restarts", type=int, default=3, help="warm restarts (median)")
    million.add_argument("--list-runs", type=int, default=3, help="full LISTs each (best)")
    args = parser.parse_args(argv)
    if args.clients:
        return clients_main(args)
    if args.million:
        return million_main(args)
    sizes = [int(s) for s in (args.sizes or "10000,50000,200000").split(",")]

    plane = ControlPlane(args.dir / "cp")
    plane.up()
    binary = goclient.build()
    admin_ssl = kubeapi.client_ssl(plane.pki, identity="admin")
    rows = []
    try:
        for size in sizes:
            print(
                f"[bench] growing to {size} ConfigMaps of {args.kb} KiB ...",
                file=sys.stderr,
                flush=True,
            )
            asyncio.run(grow(plane, to=size, kb=args.kb))
            db = args.dir / f"warmwatch-{size}.db"
            for stale in args.dir.glob(f"warmwatch-{size}.db*"):
                stale.unlink()
            started = time.monotonic()
            sidecar = Sidecar.start(
                upstream_kubeconfig=plane.admin_kubeconfig, db=db, resources=[SHAPE]
            )
            fill = time.monotonic() - started
            try:
                rss_filled = sidecar.rss_bytes()
                via = best_rate(f"{sidecar.url}{PATH}", ssl_context=None)
                direct_any = best_rate(
                    f"{plane.server}{PATH}?resourceVersion=0", ssl_context=admin_ssl
                )
                direct_recent = best_rate(f"{plane.server}{PATH}", ssl_context=admin_ssl)
                rss_served = sidecar.rss_bytes()
                sync_via = informer_sync(binary, sidecar.kubeconfig)
                sync_direct = informer_sync(binary, plane.admin_kubeconfig)
                db_bytes = sum(p.stat().st_size for p in args.dir.glob(f"warmwatch-{size}.db*"))
            finally:
                sidecar.stop()
            rows.append(
                (
                    size,
                    fill,
                    rss_filled,
                    rss_served,
                    db_bytes,
                    via,
                    direct_any,
                    direct_recent,
                    sync_via,
                    sync_direct,
                )
            )
    finally:
        if not args.keep:
            plane.down()
            shutil.rmtree(args.dir / "cp", ignore_errors=True)

    if args.chart:
        charting.draw_rows(args.chart, rows)
    print(
        f"\nConfigMaps of {args.kb} KiB; LIST rates are the best of 3 full LISTs read by one "
        "client; informer = client-go shared informer sync (LIST+WATCH)\n"
    )
    header = (
        "objects",
        "fill s",
        "RSS filled MB",
        "RSS served MB",
        "DB MB",
        "LIST via ww MB/s",
        "LIST apiserver rv=0 MB/s",
        "ratio",
        "LIST apiserver rv='' MB/s",
        "ratio",
        "informer via ww s",
        "informer direct s",
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for size, fill, rss_f, rss_s, db_bytes, via, d_any, d_recent, s_via, s_direct in rows:
        cells = (
            f"{size:,}",
            f"{fill:.1f}",
            f"{rss_f / 1e6:.0f}",
            f"{rss_s / 1e6:.0f}",
            f"{db_bytes / 1e6:.0f}",
            f"{via:.0f}",
            f"{d_any:.0f}",
            f"{via / d_any:.2f}x",
            f"{d_recent:.0f}",
            f"{via / d_recent:.2f}x",
            f"{s_via:.2f}",
            f"{s_direct:.2f}",
        )
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
