"""The randomized fault run: clients watch through warmwatch while everything around it breaks.

    python -m loadtest.faults [--minutes M] [--dir DIR] [--seed S] [--rate 200] [--plane-dir P]
    python -m loadtest.faults --recheck DIR     # check the runs recorded in DIR again, offline

What runs (all on loopback, started and stopped by the driver):

- a control plane (``loadtest.cluster``) in ``DIR/cp``, or the one in ``--plane-dir`` (reused and
  left running), with the widgets CRD (``manifests/widgets-crd.yaml``);
- the reference: one :class:`~loadtest.history.EtcdHistory` per resource, watching etcd itself
  (``/registry/configmaps/``, ``/registry/example.com/widgets/``), started before any traffic;
- traffic straight to the apiserver: creates, updates, label changes (so selectors see objects
  arrive and leave) and deletes of ConfigMaps and widgets in a few namespaces at ``--rate``;
- toxiproxy (``loadtest.toxiproxy``) with one proxy to the apiserver: warmwatch's upstream
  goes through it (a kubeconfig from ``kubeconfig_through``); the traffic and the reference
  stay direct;
- warmwatch (``loadtest.sidecar``) caching both resources, with a short event log
  (``--retention-events``), bookmarks every 2 s, a 5 s write timeout and an 8 s
  ``--upstream-idle-timeout`` (so a blackholed upstream watch is replaced within a short run;
  once traffic stops, its quiet watches are replaced every 8 s too, which is harmless);
- clients behind warmwatch. Raw Python watchers that behave like client-go's reflector (LIST
  at RV 0, WATCH from the list RV, resume from the last event or bookmark RV when the stream ends
  or the connection fails, relist after 410), in variants: with and without bookmarks, with a
  label selector, per namespace, WatchList (``sendInitialEvents``) — and one slow reader that
  stops reading for longer than the write timeout, is cut off by warmwatch and resumes. Every
  observation goes into a :class:`~loadtest.checking.ClientLog`. The Go informer program
  (``tests/goclient``), one process per resource and ``KUBE_FEATURE_WatchListClient`` value.
- faults at seeded random moments (``--gap`` apart), each counted:
  ``kill9`` (warmwatch ``kill -9``, restart), ``apiserver-restart`` (SIGTERM or, two times in
  three, SIGKILL — a graceful stop under load often takes ``loadtest.cluster``'s whole 15 s
  grace —, down a few seconds, started again), ``upstream-outage`` (apiserver down ``--outage``
  seconds while the clients carry on; halfway warmwatch is killed and restarted, so it starts
  warm with no upstream), ``compaction`` (warmwatch killed, traffic goes on, etcd compacted up to
  what the reference has read, warmwatch restarted: its resume gets 410, it relists and appends
  the difference; see below), ``client-away`` (a raw client disconnects until warmwatch's log
  no longer holds its RV, then comes back: 410, relist; counted once it got the 410) and
  ``blackhole`` (toxiproxy's ``timeout`` toxic with timeout 0 in both directions: warmwatch's
  upstream connections stay open but carry nothing, as when the apiserver's node died or a NAT
  entry was dropped, for 15-25 s, longer than the idle timeout, then removed; see below).
  warmwatch trims its log once a minute, so while a client is away warmwatch is not restarted
  and traffic flows (only a short apiserver restart may happen). ``--min-faults`` adds quick
  faults after ``--minutes`` until that many were injected; a kind never drawn by then is
  injected first.

At the end traffic stops, the driver waits (bounded) until every client equals the apiserver's
state, then checks everything with :func:`loadtest.checking.check` — one run per resource, as a
reference history is one collection — prints the violations, then exactly one line
``faults=<n> events=<n checked> violations=<n>``, and exits non-zero on any violation (or
fault failure, below). Each run is written as JSON lines to ``DIR/run-<resource>.jsonl``
(``--recheck`` reads them back), the counts to ``DIR/summary.json``; warmwatch's log is
``DIR/warmwatch.log``, toxiproxy's ``DIR/toxiproxy.log``, the Go programs' output
``DIR/go-*.log``.

Upstream relists are read from warmwatch's own database while it runs (its log is trimmed):
a relist leaves a BOOKMARK row with ``batch = 1`` at the relist RV, and the row before the batch
holds the RV the cache had reached when the resume got 410 (``UpstreamRelist.reached``).

The compaction fault restarts the apiserver between compacting etcd and restarting warmwatch:
the apiserver serves watches from its watch cache, which keeps every event of at least the last
75 s in memory whatever etcd compacted, so a resume after a short downtime would not see the
compaction at all. A restarted apiserver's watch cache starts after the compaction.

The blackhole fault waits (bounded) until every shape of warmwatch is current (its RV in the
database has reached etcd's revision), notes warmwatch's log offset and metrics, adds the toxics
and, while they hold, reads warmwatch's log for its reflectors' ``...; retrying in`` lines (a
new watch that cannot connect through the blackhole fails after warmwatch's 10 s connect
timeout, so a short blackhole may end before any). For each resource
``warmwatch_upstream_watch_restarts_total`` with ``reason="idle"`` (a silent watch replaced)
or ``"error"`` must grow by at least its number of shapes (every reflector replaced its
silent watch), and after the toxics are removed every shape must be current again within
120 s. The
timeline, the log lines and the metric deltas are recorded in ``summary.json``
(``blackholes``); a blackhole not noticed or not recovered from is a ``fault_failures`` entry,
printed before the summary line, and fails the run like a violation.

The Go informers are checked as far as their output allows: their event lines carry object RVs
but no list RVs or bookmarks. For each Go process (one resource) the final store (``digest``)
must equal the apiserver's final state — modelled as a ClientLog with only a final state, so
the checker's convergence rule reports it and the recorded run holds it — and its non-initial
events must not go back in RV: per object always (an equal RV only for the no-op update or the
tombstone a client-go relist produces), and across objects (strictly increasing, equal only for
the DELETEDs of one warmwatch relist batch) until the informer relists: client-go's relist
replays the list in key order, so ordering across objects is not checked after the first relist
(``Listing and watching`` in the program's log, ``-v=3``). Those are added to the report as
``ordered`` / ``no-time-travel`` / ``unique`` violations of the Go client.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from loadtest import goclient, kubeapi, toxiproxy
from loadtest.checking import (
    Bookmarked,
    ClientLog,
    Counts,
    EventType,
    Expired,
    Item,
    Listed,
    Observation,
    Received,
    Report,
    Rule,
    Run,
    StreamEnded,
    UpstreamRelist,
    Violation,
    WatchStarted,
    check_run,
    format_run,
    read_run,
)
from loadtest.cluster import ControlPlane
from loadtest.history import EtcdHistory, compact, current_revision, registry_prefix
from loadtest.sidecar import Sidecar
from proxy.kube.selectors import LabelSelector

CRD_MANIFEST = Path(__file__).resolve().parent / "manifests" / "widgets-crd.yaml"
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
TIERS: tuple[str | None, ...] = ("gold", "silver", "bronze", None)
FAULT_KINDS = (
    "kill9",
    "apiserver-restart",
    "upstream-outage",
    "compaction",
    "client-away",
    "blackhole",
)
WRITE_TIMEOUT = 5.0
"""warmwatch's ``--watch-write-timeout``: the slow reader stalls longer than this."""

Key = tuple[str, str]

_T0 = time.monotonic()


def say(message: str) -> None:
    print(f"[faults {time.monotonic() - _T0:7.1f}s] {message}", file=sys.stderr, flush=True)


class RunFailed(Exception):
    """The run itself broke (not a guarantee): warmwatch died, the reference has a gap..."""


# ============================================================================ resources


@dataclass(frozen=True, kw_only=True)
class Resource:
    name: str
    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def flag(self) -> str:
        """warmwatch's ``--resource`` and the identity of the shape that serves every client."""
        return f"{self.api_version}/{self.plural}"

    @property
    def prefix(self) -> str:
        return registry_prefix(group=self.group, resource=self.plural)

    def collection(self, namespace: str | None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        return (
            f"{base}/namespaces/{namespace}/{self.plural}" if namespace else f"{base}/{self.plural}"
        )

    def body(
        self, *, namespace: str, name: str, labels: Mapping[str, str], serial: int, size: int
    ) -> dict[str, Any]:
        metadata = {"name": name, "namespace": namespace, "labels": dict(labels)}
        content = {"serial": str(serial), "payload": "x" * size}
        if self.group:
            return {
                "apiVersion": self.api_version,
                "kind": self.kind,
                "metadata": metadata,
                "spec": content,
            }
        return {"apiVersion": "v1", "kind": self.kind, "metadata": metadata, "data": content}

    def touch(self, serial: int) -> dict[str, Any]:
        return {"spec" if self.group else "data": {"serial": str(serial)}}


CONFIGMAPS = Resource(
    name="configmaps", group="", version="v1", plural="configmaps", kind="ConfigMap"
)
WIDGETS = Resource(
    name="widgets", group="example.com", version="v1", plural="widgets", kind="Widget"
)
RESOURCES = (CONFIGMAPS, WIDGETS)


def _item(obj: Mapping[str, Any], *, labels: bool) -> Item:
    metadata = obj.get("metadata") or {}
    return Item(
        namespace=str(metadata.get("namespace", "")),
        name=str(metadata["name"]),
        rv=int(metadata["resourceVersion"]),
        labels=dict(metadata.get("labels") or {}) if labels else {},
    )


# ============================================================================ options


@dataclass(frozen=True, kw_only=True)
class Options:
    directory: Path
    minutes: float = 10.0
    seed: int = 1
    rate: float = 200.0
    plane_dir: Path | None = None
    namespaces: int = 4
    population: int = 150
    """Objects per resource the traffic keeps alive (about)."""
    payload: int = 512
    """Bytes of data per object."""
    outage: float = 30.0
    gap: tuple[float, float] = (1.0, 5.0)
    """Seconds between faults (uniform)."""
    retention_events: int = 2000
    away_limit: float = 240.0
    """Longest a ``client-away`` waits for warmwatch's log to drop its RV."""
    min_faults: int = 0
    """Go on with quick faults after ``minutes`` until this many were injected."""
    go_clients: bool = True
    settle: float = 180.0
    """Longest wait, once traffic stopped, for every client to equal the apiserver."""
    idle_timeout: float = 8.0
    """warmwatch's ``--upstream-idle-timeout`` (its default, 120 s, is for production)."""
    blackhole: tuple[float, float] = (15.0, 25.0)
    """Seconds a ``blackhole`` holds (uniform): longer than ``idle_timeout``."""
    recovery_limit: float = 120.0
    """Longest wait for every shape of warmwatch to be current again after a blackhole."""

    @property
    def namespace_names(self) -> list[str]:
        return [f"faults-{index}" for index in range(self.namespaces)]


# ============================================================================ traffic


class Traffic:
    """Writes to the apiserver at ``rate`` per second until stopped: creates (names are reused
    after deletion), content updates, label changes, deletes. Failures (the apiserver is down)
    are counted and slow it down; what etcd applied is the reference's business, not ours."""

    CONCURRENCY = 48

    def __init__(self, *, api: kubeapi.RawClient, options: Options, rng: random.Random) -> None:
        self.api = api
        self.options = options
        self.rng = rng
        self.namespaces = options.namespace_names
        self.pool = max(4, int(options.population * 1.2 / len(self.namespaces)))
        self.live: set[tuple[str, str, str]] = set()
        self.busy: set[tuple[str, str, str]] = set()
        self.serial = 0
        self.ops: Counter[str] = Counter()

    async def seed(self) -> None:
        """Learn what exists already (a reused control plane)."""
        for resource in RESOURCES:
            for namespace in self.namespaces:
                body = await self.api.get(resource.collection(namespace))
                for obj in body.get("items") or []:
                    self.live.add((resource.name, namespace, obj["metadata"]["name"]))

    def _labels(self) -> dict[str, str]:
        labels = {"shard": str(self.rng.randrange(2))}
        tier = self.rng.choice(TIERS)
        if tier is not None:
            labels["tier"] = tier
        return labels

    async def run(self, stop: asyncio.Event) -> None:
        tick = 0.05
        carry = 0.0
        limit = asyncio.Semaphore(self.CONCURRENCY)
        tasks: set[asyncio.Task[None]] = set()
        while not stop.is_set():
            started = time.monotonic()
            carry += self.options.rate * tick
            while carry >= 1 and not limit.locked():
                carry -= 1
                await limit.acquire()
                task = asyncio.create_task(self._one())
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                task.add_done_callback(lambda _: limit.release())
            carry = min(carry, self.options.rate)  # do not burst after an outage
            await asyncio.sleep(max(0.0, tick - (time.monotonic() - started)))
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _one(self) -> None:
        resource = self.rng.choice(RESOURCES)
        namespace = self.rng.choice(self.namespaces)
        name = f"{resource.name[:2]}-{self.rng.randrange(self.pool):04d}"
        key = (resource.name, namespace, name)
        if key in self.busy:
            return
        self.busy.add(key)
        self.serial += 1
        serial = self.serial
        path = resource.collection(namespace)
        try:
            async with asyncio.timeout(15):
                if key not in self.live:
                    op = "create"
                    body = resource.body(
                        namespace=namespace,
                        name=name,
                        labels=self._labels(),
                        serial=serial,
                        size=self.options.payload,
                    )
                    await self.api.request("POST", path, body=body, ok=(200, 201, 409))
                    self.live.add(key)
                else:
                    choice = self.rng.random()
                    if choice < 0.2:
                        op = "delete"
                        await self.api.request("DELETE", f"{path}/{name}", ok=(200, 202, 404))
                        self.live.discard(key)
                    else:
                        op = "relabel" if choice < 0.5 else "update"
                        patch = resource.touch(serial)
                        if op == "relabel":
                            labels: dict[str, Any] = {"tier": self.rng.choice(TIERS)}
                            if self.rng.random() < 0.3:
                                labels["shard"] = str(self.rng.randrange(2))
                            patch["metadata"] = {"labels": labels}
                        answer = await self.api.request(
                            "PATCH",
                            f"{path}/{name}",
                            body=patch,
                            content_type="application/merge-patch+json",
                            ok=(200, 404),
                        )
                        if answer.get("kind") == "Status":
                            self.live.discard(key)
            self.ops[op] += 1
        except (kubeapi.ApiError, aiohttp.ClientError, OSError, TimeoutError):
            self.ops["failed"] += 1
            await asyncio.sleep(0.5)  # the apiserver is away: keep the pressure down
        finally:
            self.busy.discard(key)


# ============================================================================ raw clients


@dataclass(frozen=True, kw_only=True)
class ClientSpec:
    name: str
    resource: Resource
    namespace: str | None = None
    label_selector: str = ""
    bookmarks: bool = True
    watch_list: bool = False
    timeout: tuple[int, int] = (30, 90)
    """``timeoutSeconds`` of each watch, uniform (client-go: 300-600)."""
    slow: bool = False


class Retry(Exception):
    """An answer to retry after a pause (warmwatch starting, 503, 504, 429...)."""


def _small_receive_buffer(addr_info: Any) -> socket.socket:
    """A socket with a tiny receive window, so a reader that stops reading fills warmwatch's
    buffers in seconds and hits its write timeout."""
    family, kind, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=kind, proto=proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return sock


class WatchClient:
    """A raw watcher that behaves like client-go's reflector and records what it observes."""

    def __init__(self, *, spec: ClientSpec, base_url: str, rng: random.Random) -> None:
        self.spec = spec
        self.base_url = base_url
        self.rng = rng
        self.selector = LabelSelector.parse(spec.label_selector)
        self.observations: list[Observation] = []
        self.state: dict[Key, int] = {}
        self.rv: str | None = None
        self.need_list = True
        self.after_expired = False
        self.expired = 0
        self.lists = 0
        self.cutoffs = 0
        self.stalls = 0
        self.errors: Counter[str] = Counter()
        self.final_phase = False
        self.synced = asyncio.Event()
        self._present = asyncio.Event()
        self._present.set()
        self._step_task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    # -- control -----------------------------------------------------------------------------

    async def leave(self) -> None:
        """Disconnect now and stay away until :meth:`come_back`."""
        self._present.clear()
        task = self._step_task
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def come_back(self) -> None:
        self._present.set()

    def expected(self, final: Iterable[Item]) -> dict[Key, int]:
        namespace = self.spec.namespace
        return {
            item.key: item.rv
            for item in final
            if (namespace is None or item.namespace == namespace)
            and self.selector.matches(item.labels)
        }

    def converged(self, final: Iterable[Item]) -> bool:
        return not self.need_list and self.state == self.expected(final)

    def log(self) -> ClientLog:
        return ClientLog(
            name=self.spec.name,
            observations=list(self.observations),
            namespace=self.spec.namespace,
            label_selector=self.spec.label_selector,
            shape=self.spec.resource.flag,
        )

    # -- the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Until cancelled."""
        connector = aiohttp.TCPConnector(
            limit=4, socket_factory=_small_receive_buffer if self.spec.slow else None
        )
        async with aiohttp.ClientSession(
            connector=connector,
            read_bufsize=16384 if self.spec.slow else 2**18,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
            headers={"Accept": "application/json"},
        ) as session:
            self._session = session
            delay = 0.1
            while True:
                await self._present.wait()
                started = time.monotonic()
                task = asyncio.create_task(self._step())
                self._step_task = task
                try:
                    await asyncio.wait({task})
                except asyncio.CancelledError:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    raise
                finally:
                    self._step_task = None
                if task.cancelled():
                    continue  # told to leave
                error = task.exception()
                if error is None:
                    delay = 0.1
                    if time.monotonic() - started < 0.2:
                        await asyncio.sleep(0.1)
                    continue
                if not isinstance(error, (aiohttp.ClientError, OSError, TimeoutError, Retry)):
                    raise error
                self.errors[type(error).__name__] += 1
                await asyncio.sleep(delay * self.rng.uniform(0.5, 1.5))
                delay = min(delay * 2, 2.0)

    async def _step(self) -> None:
        if self.need_list:
            if self.spec.watch_list:
                await self._watch(None)
                return
            await self._list()
        await self._watch(self.rv)

    @property
    def _url(self) -> str:
        return self.base_url + self.spec.resource.collection(self.spec.namespace)

    def _params(self, **params: str) -> dict[str, str]:
        if self.spec.label_selector:
            params["labelSelector"] = self.spec.label_selector
        return params

    async def _list(self) -> None:
        assert self._session is not None
        params = self._params(limit="500")
        if not self.after_expired:
            params["resourceVersion"] = "0"  # client-go's first list; after 410 a quorum list
        items: list[Item] = []
        rv = ""
        async with asyncio.timeout(60):
            while True:
                async with self._session.get(self._url, params=params) as response:
                    if response.status != 200:
                        raise Retry(f"LIST answered {response.status}")
                    body = orjson.loads(await response.read())
                metadata = body.get("metadata") or {}
                rv = rv or str(metadata["resourceVersion"])
                items += [_item(obj, labels=False) for obj in body.get("items") or []]
                token = metadata.get("continue")
                if not token:
                    break
                params = self._params(limit="500", **{"continue": token})
        self.observations.append(Listed(rv=int(rv), items=items))
        self.state = {item.key: item.rv for item in items}
        self._synced(rv)

    def _synced(self, rv: str) -> None:
        self.rv = rv
        self.need_list = self.after_expired = False
        self.lists += 1
        self.synced.set()

    def _expired(self) -> None:
        self.observations.append(Expired())
        self.expired += 1
        self.need_list = self.after_expired = True

    async def _watch(self, rv: str | None) -> None:
        assert self._session is not None
        params = self._params(watch="1", timeoutSeconds=str(self.rng.randint(*self.spec.timeout)))
        if self.spec.bookmarks or rv is None:
            params["allowWatchBookmarks"] = "true"
        if rv is None:  # WatchList: the state as initial events, then the bookmark that ends them
            params |= {"sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan"}
        else:
            params["resourceVersion"] = rv
        async with self._session.get(self._url, params=params) as response:
            if response.status == 410:
                self._expired()
                return
            if response.status != 200:
                raise Retry(f"WATCH answered {response.status}")
            self.observations.append(WatchStarted(rv=None if rv is None else int(rv)))
            ended = False
            try:
                ended = await self._follow(response, initial={} if rv is None else None)
            finally:
                if not ended:
                    self.observations.append(StreamEnded())

    async def _follow(
        self, response: aiohttp.ClientResponse, *, initial: dict[Key, int] | None
    ) -> bool:
        """Read one watch stream; True when it ended with 410 (recorded as Expired)."""
        async for line in self._lines(response):
            event = orjson.loads(line)
            kind = event.get("type")
            obj = event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    self._expired()
                    return True
                self.errors[f"ERROR {obj.get('code')} {obj.get('reason')}"] += 1
                return False
            metadata = obj.get("metadata") or {}
            rv_text = str(metadata["resourceVersion"])
            rv = int(rv_text)
            if kind == "BOOKMARK":
                end = (metadata.get("annotations") or {}).get(INITIAL_EVENTS_END) == "true"
                self.observations.append(Bookmarked(rv=rv, initial_events_end=end))
                if initial is None:
                    self.rv = rv_text
                elif end:
                    self.state = initial
                    initial = None
                    self._synced(rv_text)
                continue
            key = (str(metadata.get("namespace", "")), str(metadata["name"]))
            self.observations.append(
                Received(type=EventType(kind), namespace=key[0], name=key[1], rv=rv)
            )
            if initial is not None:
                initial[key] = rv
                continue
            if kind == "DELETED":
                self.state.pop(key, None)
            else:
                self.state[key] = rv
            self.rv = rv_text
        return False

    async def _lines(self, response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        if not self.spec.slow:
            async for line in response.content:
                if line.strip():
                    yield line
            return
        # The slow reader: reads for a while, then stops reading for longer than warmwatch's
        # write timeout. warmwatch cuts it off; it resumes from its last RV.
        next_stall = time.monotonic() + self.rng.uniform(3, 8)
        stalled = False
        try:
            while True:
                if not self.final_phase and time.monotonic() >= next_stall:
                    self.stalls += 1
                    stalled = True
                    await asyncio.sleep(WRITE_TIMEOUT + self.rng.uniform(8, 14))
                    next_stall = time.monotonic() + self.rng.uniform(3, 8)
                line = await response.content.readline()
                if not line:
                    return
                if line.strip():
                    yield line
        except (aiohttp.ClientError, OSError):
            if stalled:
                self.cutoffs += 1
            raise


def client_specs(namespaces: Sequence[str]) -> list[ClientSpec]:
    cm, wi = CONFIGMAPS, WIDGETS
    return [
        ClientSpec(name="cm-all", resource=cm),
        ClientSpec(name="cm-all-nobookmarks", resource=cm, bookmarks=False, timeout=(15, 45)),
        ClientSpec(name="cm-gold", resource=cm, label_selector="tier=gold"),
        ClientSpec(
            name="cm-gold-silver-nobookmarks",
            resource=cm,
            label_selector="tier in (gold,silver)",
            bookmarks=False,
        ),
        ClientSpec(name="cm-watchlist", resource=cm, watch_list=True),
        ClientSpec(name=f"cm-{namespaces[1]}", resource=cm, namespace=namespaces[1]),
        ClientSpec(name="cm-slow", resource=cm, slow=True, timeout=(60, 120)),
        ClientSpec(name="wi-all", resource=wi),
        ClientSpec(
            name="wi-notbronze-shard1-nobookmarks",
            resource=wi,
            label_selector="tier!=bronze,shard=1",
            bookmarks=False,
        ),
        ClientSpec(
            name="wi-watchlist-gold-bronze",
            resource=wi,
            watch_list=True,
            label_selector="tier in (gold,bronze)",
        ),
        ClientSpec(
            name=f"wi-{namespaces[2]}-nobookmarks",
            resource=wi,
            namespace=namespaces[2],
            bookmarks=False,
        ),
    ]


# ============================================================================ Go informers


class GoInformer:
    """One Go informer program for one resource; its stdout and klog output in one stream."""

    def __init__(
        self,
        *,
        binary: Path,
        kubeconfig: Path,
        resource: Resource,
        watch_list: bool,
        log: Path,
        protobuf: bool = False,
    ) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig
        self.resource = resource
        self.watch_list = watch_list
        self.protobuf = protobuf
        """A typed informer in protobuf (kube-controller-manager's kind), served by warmwatch's
        protobuf shape; otherwise a dynamic informer in JSON."""
        self.log_path = log
        encoding = "protobuf-" if protobuf else ""
        self.name = f"go-{resource.name}-{encoding}{'watchlist' if watch_list else 'list'}"
        self.shape = f"{resource.flag};protobuf" if protobuf else resource.flag
        """The identity of the warmwatch shape that serves it."""
        self.records: list[dict[str, Any]] = []
        self.condition = threading.Condition()
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        env = dict(os.environ)
        env["KUBE_FEATURE_WatchListClient"] = "true" if self.watch_list else "false"
        self.process = subprocess.Popen(
            [
                str(self.binary),
                f"--kubeconfig={self.kubeconfig}",
                f"--resource={self.resource.flag}",
                *(["--mode=typed", "--protobuf"] if self.protobuf else []),
                "-v=3",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        threading.Thread(target=self._read, daemon=True, name=self.name).start()

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        with self.log_path.open("a") as log:
            for raw in self.process.stdout:
                log.write(raw)
                line = raw.strip()
                record: dict[str, Any] | None = None
                if line.startswith("{"):
                    with contextlib.suppress(ValueError):
                        record = json.loads(line)
                elif "Listing and watching" in line:
                    record = {"kind": "list-marker"}
                if record is not None:
                    with self.condition:
                        self.records.append(record)
                        self.condition.notify_all()
        with self.condition:
            self.condition.notify_all()

    def synced(self) -> bool:
        with self.condition:
            return any(record.get("kind") == "synced" for record in self.records)

    def digest(self, timeout: float = 10) -> list[Item] | None:
        """The informer's store now, or None (not synced, no answer in time)."""
        assert self.process is not None and self.process.stdin is not None
        if self.process.poll() is not None or not self.synced():
            return None
        with self.condition:
            seen = len(self.records)
        try:
            self.process.stdin.write("digest\n")
            self.process.stdin.flush()
        except OSError:
            return None
        deadline = time.monotonic() + timeout
        with self.condition:
            while True:
                for record in self.records[seen:]:
                    if record.get("kind") == "digest":
                        return [
                            Item(namespace=ns, name=name, rv=int(rv))
                            for ns, name, rv in record.get("items") or []
                        ]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self.condition.wait(remaining)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def check(self, relist_rvs: frozenset[int]) -> tuple[list[Violation], int, int]:
        """(violations, events checked, relists) of the event lines, see the module doc."""
        violations: list[Violation] = []
        store: dict[Key, int] = {}
        high: int | None = None
        lists = events = 0
        with self.condition:
            records = list(self.records)

        def report(rule: Rule, key: Key, detail: str, rvs: tuple[int, ...]) -> None:
            violations.append(
                Violation(rule=rule, client=self.name, detail=detail, key="/".join(key), rvs=rvs)
            )

        for record in records:
            if record.get("kind") == "list-marker":
                lists += 1
                continue
            if record.get("kind") != "event":
                continue
            events += 1
            key = (str(record["namespace"]), str(record["name"]))
            rv = int(record["rv"])
            kind = str(record["type"])
            if record.get("initial"):
                store[key] = rv
                continue
            previous = store.get(key)
            replay = bool(record.get("tombstone")) or (kind == "MODIFIED" and previous == rv)
            what = f"{kind} {'/'.join(key)}@{rv}"
            if previous is not None and rv < previous:
                report(
                    Rule.NO_TIME_TRAVEL,
                    key,
                    f"{what} after the object's RV {previous}",
                    (rv, previous),
                )
            elif previous is not None and rv == previous and not replay:
                report(Rule.UNIQUE, key, f"{what} received twice", (rv,))
            elif (
                not replay
                and lists <= 1
                and high is not None
                and (rv < high or (rv == high and not (kind == "DELETED" and rv in relist_rvs)))
            ):
                report(Rule.ORDERED, key, f"{what} after an event at RV {high}", (rv, high))
            if not replay:
                high = rv if high is None else max(high, rv)
            if kind == "DELETED":
                store.pop(key, None)
            else:
                store[key] = rv
        return violations, events, max(0, lists - 1)


# ============================================================================ warmwatch's database


class CacheLog:
    """Reads warmwatch's SQLite file (read-only, short statements) while it runs: relists and
    where each shape's event log starts."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.relists: dict[tuple[str, int], int | None] = {}
        self.log_start: dict[str, int | None] = {}

    def poll(self) -> None:
        if not self.db.exists():
            return
        try:
            connection = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=2)
        except sqlite3.Error:
            return
        try:
            shapes = {
                shape_id: (key, start)
                for shape_id, key, start in connection.execute(
                    "SELECT id, key, log_start_rv FROM shapes"
                ).fetchall()
            }
            for key, start in shapes.values():
                self.log_start[key] = int(start) if start is not None and start.isdigit() else None
            rows = connection.execute(
                "SELECT shape_id, seq, rv FROM events WHERE batch = 1 AND type = 'BOOKMARK'"
            ).fetchall()
            for shape_id, seq, rv in rows:
                if shape_id not in shapes or (shapes[shape_id][0], int(rv)) in self.relists:
                    continue
                before = connection.execute(
                    "SELECT rv FROM events WHERE shape_id = ? AND seq < ? "
                    "AND (batch = 0 OR type = 'BOOKMARK') ORDER BY seq DESC LIMIT 1",
                    (shape_id, seq),
                ).fetchone()
                reached = int(before[0]) if before is not None else None
                self.relists[(shapes[shape_id][0], int(rv))] = reached
        except sqlite3.Error:
            pass
        finally:
            connection.close()

    def shape_rvs(self) -> dict[str, int | None]:
        """Each shape's current RV (``shapes.rv``, None before its first list), read now."""
        if not self.db.exists():
            return {}
        try:
            connection = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=2)
        except sqlite3.Error:
            return {}
        try:
            rows = connection.execute("SELECT key, rv FROM shapes").fetchall()
        except sqlite3.Error:
            return {}
        finally:
            connection.close()
        return {
            str(key): int(rv) if rv is not None and str(rv).isdigit() else None for key, rv in rows
        }

    def relists_of(self, shape: str) -> list[UpstreamRelist]:
        return [
            UpstreamRelist(rv=rv, reached=reached, shape=key)
            for (key, rv), reached in sorted(self.relists.items())
            if key == shape
        ]

    async def follow(self) -> None:
        while True:
            await asyncio.to_thread(self.poll)
            await asyncio.sleep(1.0)


# ============================================================================ faults


class Injector:
    """Injects the faults at seeded random moments and counts them."""

    def __init__(
        self,
        *,
        options: Options,
        plane: ControlPlane,
        sidecar: Sidecar,
        histories: Sequence[EtcdHistory],
        cache: CacheLog,
        clients: Sequence[WatchClient],
        rng: random.Random,
        link: toxiproxy.Proxy,
        shapes: Sequence[str],
    ) -> None:
        self.options = options
        self.plane = plane
        self.sidecar = sidecar
        self.histories = histories
        self.cache = cache
        self.clients = clients
        self.rng = rng
        self.link = link
        """The toxiproxy proxy warmwatch's upstream connections go through."""
        self.shapes = shapes
        """warmwatch's configured shapes (``--resource`` values, the keys of its database)."""
        self.counts: Counter[str] = Counter()
        """Faults injected and completed, by kind (a client-away counts once it got 410)."""
        self.injected = 0
        self.sidecar_expected = True
        self.notes: list[str] = []
        self.failures: list[str] = []
        """Faults whose expected reaction did not happen (a blackhole warmwatch did not notice
        or did not recover from): they fail the run like a violation."""
        self.blackholes: list[dict[str, Any]] = []
        """Each blackhole's timeline, warmwatch's log lines and metric deltas."""

    # -- building blocks ---------------------------------------------------------------------

    async def _kill_sidecar(self) -> None:
        self.sidecar_expected = False
        await asyncio.to_thread(self.sidecar.kill)

    async def _start_sidecar(self) -> None:
        started = time.monotonic()
        await asyncio.to_thread(self.sidecar.restart)
        self.sidecar_expected = True
        say(f"  warmwatch ready again in {time.monotonic() - started:.1f}s")

    async def _stop_apiserver(self, *, graceful: bool) -> None:
        """Stop the apiserver: gracefully (SIGTERM, which under load often runs into
        ``loadtest.cluster``'s 15 s grace and SIGKILL), or as a crash (SIGKILL first)."""
        if not graceful:
            pid = self.plane.state().pids.get("kube-apiserver")
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        await asyncio.to_thread(self.plane.stop_apiserver)  # reaps it, stops its companions

    async def _start_apiserver(self) -> None:
        started = time.monotonic()
        await asyncio.to_thread(self.plane.start_apiserver)
        say(f"  apiserver ready again in {time.monotonic() - started:.1f}s")

    def sidecar_died(self) -> int | None:
        """The exit code if warmwatch exited without being told to."""
        code = self.sidecar.process.poll()
        return code if self.sidecar_expected and code is not None else None

    # -- the faults --------------------------------------------------------------------------

    async def kill9(self) -> None:
        await self._kill_sidecar()
        await asyncio.sleep(self.rng.uniform(0.0, 2.0))
        await self._start_sidecar()

    async def apiserver_restart(self, *, graceful: bool | None = None) -> None:
        if graceful is None:
            graceful = self.rng.random() < 1 / 3
        say(f"  {'SIGTERM' if graceful else 'SIGKILL'} to the apiserver")
        await self._stop_apiserver(graceful=graceful)
        await asyncio.sleep(self.rng.uniform(1.0, 4.0))
        await self._start_apiserver()

    async def upstream_outage(self) -> None:
        started = time.monotonic()
        await self._stop_apiserver(graceful=False)
        await asyncio.sleep(self.options.outage * self.rng.uniform(0.3, 0.5))
        say("  kill -9 of warmwatch while the apiserver is down: it must start from its cache")
        await self._kill_sidecar()
        await asyncio.sleep(self.rng.uniform(0.0, 1.0))
        await self._start_sidecar()
        await asyncio.sleep(max(0.0, self.options.outage - (time.monotonic() - started)))
        await self._start_apiserver()

    async def compaction(self) -> None:
        await self._kill_sidecar()
        await asyncio.sleep(self.rng.uniform(2.0, 4.0))  # traffic goes on without warmwatch
        target = await current_revision(self.plane.etcd_endpoint)
        deadline = time.monotonic() + 30
        while min(h.revision for h in self.histories) < target and time.monotonic() < deadline:  # noqa: ASYNC110 - the recorders' progress is polled
            await asyncio.sleep(0.2)
        revision = min(h.revision for h in self.histories)  # never beyond what the reference read
        await compact(self.plane.etcd_endpoint, revision=revision)
        say(f"  etcd compacted to revision {revision} (current was {target})")
        # The apiserver's watch cache would serve warmwatch's resume from memory whatever etcd
        # compacted (module doc); restarted, it starts after the compaction.
        await self._stop_apiserver(graceful=False)
        await asyncio.sleep(self.rng.uniform(0.5, 2.0))
        await self._start_apiserver()
        await self._start_sidecar()

    async def client_away(self, candidates: Sequence[WatchClient]) -> bool:
        """Keep one of ``candidates`` away until warmwatch's log no longer holds its RV; True
        if it then got 410 (and relisted)."""
        for client in self.rng.sample(list(candidates), len(candidates)):
            await client.leave()
            if client.rv is not None and not client.need_list:
                break
            client.come_back()  # between a 410 and its relist: it has no RV to resume from
        else:
            self.notes.append("client-away: no client had an RV to resume from; not counted")
            return False
        rv = int(client.rv)
        shape = client.spec.resource.flag
        expired = client.expired
        say(f"  {client.name} away at RV {rv}")
        deadline = time.monotonic() + self.options.away_limit
        while time.monotonic() < deadline:
            start = self.cache.log_start.get(shape)
            if start is not None and start > rv:
                break
            await asyncio.sleep(1.0)
        else:
            client.come_back()
            self.notes.append(f"client-away: {shape}'s log still held RV {rv}; not counted")
            say(f"  {client.name}: the log still holds RV {rv} after {self.options.away_limit}s")
            return False
        say(
            f"  {client.name} back: {shape}'s log starts after RV {self.cache.log_start.get(shape)}"
        )
        client.come_back()
        deadline = time.monotonic() + 30
        while client.expired == expired and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.2)
        if client.expired == expired:
            self.notes.append(f"client-away: {client.name} resumed from RV {rv} without 410")
            return False
        return True

    async def _current(self, limit: float) -> tuple[float | None, int, dict[str, int | None]]:
        """Wait (at most ``limit``) until every shape's RV in warmwatch's database has reached
        etcd's revision as read now: (seconds it took or None, that revision, the RVs seen
        last)."""
        started = time.monotonic()
        revision = await current_revision(self.plane.etcd_endpoint)
        while True:
            rvs = await asyncio.to_thread(self.cache.shape_rvs)
            behind = {shape: rvs.get(shape) for shape in self.shapes}
            if all(rv is not None and rv >= revision for rv in behind.values()):
                return time.monotonic() - started, revision, behind
            if time.monotonic() - started > limit:
                return None, revision, behind
            await asyncio.sleep(0.5)

    def _upstream_metrics(self) -> dict[str, float]:
        metric = self.sidecar.metric
        values = {
            "watch_errors": metric(
                "warmwatch_upstream_requests_total", {"verb": "WATCH", "code": "error"}
            ),
            "list_errors": metric(
                "warmwatch_upstream_requests_total", {"verb": "LIST", "code": "error"}
            ),
        }
        for resource in RESOURCES:
            for reason in ("error", "idle"):
                values[f"watch_restarts_{reason} {resource.flag}"] = metric(
                    "warmwatch_upstream_watch_restarts_total",
                    {"resource": resource.flag, "reason": reason},
                )
        return values

    RETRYING = re.compile(r"proxy\.upstream\.reflecting: (\S+): (.*); retrying in ")

    def _retry_lines(self, offset: int) -> tuple[int, list[str]]:
        """warmwatch's reflector lines ``...; retrying in`` written after ``offset``."""
        with self.sidecar.log.open("rb") as log:
            log.seek(offset)
            data = log.read()
        complete = data.rfind(b"\n") + 1  # a line still being written is read next time
        lines = data[:complete].decode(errors="replace").splitlines()
        return offset + complete, [line for line in lines if self.RETRYING.search(line)]

    async def blackhole(self) -> None:
        """Blackhole warmwatch's upstream for longer than its idle timeout (module doc)."""
        options = self.options
        record: dict[str, Any] = {}
        self.blackholes.append(record)
        ready, _, rvs = await self._current(60.0)
        if ready is None:
            self.notes.append(f"blackhole: a shape of warmwatch was not current before: {rvs}")
            say(f"  warmwatch not current before the blackhole: {rvs}")
        record["current_before_s"] = None if ready is None else round(ready, 1)
        before = await asyncio.to_thread(self._upstream_metrics)
        offset = self.sidecar.log.stat().st_size
        hold = self.rng.uniform(*options.blackhole)
        toxics: list[toxiproxy.Toxic] = []
        started = time.monotonic()
        first: dict[str, float] = {}
        lines: list[str] = []
        try:
            for stream in ("downstream", "upstream"):
                toxic = await asyncio.to_thread(self.link.add_timeout, 0, stream=stream)
                toxics.append(toxic)
            say(f"  upstream blackholed for {hold:.1f}s (idle timeout {options.idle_timeout:g}s)")
            while (elapsed := time.monotonic() - started) < hold:
                offset, found = await asyncio.to_thread(self._retry_lines, offset)
                for line in found:
                    match = self.RETRYING.search(line)
                    assert match is not None
                    if match.group(1) not in first:
                        first[match.group(1)] = round(elapsed, 1)
                        say(f"  after {elapsed:.1f}s: {line.strip()[:200]}")
                lines += found
                await asyncio.sleep(min(0.5, max(0.0, hold - elapsed)))
            offset, found = await asyncio.to_thread(self._retry_lines, offset)
            lines += found
            during = await asyncio.to_thread(self._upstream_metrics)  # before the removal
        finally:
            for toxic in toxics:
                await asyncio.to_thread(self.link.remove_toxic, toxic.name)
        held = time.monotonic() - started
        say(
            f"  blackhole removed after {held:.1f}s; {len(lines)} retrying lines in warmwatch's log"
        )
        recovered, revision, rvs = await self._current(options.recovery_limit)
        after = await asyncio.to_thread(self._upstream_metrics)
        delta = {name: after[name] - before[name] for name in before}
        record |= {
            "held_s": round(held, 1),
            "first_retry_s": first,
            "retry_lines": len(lines),
            "retry_examples": [line.strip()[:300] for line in lines[:4]],
            "during": {name: during[name] - before[name] for name in before},
            "metrics_delta": delta,
            "recovered_s": None if recovered is None else round(recovered, 1),
            "revision_at_removal": revision,
        }
        shapes_of = Counter(shape.split(";")[0] for shape in self.shapes)
        for resource in RESOURCES:
            during = record["during"]
            restarts = sum(
                during[f"watch_restarts_{reason} {resource.flag}"] for reason in ("error", "idle")
            )
            if restarts < shapes_of[resource.flag]:
                self.failures.append(
                    f"blackhole {len(self.blackholes)}: warmwatch did not notice for "
                    f"{resource.flag} within {held:.1f}s (watch restarts, silent or failed: "
                    f"{restarts:g} for {shapes_of[resource.flag]} shapes; retrying lines: "
                    f"{resource.flag in first})"
                )
        if recovered is None:
            self.failures.append(
                f"blackhole {len(self.blackholes)}: warmwatch not current {options.recovery_limit:g}s "
                f"after the toxics were removed (etcd revision {revision}, shapes {rvs})"
            )
            say(f"  warmwatch NOT current after {options.recovery_limit:g}s: {rvs}")
        else:
            say(f"  every shape of warmwatch current {recovered:.1f}s after the removal; {delta}")

    # -- the schedule ------------------------------------------------------------------------

    async def run(self, duration: float) -> None:
        rng = self.rng
        started = time.monotonic()
        deadline = started + duration
        aways = max(1, round(duration / 150))
        away_at = [started + duration * (index + 0.15) / aways for index in range(aways)]
        away_task: asyncio.Task[bool] | None = None
        candidates = [client for client in self.clients if not client.spec.slow]
        base = {
            "kill9": 4.0,
            "apiserver-restart": 2.0,
            "upstream-outage": 1.0,
            "compaction": 1.5,
            "blackhole": 1.5,
        }
        while time.monotonic() < deadline:
            if away_task is None or away_task.done():
                if away_task is not None:
                    if await away_task:
                        self.counts["client-away"] += 1
                    away_task = None
                if away_at and time.monotonic() >= away_at[0]:
                    away_at.pop(0)
                    self.injected += 1
                    say(f"fault {self.injected}: client-away")
                    away_task = asyncio.create_task(self.client_away(candidates))
            await asyncio.sleep(rng.uniform(*self.options.gap))
            if time.monotonic() >= deadline:
                break
            if away_task is not None and not away_task.done():
                # warmwatch must live on (it trims its log once a minute) and traffic must flow
                # (the log must move past the client's RV): only short apiserver restarts.
                if rng.random() < 0.25:
                    await self.inject("apiserver-restart", graceful=False)
                else:
                    await asyncio.sleep(rng.uniform(3.0, 8.0))
                continue
            kinds = list(base)
            weights = [base[kind] / (1 + 4 * self.counts[kind]) for kind in kinds]
            await self.inject(rng.choices(kinds, weights)[0])
        if away_task is not None and await away_task:
            self.counts["client-away"] += 1
        # Every kind at least once, then at least ``min_faults`` in all, however slow the
        # machine: quick ones, bounded.
        extra = time.monotonic() + 180
        for kind in base:
            if not self.counts[kind] and time.monotonic() < extra:
                await asyncio.sleep(rng.uniform(*self.options.gap))
                await self.inject(kind)
        while sum(self.counts.values()) < self.options.min_faults and time.monotonic() < extra:
            await asyncio.sleep(rng.uniform(*self.options.gap))
            kind = rng.choice(("kill9", "apiserver-restart"))
            await self.inject(kind, graceful=False)

    async def inject(self, kind: str, *, graceful: bool | None = None) -> None:
        self.injected += 1
        say(f"fault {self.injected}: {kind}")
        started = time.monotonic()
        if kind == "kill9":
            await self.kill9()
        elif kind == "apiserver-restart":
            await self.apiserver_restart(graceful=graceful)
        elif kind == "upstream-outage":
            await self.upstream_outage()
        elif kind == "compaction":
            await self.compaction()
        elif kind == "blackhole":
            await self.blackhole()
        else:
            raise ValueError(kind)
        self.counts[kind] += 1
        say(f"  {kind} done in {time.monotonic() - started:.1f}s")


# ============================================================================ the run


def _combine(
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
        return [_item(obj, labels=True) for obj in body.get("items") or []]

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
        report = _combine(reports, go_violations, go_events, faults)
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


# ============================================================================ command line


def recheck(directory: Path) -> Report:
    """The recorded runs of ``directory`` checked again (without the Go ordering checks,
    which need the Go programs' output)."""
    runs = [read_run(path) for path in sorted(directory.glob("run-*.jsonl"))]
    if not runs:
        raise SystemExit(f"no run-*.jsonl in {directory}")
    return _combine([check_run(run) for run in runs], [], 0, runs[0].faults)


def _gap(text: str) -> tuple[float, float]:
    low, _, high = text.partition(",")
    return float(low), float(high or low)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.faults",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--minutes", type=float, default=10.0, help="traffic and faults (default 10)"
    )
    parser.add_argument("--dir", type=Path, default=Path("/tmp/warmwatch-faults"))
    parser.add_argument("--seed", type=int, default=None, help="default: random (printed)")
    parser.add_argument("--rate", type=float, default=200.0, help="writes per second (default 200)")
    parser.add_argument("--plane-dir", type=Path, default=None, help="reuse this control plane")
    parser.add_argument("--outage", type=float, default=30.0, help="upstream outage seconds")
    parser.add_argument(
        "--gap", type=_gap, default=(1.0, 5.0), help="MIN,MAX seconds between faults"
    )
    parser.add_argument("--population", type=int, default=150, help="live objects per resource")
    parser.add_argument("--retention-events", type=int, default=2000)
    parser.add_argument(
        "--min-faults",
        type=int,
        default=0,
        help="inject quick faults after --minutes until this many",
    )
    parser.add_argument("--no-go", action="store_true", help="without the Go informers")
    parser.add_argument(
        "--recheck", type=Path, default=None, metavar="DIR", help="check DIR's runs again"
    )
    args = parser.parse_args(argv)
    failures: list[str] = []
    if args.recheck is not None:
        report = recheck(args.recheck)
    else:
        seed = args.seed if args.seed is not None else random.randrange(1 << 30)
        options = Options(
            directory=args.dir,
            minutes=args.minutes,
            seed=seed,
            rate=args.rate,
            plane_dir=args.plane_dir,
            outage=args.outage,
            gap=args.gap,
            population=args.population,
            retention_events=args.retention_events,
            min_faults=args.min_faults,
            go_clients=not args.no_go,
        )
        say(f"seed {seed}, directory {options.directory}")
        report, summary = asyncio.run(Driver(options).run())
        (options.directory / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        say(f"summary: {json.dumps(summary)}")
        failures = summary["fault_failures"]
    for line in report.details():
        print(line)
    for failure in failures:
        print(f"fault failure: {failure}")
    print(report.summary_line(), flush=True)
    return 0 if report.ok and not failures else 1


if __name__ == "__main__":
    sys.exit(main())
