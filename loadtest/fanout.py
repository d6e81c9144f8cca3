"""Watch fan-out: how fast, and how late, warmwatch delivers upstream writes to many watchers.

    python -m loadtest.fanout --dir /tmp/warmwatch-fanout [--watchers 100] [--seconds 60] \\
        [--selector-watchers 20] [--direct 5] [--writers 32] [--size 256] \\
        [--out FILE] [--keep]

One run, side by side, on a control plane of its own (loadtest/cluster.py, in DIR/cp; its
kube-controller-manager is paused, so nothing else watches) and a warmwatch configured with
``--resource v1/configmaps@fanout`` (loadtest/sidecar.py; database and log ``DIR/fanout.*``):

- W watchers through warmwatch (--watchers; --selector-watchers of them with label selectors
  that objects enter and leave as their ``tier`` label changes, the others unfiltered) and
  --direct unfiltered watchers on the apiserver, the reference (TLS, the admin client
  certificate). Each is one streaming watch (JSON, ``allowWatchBookmarks``, its own HTTP/1.1
  connection), open before the writes start. The clients are a Go program,
  loadtest/fanoutwatch (built and cached like tests/goclient): one process runs the warmwatch
  watchers and another the direct ones, so the light reference is not slowed by the heavy
  one, each watch a goroutine. Python clients parsing ~46,000 events/s were themselves the
  bottleneck: events waited in their sockets, which counted as warmwatch's lag, and their CPU
  was taken from warmwatch. Each read from a socket is stamped with CLOCK_MONOTONIC (the
  clock of ``time.monotonic()``, system-wide on Linux, so comparable across processes) and
  every event whose line it completes is recorded as (resourceVersion, receive time); of each
  line only ``type`` and ``object.metadata.resourceVersion`` are read. A watch that ends
  early is resumed from its last RV (event or bookmark) like a client would, and counted.
- For --seconds, --writers concurrent writers create and update ConfigMaps of ~--size bytes in
  the namespace as fast as the apiserver takes them: 20 % creates, 80 % merge patches of a
  random existing object that set a random ``tier`` (a-d) and a new ``data.seq``, so every
  write is an event. Each write's resourceVersion and completion time are kept.
- Added lag per event = its receive time on a warmwatch watcher minus the earliest receive
  time of the same resourceVersion (every write has its own) on a direct watcher; p50 / p99 /
  max over all events of all warmwatch watchers, over 10-second windows of the run (does it
  grow?), and the absolute lag from the write's completion (the writer's answer; it can come
  after the apiserver's watch event, so it can be negative) for both paths. Completeness:
  each warmwatch watcher's events against what it should have got (every write, or the writes
  that entered, stayed in or left its selector).
- warmwatch's own figures: ``warmwatch_events_in_total`` and ``warmwatch_events_out_total``
  over the write window (events/s), its CPU seconds (utime+stime from /proc/PID/stat) per
  1,000 ingested events from the start of the writes until the watchers have drained, its
  RSS (idle, with watchers, after), its delivery-lag histogram (commit to write), watchers
  open, passthrough requests, and warnings/errors in its log.

Prints ONE markdown table (the run's parameters and the load average during it included) to
stdout and to --out FILE; progress goes to stderr. Nothing is asserted: a measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, cast

import aiohttp

from loadtest import goclient, kubeapi, pki, processes
from loadtest.cluster import ControlPlane
from loadtest.sidecar import Sidecar

NAMESPACE = "fanout"
SHAPE = f"v1/configmaps@{NAMESPACE}"
PATH = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
TIERS = "abcd"
SELECTORS: dict[str, frozenset[str]] = {
    "tier=a": frozenset("a"),
    "tier in (a,b)": frozenset("ab"),
    "tier!=c": frozenset("abd"),
    "tier notin (a,b,c)": frozenset("d"),
}
"""The label selectors of the selector watchers, and the tiers each admits."""
CREATE_SHARE = 0.2
KNOWN_WARNING = "--client-auth none: every local caller"
"""The warning every harness-run warmwatch logs at start (loadtest/sidecar.py's choice)."""
WINDOW = 10.0
"""Seconds per window of the lag-over-time figures."""

CLIENT_SOURCE = Path(__file__).resolve().parent / "fanoutwatch"
CLIENT = "Go (loadtest/fanoutwatch)"
"""The watch clients, named in the table: which client measured matters for the figures."""


def _say(message: str) -> None:
    print(f"[fanout] {message}", file=sys.stderr, flush=True)


# -- watch clients (loadtest/fanoutwatch, one Go process per group) ---------------------------


def build_client() -> Path:
    """The watch client's binary, built once per content of loadtest/fanoutwatch."""
    return goclient.build(CLIENT_SOURCE, "fanoutwatch")


@dataclass(frozen=True, kw_only=True)
class GroupSpec:
    """One client process's watchers: where they watch, and each one's selector (None: all)."""

    name: str
    base_url: str
    tls: pki.Pki | None
    """The apiserver's CA and the admin client certificate; None for warmwatch (plain HTTP)."""
    selectors: list[str | None]
    timeout_seconds: int

    def argv(self, binary: Path, records: Path) -> list[str]:
        argv = [
            str(binary),
            f"--server={self.base_url}",
            f"--path={PATH}",
            f"--timeout-seconds={self.timeout_seconds}",
            f"--records={records}",
        ]
        if self.tls is not None:
            admin = self.tls.identity("admin")
            argv += [
                f"--ca={self.tls.ca_cert}",
                f"--cert={admin.certificate}",
                f"--key={admin.key}",
            ]
        return argv + [f"--watch={selector or ''}" for selector in self.selectors]


class WatcherLine(TypedDict):
    """fanoutwatch's account of one watcher (its "watcher" line); the events are in the
    records file."""

    kind: str
    selector: str
    events: int
    types: dict[str, int]
    lines: int
    bookmarks: int
    errors: list[str]
    ends: int
    last_rv: str


@dataclass(kw_only=True)
class Received:
    """What one watcher received: parallel arrays of resourceVersion and receive time."""

    group: str
    selector: str | None
    rvs: array[int] = field(default_factory=lambda: array("q"))
    times: array[float] = field(default_factory=lambda: array("d"))
    types: dict[str, int] = field(default_factory=dict)
    lines: int = 0
    bookmarks: int = 0
    errors: list[str] = field(default_factory=list)
    ends: int = 0
    """Streams that ended (or failed) before the run did; each was resumed."""
    last_rv: str = ""


def read_records(group: str, lines: Sequence[WatcherLine], data: bytes) -> list[Received]:
    """The watchers of ``lines`` with their events from the records file's ``data``: per
    watcher in order, its resourceVersions (int64), then their arrival times (float64), in the
    machine's byte order."""
    view = memoryview(data)
    records = []
    offset = 0
    for line in lines:
        size = line["events"] * 8
        rvs, times = array("q"), array("d")
        rvs.frombytes(view[offset : offset + size])
        times.frombytes(view[offset + size : offset + 2 * size])
        offset += 2 * size
        records.append(
            Received(
                group=group,
                selector=line["selector"] or None,
                rvs=rvs,
                times=times,
                types=line["types"],
                lines=line["lines"],
                bookmarks=line["bookmarks"],
                errors=line["errors"],
                ends=line["ends"],
                last_rv=line["last_rv"],
            )
        )
    if offset != len(data):
        raise ValueError(f"{group}: records file of {len(data)} bytes, {offset} expected")
    return records


@dataclass
class Group:
    spec: GroupSpec
    process: subprocess.Popen[str]
    records_file: Path
    ready: int = 0
    records: list[Received] = field(default_factory=list)
    cpu: float = 0.0
    run_wait: float = 0.0


def _line(group: Group) -> dict[str, Any]:
    assert group.process.stdout is not None
    text = group.process.stdout.readline()
    if not text:
        raise RuntimeError(
            f"watch group {group.spec.name}: fanoutwatch exited {group.process.wait()}"
        )
    line: dict[str, Any] = json.loads(text)
    return line


def start_groups(
    binary: Path,
    specs: Sequence[GroupSpec],
    directory: Path,
    *,
    cpus: Callable[[GroupSpec], set[int]] | None = None,
) -> list[Group]:
    """One fanoutwatch process per group (its complaints go to stderr with the progress);
    returns when each has its watches open, or has given up waiting for some (it waits 120 s).
    With ``cpus`` (--pod-cpus), each is told how many CPUs it will be placed on: Go sizes its
    scheduler (GOMAXPROCS) by the CPUs it sees at start, and two of its threads time-sliced
    on one CPU would delay the very reads it stamps."""
    groups = []
    for spec in specs:
        records = directory / f"watch-{spec.name}.records"
        env = None if cpus is None else {**os.environ, "GOMAXPROCS": str(len(cpus(spec)))}
        process = subprocess.Popen(
            spec.argv(binary, records),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        groups.append(Group(spec=spec, process=process, records_file=records))
    for group in groups:
        group.ready = _line(group)["open"]
        _say(f"{group.spec.name}: {group.ready} of {len(group.spec.selectors)} watches open")
    return groups


def stop_groups(groups: Sequence[Group]) -> None:
    """Close every group's watches, then collect each one's records and its CPU figures
    (read from /proc before the process exits: it waits for the end of its input)."""
    for group in groups:
        assert group.process.stdin is not None
        group.process.stdin.write("stop\n")
        group.process.stdin.flush()
    for group in groups:
        lines: list[WatcherLine] = []
        while (line := _line(group))["kind"] != "done":
            lines.append(cast(WatcherLine, line))
        group.records = read_records(group.spec.name, lines, group.records_file.read_bytes())
        group.records_file.unlink()
        group.cpu = processes.cpu_seconds(group.process.pid)
        group.run_wait = run_queue_wait(group.process.pid)
        assert group.process.stdin is not None
        group.process.stdin.close()
        try:
            group.process.wait(30)
        except subprocess.TimeoutExpired:
            processes.kill(group.process)


# -- writes -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Write:
    done: float
    name: str
    tier: str
    create: bool


@dataclass(kw_only=True)
class Writes:
    by_rv: dict[int, Write] = field(default_factory=dict)
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0
    load: list[float] = field(default_factory=list)
    """1-minute load average, sampled every 5 s during the writes."""
    rss: list[int] = field(default_factory=list)


async def write_for(
    plane: ControlPlane,
    *,
    seconds: float,
    writers: int,
    size: int,
    sidecar_pid: int,
) -> Writes:
    """Create and update ConfigMaps with --writers in flight for ``seconds``."""
    result = Writes()
    live: list[str] = []
    counter = 0
    rng = random.Random(42)
    async with kubeapi.RawClient(
        base_url=plane.server,
        concurrency=writers,
        ssl_context=kubeapi.client_ssl(plane.pki, identity="admin"),
    ) as api:

        async def writer(deadline: float) -> None:
            nonlocal counter
            while time.monotonic() < deadline:
                counter += 1
                seq, tier = counter, rng.choice(TIERS)
                create = not live or rng.random() < CREATE_SHARE
                try:
                    if create:
                        name = f"cm-{seq:07d}"
                        body = kubeapi.configmap(
                            name=name, namespace=NAMESPACE, size=size, labels={"tier": tier}
                        )
                        body["data"]["seq"] = str(seq)
                        obj = await api.create(PATH, body)
                        live.append(name)
                    else:
                        name = rng.choice(live)
                        obj = await api.merge_patch(
                            f"{PATH}/{name}",
                            {"metadata": {"labels": {"tier": tier}}, "data": {"seq": str(seq)}},
                        )
                except (kubeapi.ApiError, aiohttp.ClientError, OSError) as error:
                    result.errors += 1
                    if len(result.error_samples) < 5:
                        result.error_samples.append(repr(error)[:300])
                    await asyncio.sleep(0.1)
                    continue
                rv = int(obj["metadata"]["resourceVersion"])
                result.by_rv[rv] = Write(time.monotonic(), name, tier, create)

        async def sample(deadline: float) -> None:
            while time.monotonic() < deadline:
                result.load.append(os.getloadavg()[0])
                result.rss.append(processes.rss_bytes(sidecar_pid))
                await asyncio.sleep(5)

        result.started = time.monotonic()
        deadline = result.started + seconds
        await asyncio.gather(sample(deadline), *(writer(deadline) for _ in range(writers)))
        result.ended = time.monotonic()
    return result


# -- warmwatch's side -------------------------------------------------------------------------


def run_queue_wait(pid: int) -> float:
    """Seconds the threads of ``pid`` waited on a run queue (/proc/PID/task/*/schedstat)."""
    total = 0
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, IndexError, ValueError):
                total += int((task / "schedstat").read_text().split()[1])
    return total / 1e9


@dataclass(frozen=True, kw_only=True)
class Sample:
    at: float
    events_in: float
    events_out: float
    passthrough: float
    watchers: float
    cpu: float
    rss: int
    lag_buckets: dict[float, float]
    commit_buckets: dict[float, float]
    run_wait: float
    """Seconds its threads spent runnable but waiting for a CPU (schedstat): the machine's
    contention, as this process felt it."""


def parse_buckets(text: str, name: str) -> dict[float, float]:
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket{{"):
            series, _, value = line.rpartition(" ")
            le = re.search(r'le="([^"]+)"', series)
            if le:
                bound = math.inf if le.group(1) == "+Inf" else float(le.group(1))
                buckets[bound] = buckets.get(bound, 0.0) + float(value)
    return buckets


def metric_sum(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            total += float(line.rpartition(" ")[2])
    return total


def sample(sidecar: Sidecar) -> Sample:
    text = sidecar.metrics()
    return Sample(
        at=time.monotonic(),
        events_in=metric_sum(text, "warmwatch_events_in_total"),
        events_out=metric_sum(text, "warmwatch_events_out_total"),
        passthrough=metric_sum(text, "warmwatch_passthrough_requests_total"),
        watchers=metric_sum(text, "warmwatch_watchers"),
        cpu=processes.cpu_seconds(sidecar.process.pid),
        rss=sidecar.rss_bytes(),
        lag_buckets=parse_buckets(text, "warmwatch_event_delivery_lag_seconds"),
        commit_buckets=parse_buckets(text, "warmwatch_commit_duration_seconds"),
        run_wait=run_queue_wait(sidecar.process.pid),
    )


def drain(sidecar: Sidecar, *, quiet: float = 3.0, limit: float = 180.0) -> Sample:
    """Wait until warmwatch has written nothing more for ``quiet`` seconds (at most ``limit``)."""
    started = time.monotonic()
    last = sample(sidecar)
    still_since = last.at
    while time.monotonic() - started < limit:
        time.sleep(0.5)
        now = sample(sidecar)
        if now.events_out != last.events_out:
            still_since = now.at
            last = now
        elif now.at - still_since >= quiet:
            return last
    return sample(sidecar)


# -- figures ----------------------------------------------------------------------------------


def quantile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return math.nan
    index = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[index]


def ms(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value * 1000:.1f}"


def pcts(unsorted: Sequence[float]) -> str:
    values = sorted(unsorted)
    return (
        f"{ms(quantile(values, 0.5))} / {ms(quantile(values, 0.99))} / "
        f"{ms(values[-1] if values else math.nan)}"
    )


def histogram_quantile(buckets: dict[float, float], q: float) -> float:
    """Upper bound of the bucket that holds quantile ``q``."""
    total = buckets.get(math.inf, 0.0)
    if total <= 0:
        return math.nan
    for bound in sorted(buckets):
        if buckets[bound] >= q * total:
            return bound
    return math.inf


def expected_rvs(writes: Writes) -> dict[str | None, set[int]]:
    """The RVs each kind of watcher should receive: every write, or for a selector the writes
    whose object is in it after or was in it before (ADDED, MODIFIED, DELETED)."""
    expected: dict[str | None, set[int]] = {None: set(writes.by_rv)}
    for selector in SELECTORS:
        expected[selector] = set()
    tier_of: dict[str, str] = {}
    for rv in sorted(writes.by_rv):
        write = writes.by_rv[rv]
        before = tier_of.get(write.name)
        tier_of[write.name] = write.tier
        for selector, tiers in SELECTORS.items():
            if write.tier in tiers or (before is not None and before in tiers):
                expected[selector].add(rv)
    return expected


def log_findings(log: Path, since: int) -> tuple[int, int, list[str]]:
    """Warnings and errors (or tracebacks) in warmwatch's log after byte ``since``."""
    text = log.read_bytes()[since:].decode(errors="replace")
    warnings = errors = 0
    samples: list[str] = []
    for line in text.splitlines():
        if KNOWN_WARNING in line:
            continue
        if " WARNING " in line or "WARNING:" in line:
            warnings += 1
        elif " ERROR " in line or "Traceback" in line or "ERROR:" in line:
            errors += 1
        else:
            continue
        if len(samples) < 5:
            samples.append(line.strip()[:300])
    return warnings, errors, samples


@dataclass(frozen=True, kw_only=True)
class Lags:
    """The events the watchers via warmwatch received, matched with the direct watchers' and
    the writes: arrays of doubles, not lists of floats (100 watchers x 60 s x ~1,000 writes/s
    is millions)."""

    added_plain: array[float]
    added_selector: array[float]
    absolute: array[float]
    windows: dict[int, array[float]]
    """The added lags by the window of the run (``WINDOW`` seconds) they fell in."""
    unmatched: int
    missing: int
    duplicates: int
    expected_total: int
    received_total: int

    @property
    def added(self) -> array[float]:
        return self.added_plain + self.added_selector


def earliest_direct(direct: Sequence[Received]) -> tuple[dict[int, float], array[float]]:
    """The reference: the earliest direct receive time of each RV, and how far the direct
    watchers differ (the spread, per RV)."""
    reference: dict[int, float] = {}
    latest: dict[int, float] = {}
    for record in direct:
        for rv, t in zip(record.rvs, record.times, strict=True):
            if rv not in reference or t < reference[rv]:
                reference[rv] = t
            if t > latest.get(rv, -math.inf):
                latest[rv] = t
    return reference, array("d", (latest[rv] - reference[rv] for rv in reference))


def via_lags(via: Sequence[Received], *, reference: dict[int, float], writes: Writes) -> Lags:
    """Each event via warmwatch against the reference (added lag) and its write (absolute)."""
    expected = expected_rvs(writes)
    added_plain: array[float] = array("d")
    added_selector: array[float] = array("d")
    absolute: array[float] = array("d")
    windows: dict[int, array[float]] = {}
    unmatched = missing = duplicates = expected_total = received_total = 0
    for record in via:
        got = set(record.rvs)
        duplicates += len(record.rvs) - len(got)
        want = expected[record.selector]
        expected_total += len(want)
        received_total += len(record.rvs)
        missing += len(want - got)
        target = added_selector if record.selector else added_plain
        for rv, t in zip(record.rvs, record.times, strict=True):
            ref = reference.get(rv)
            if ref is None:
                unmatched += 1
            else:
                lag = t - ref
                target.append(lag)
                windows.setdefault(int((ref - writes.started) // WINDOW), array("d")).append(lag)
            write = writes.by_rv.get(rv)
            if write is not None:
                absolute.append(t - write.done)
    return Lags(
        added_plain=added_plain,
        added_selector=added_selector,
        absolute=absolute,
        windows=windows,
        unmatched=unmatched,
        missing=missing,
        duplicates=duplicates,
        expected_total=expected_total,
        received_total=received_total,
    )


def _delta(after: dict[float, float], before: dict[float, float]) -> dict[float, float]:
    """A histogram's buckets over an interval."""
    return {b: after.get(b, 0.0) - before.get(b, 0.0) for b in after}


@dataclass(frozen=True, kw_only=True)
class Figures:
    """What :func:`report` measured, for its rows."""

    args: argparse.Namespace
    writes: Writes
    direct: list[Received]
    via: list[Received]
    idle: Sample
    before: Sample
    at_end: Sample
    drained: Sample
    hwm: int
    harness_cpu: float
    clients_run_wait: float
    load_before: float
    load_after: float
    log: tuple[int, int, list[str]]
    reference: dict[int, float]
    spread: array[float]
    lags: Lags

    @property
    def window(self) -> float:
        return self.writes.ended - self.writes.started

    @property
    def load(self) -> list[float]:
        return [self.load_before, *self.writes.load, self.load_after]

    @property
    def errors(self) -> list[str]:
        return [e for r in self.via for e in r.errors]


def _run_rows(fig: Figures) -> list[tuple[str, str]]:
    """The run: its parameters, the machine's load, the writes, warmwatch's event rates."""
    args, writes, via, direct = fig.args, fig.writes, fig.via, fig.direct
    load_before, load, load_after = fig.load_before, fig.load, fig.load_after
    before, at_end = fig.before, fig.at_end
    window = fig.window
    creates = sum(1 for w in writes.by_rv.values() if w.create)
    writes_s = len(writes.by_rv) / window
    plain = sum(1 for r in via if not r.selector)
    dt_end = at_end.at - before.at
    expected_total = fig.lags.expected_total
    return [
        (
            "parameters",
            f"{len(via)} watchers via warmwatch ({plain} unfiltered, {len(via) - plain} with "
            f"label selectors {', '.join(f'`{s}`' for s in SELECTORS)}), {len(direct)} direct "
            f"watchers; {args.seconds:.0f} s of writes by {args.writers} concurrent writers, "
            f"ConfigMaps of ~{args.size} B data; watch clients: {CLIENT}, one process for the "
            f"watchers via warmwatch and one for the direct ones, a connection per watch; "
            f"{os.cpu_count()} cores, "
            + (
                f"warmwatch and its watch clients on CPU {_cpus(args.pod_cpus)}, everything "
                f"else on CPU {_cpus(_other_cpus(args.pod_cpus))}"
                if args.pod_cpus
                else "shared by everything"
            ),
        ),
        (
            "load average (1 min): before / during (mean, max) / after",
            f"{load_before:.2f} / {sum(load) / len(load):.2f}, {max(load):.2f} / {load_after:.2f}",
        ),
        (
            "writes upstream (creates + updates), writes/s",
            f"{len(writes.by_rv):,} ({creates:,} + {len(writes.by_rv) - creates:,}), "
            f"{writes_s:,.0f}/s; {writes.errors} failed",
        ),
        (
            "warmwatch events ingested/s (events_in_total over the write window)",
            f"{(at_end.events_in - before.events_in) / dt_end:,.0f}",
        ),
        (
            "warmwatch events delivered/s (events_out_total over the write window)",
            f"{(at_end.events_out - before.events_out) / dt_end:,.0f} "
            f"(expected for these watchers: {expected_total / window:,.0f}/s)",
        ),
    ]


def _lag_rows(fig: Figures) -> list[tuple[str, str]]:
    """The lags: added by warmwatch (against the earliest direct watcher) and absolute."""
    lags, writes, reference = fig.lags, fig.writes, fig.reference
    added, added_plain, added_selector, absolute = (
        lags.added,
        lags.added_plain,
        lags.added_selector,
        lags.absolute,
    )
    trend = ", ".join(
        f"{int(i * WINDOW)}-{int((i + 1) * WINDOW)} s: {ms(quantile(sorted(v), 0.99))}"
        for i, v in sorted(lags.windows.items())
    )
    direct_abs = array(
        "d", (reference[rv] - w.done for rv, w in writes.by_rv.items() if rv in reference)
    )
    spread = fig.spread
    return [
        (
            "**added lag via warmwatch, ms: p50 / p99 / max** (all watchers, all events)",
            f"**{pcts(added)}** ({len(added):,} events)",
        ),
        ("added lag, unfiltered watchers, ms: p50 / p99 / max", pcts(added_plain)),
        ("added lag, selector watchers, ms: p50 / p99 / max", pcts(added_selector)),
        (f"added lag p99 per {WINDOW:.0f} s of the run, ms", trend or "n/a"),
        ("absolute lag via warmwatch from write completion, ms: p50 / p99 / max", pcts(absolute)),
        (
            "absolute lag direct (earliest) from write completion, ms: p50 / p99 / max",
            pcts(direct_abs),
        ),
        ("spread between the direct watchers, ms: p50 / p99 / max", pcts(spread)),
    ]


def _delivery_rows(fig: Figures) -> list[tuple[str, str]]:
    """warmwatch's delivery: its histograms, and every event accounted for."""
    lags, before, drained, via, direct = fig.lags, fig.before, fig.drained, fig.via, fig.direct
    lag_delta = _delta(drained.lag_buckets, before.lag_buckets)
    commits = _delta(drained.commit_buckets, before.commit_buckets)
    within_10ms = lag_delta.get(0.01, math.nan) / lag_delta.get(math.inf, math.nan)
    received_total, expected_total = lags.received_total, lags.expected_total
    missing, unmatched, duplicates = lags.missing, lags.unmatched, lags.duplicates
    unparsed = sum(r.lines - r.bookmarks - len(r.errors) - len(r.rvs) for r in [*via, *direct])
    direct_missing = [len(set(fig.writes.by_rv) - set(r.rvs)) for r in direct]
    ends = sum(r.ends for r in via)
    errors = fig.errors
    return [
        (
            "warmwatch delivery-lag histogram (commit to write), p50 / p99 bucket; share ≤ 10 ms",
            f"≤ {ms(histogram_quantile(lag_delta, 0.5))} / "
            f"≤ {ms(histogram_quantile(lag_delta, 0.99))} ms; {within_10ms:.1%}",
        ),
        (
            "warmwatch commit duration (one transaction per upstream chunk), p50 / p99 bucket",
            f"≤ {ms(histogram_quantile(commits, 0.5))} / ≤ {ms(histogram_quantile(commits, 0.99))}"
            f" ms ({commits.get(math.inf, 0.0):,.0f} commits)",
        ),
        (
            "events via warmwatch: received / expected; missing, unmatched, duplicates; "
            "lines not parsed (all watchers)",
            f"{received_total:,} / {expected_total:,}; {missing:,}, {unmatched:,}, {duplicates:,}"
            f"; {unparsed:,}",
        ),
        (
            "direct watchers: missing events each",
            ", ".join(str(m) for m in direct_missing),
        ),
        (
            "watch streams ended early (resumed) / errors, via warmwatch",
            f"{ends} / {len(errors)}",
        ),
        (
            "warmwatch_watchers before writes / drained; passthrough requests during the run",
            f"{before.watchers:.0f} / {drained.watchers:.0f}; "
            f"{drained.passthrough - before.passthrough:.0f}",
        ),
    ]


def _resource_rows(fig: Figures) -> list[tuple[str, str]]:
    """What the run cost: CPU, waiting for a CPU, memory; warmwatch's log."""
    before, at_end, drained, idle, writes = (
        fig.before,
        fig.at_end,
        fig.drained,
        fig.idle,
        fig.writes,
    )
    dt_drained = drained.at - before.at
    ingested = drained.events_in - before.events_in
    cpu = drained.cpu - before.cpu
    hwm, harness_cpu, clients_run_wait, log = (
        fig.hwm,
        fig.harness_cpu,
        fig.clients_run_wait,
        fig.log,
    )
    return [
        (
            "warmwatch CPU s per 1,000 ingested events (writes start to drained)",
            f"{cpu / ingested * 1000:.3f} ({cpu:.1f} s CPU for {ingested:,.0f} events; "
            f"{cpu / dt_drained:.2f} cores over {dt_drained:.1f} s)"
            if ingested
            else "n/a",
        ),
        (
            "warmwatch waiting for a CPU while runnable (schedstat), s per s",
            f"{(drained.run_wait - before.run_wait) / dt_drained:.2f}",
        ),
        (
            "drain after the writes stopped, s",
            f"{drained.at - at_end.at:.1f}",
        ),
        (
            "warmwatch RSS MB: idle / watchers open / end of writes / drained; VmHWM",
            f"{idle.rss / 1e6:.0f} / {before.rss / 1e6:.0f} / {at_end.rss / 1e6:.0f} / "
            f"{drained.rss / 1e6:.0f}; {hwm / 1e6:.0f}",
        ),
        (
            "warmwatch RSS MB every 5 s during the writes",
            ", ".join(f"{r / 1e6:.0f}" for r in writes.rss),
        ),
        (
            "harness CPU s (watch client processes, start to end; writer process during the run)",
            f"{harness_cpu:.1f}; the warmwatch watch clients waited {clients_run_wait:.1f} s "
            "for a CPU while runnable (schedstat, their whole life)",
        ),
        ("warmwatch log: warnings / errors", f"{log[0]} / {log[1]}"),
    ]


def report(
    args: argparse.Namespace,
    *,
    writes: Writes,
    direct: list[Received],
    via: list[Received],
    idle: Sample,
    before: Sample,
    at_end: Sample,
    drained: Sample,
    hwm: int,
    harness_cpu: float,
    clients_run_wait: float,
    load_before: float,
    load_after: float,
    log: tuple[int, int, list[str]],
) -> list[str]:
    reference, spread = earliest_direct(direct)
    fig = Figures(
        args=args,
        writes=writes,
        direct=direct,
        via=via,
        idle=idle,
        before=before,
        at_end=at_end,
        drained=drained,
        hwm=hwm,
        harness_cpu=harness_cpu,
        clients_run_wait=clients_run_wait,
        load_before=load_before,
        load_after=load_after,
        log=log,
        reference=reference,
        spread=spread,
        lags=via_lags(via, reference=reference, writes=writes),
    )
    rows = [*_run_rows(fig), *_lag_rows(fig), *_delivery_rows(fig), *_resource_rows(fig)]
    notes: list[str] = []
    notes.extend(f"warmwatch log: {line}" for line in log[2])
    notes.extend(f"watch error: {e}" for e in fig.errors[:5])
    notes.extend(f"write error: {e}" for e in writes.error_samples)
    lines = ["| figure | value |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    if notes:
        lines += ["", *(f"- {n}" for n in notes)]
    return lines


# -- the run ----------------------------------------------------------------------------------


def group_specs(args: argparse.Namespace, sidecar: Sidecar, plane: ControlPlane) -> list[GroupSpec]:
    timeout = int(args.seconds) + 900
    selectors: list[str | None] = [None] * (args.watchers - args.selector_watchers)
    names = list(SELECTORS)
    selectors += [names[i % len(names)] for i in range(args.selector_watchers)]
    return [
        GroupSpec(
            name="via", base_url=sidecar.url, tls=None, selectors=selectors, timeout_seconds=timeout
        ),
        GroupSpec(
            name="direct",
            base_url=plane.server,
            tls=plane.pki,
            selectors=[None] * args.direct,
            timeout_seconds=timeout,
        ),
    ]


def run(args: argparse.Namespace) -> list[str]:
    directory: Path = args.dir.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    binary = build_client()
    plane = ControlPlane(directory / "cp")
    plane.up()
    plane.stop_controller_manager()  # nothing else watches or writes
    sidecar: Sidecar | None = None
    groups: list[Group] = []
    try:
        asyncio.run(_namespace(plane))
        db = directory / "fanout.db"
        for stale in directory.glob("fanout.db*"):
            stale.unlink()
        log = db.with_suffix(".log")
        log_start = log.stat().st_size if log.exists() else 0
        sidecar = Sidecar.start(
            upstream_kubeconfig=plane.admin_kubeconfig, db=db, resources=[SHAPE]
        )
        _say(f"warmwatch ready (pid {sidecar.process.pid}, log {log})")
        idle = sample(sidecar)
        groups = start_groups(
            binary,
            group_specs(args, sidecar, plane),
            directory,
            cpus=functools.partial(_group_cpus, args.pod_cpus) if args.pod_cpus else None,
        )
        if args.pod_cpus:
            place(args.pod_cpus, plane=plane, sidecar=sidecar, groups=groups)
        time.sleep(2)
        load_before = os.getloadavg()[0]
        harness_before = sum(os.times()[:2])
        before = sample(sidecar)
        _say(f"writing for {args.seconds:.0f} s (load {load_before:.2f}) ...")
        writes = asyncio.run(
            write_for(
                plane,
                seconds=args.seconds,
                writers=args.writers,
                size=args.size,
                sidecar_pid=sidecar.process.pid,
            )
        )
        at_end = sample(sidecar)
        _say(
            f"{len(writes.by_rv):,} writes; warmwatch in {at_end.events_in - before.events_in:,.0f}"
            f" out {at_end.events_out - before.events_out:,.0f}; draining ..."
        )
        drained = drain(sidecar)
        load_after = os.getloadavg()[0]
        hwm = processes.rss_bytes(sidecar.process.pid, "VmHWM")
        harness_main = sum(os.times()[:2]) - harness_before
        stop_groups(groups)
        _say("watch records collected; computing")
        findings = log_findings(log, log_start)
        direct = [r for g in groups if g.spec.name == "direct" for r in g.records]
        via = [r for g in groups if g.spec.name != "direct" for r in g.records]
        if len(via) != args.watchers or len(direct) != args.direct:
            _say(f"WARNING: records from {len(via)} + {len(direct)} watchers")
        return report(
            args,
            writes=writes,
            direct=direct,
            via=via,
            idle=idle,
            before=before,
            at_end=at_end,
            drained=drained,
            hwm=hwm,
            harness_cpu=harness_main + sum(g.cpu for g in groups),
            clients_run_wait=sum(g.run_wait for g in groups if g.spec.name != "direct"),
            load_before=load_before,
            load_after=load_after,
            log=findings,
        )
    finally:
        _clean_up(args, plane=plane, sidecar=sidecar, groups=groups)


def _clean_up(
    args: argparse.Namespace,
    *,
    plane: ControlPlane,
    sidecar: Sidecar | None,
    groups: Sequence[Group],
) -> None:
    """The watch clients and warmwatch stopped, every CPU given back to the plane, and the
    plane stopped (or, with ``--keep``, its kube-controller-manager started again)."""
    for group in groups:
        processes.kill(group.process)
    if sidecar is not None:
        sidecar.stop()
    if args.pod_cpus:  # the plane may be used again
        everywhere = args.pod_cpus | _other_cpus(args.pod_cpus)
        for pid in (os.getpid(), *plane.state().pids.values()):
            with contextlib.suppress(OSError):
                processes.pin(pid, everywhere)
    if args.keep:
        plane.start_controller_manager()
    else:
        plane.down()
        shutil.rmtree(plane.directory, ignore_errors=True)


def _other_cpus(pod: set[int]) -> set[int]:
    return os.sched_getaffinity(0) - pod if not pod >= os.sched_getaffinity(0) else pod


def _cpus(cpus: set[int]) -> str:
    return ",".join(str(cpu) for cpu in sorted(cpus))


def _group_cpus(pod: set[int], spec: GroupSpec) -> set[int]:
    """--pod-cpus: the direct watchers beside the apiserver, the others in the pod."""
    return _other_cpus(pod) if spec.name == "direct" else pod


def place(pod: set[int], *, plane: ControlPlane, sidecar: Sidecar, groups: Sequence[Group]) -> None:
    """--pod-cpus: warmwatch and the watch clients through it (the controller's pod) on
    ``pod``; the apiserver, etcd, the direct watchers and this harness (the writers) on the
    other CPUs — as a sidecar with CPUs of its own sees a control plane on other machines."""
    processes.pin(sidecar.process.pid, pod)
    for group in groups:
        processes.pin(group.process.pid, _group_cpus(pod, group.spec))
    rest = _other_cpus(pod)
    for pid in (os.getpid(), *plane.state().pids.values()):
        processes.pin(pid, rest)


async def _namespace(plane: ControlPlane) -> None:
    async with kubeapi.RawClient(
        base_url=plane.server, ssl_context=kubeapi.client_ssl(plane.pki, identity="admin")
    ) as api:
        await kubeapi.ensure_namespace(api, NAMESPACE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.fanout",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--watchers", type=int, default=100, help="watchers via warmwatch")
    parser.add_argument(
        "--selector-watchers", type=int, default=None, help="of them with selectors (W/5)"
    )
    parser.add_argument("--direct", type=int, default=5, help="direct watchers (reference)")
    parser.add_argument("--seconds", type=float, default=60, help="of writes")
    parser.add_argument("--writers", type=int, default=32, help="concurrent writes")
    parser.add_argument("--size", type=int, default=256, help="bytes of data per ConfigMap")
    parser.add_argument(
        "--pod-cpus",
        type=lambda text: {int(cpu) for cpu in text.split(",")},
        default=set(),
        help="CPUs (e.g. 1) for warmwatch and its watch clients, the rest for the apiserver, "
        "etcd, the writers and the direct watchers: as a sidecar with a CPU of its own beside "
        "a control plane elsewhere (default: everything shares every CPU)",
    )
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    parser.add_argument("--keep", action="store_true", help="leave the control plane running")
    args = parser.parse_args(argv)
    if args.selector_watchers is None:
        args.selector_watchers = args.watchers // 5
    args.selector_watchers = min(args.selector_watchers, args.watchers)
    command = "python -m loadtest.fanout " + " ".join(sys.argv[1:] if argv is None else argv)
    lines = run(args)
    text = "\n".join([f"`{command}`", "", *lines])
    print(f"\n{text}")
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
