"""The million-object bar (``--million``)::

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
import os
import shutil
import sqlite3
import ssl
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from loadtest import kubeapi
from loadtest.bench import say, scan_log
from loadtest.cluster import ControlPlane
from loadtest.sidecar import Sidecar

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


async def run_pool(
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
            say(f"  {what}: {pool.done:,} of {limit:,} ({rate:.0f}/s, ~{eta:.0f} s to go)")
            if budget is not None and not checked and elapsed >= 90:
                checked = True
                fits = int(rate * budget) // round_to * round_to
                if count / rate > budget and fits < count:
                    fits = max(fits, round_to, pool.done)
                    say(
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
        return await run_pool(
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
        return await run_pool(
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
    compileall.compile_dir(Path(__file__).resolve().parents[2] / "proxy", quiet=1)


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
            cwd=Path(__file__).resolve().parents[2],
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
        say(f"N={self.result.requested:,}: {self.name} ...")
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc_info: object) -> None:
        seconds = time.monotonic() - self.started
        self.result.phases[self.name] = seconds
        say(f"N={self.result.requested:,}: {self.name} took {seconds:.1f} s")


def run_million(
    plane: ControlPlane, directory: Path, result: MillionResult, args: argparse.Namespace
) -> None:
    namespace = _million_namespace(result.requested)
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    size = _create(plane, result, namespace=namespace, args=args)
    db = directory / f"ww-million-{result.requested}.db"
    for stale in directory.glob(f"ww-million-{result.requested}.*"):
        stale.unlink()
    sidecar = _cold_fill(plane, result, db=db, namespace=namespace)
    try:
        _measure_filled(plane, sidecar, result, db=db, path=path, args=args)
    finally:
        sidecar.stop()
    offset = _relist(plane, sidecar, result, db=db, namespace=namespace, args=args)
    _note_counts(sidecar, result, db=db, offset=offset, size=size)


def _create(
    plane: ControlPlane, result: MillionResult, *, namespace: str, args: argparse.Namespace
) -> int:
    """The N objects upstream, or as many as the budget allowed (noted); how many."""
    requested = result.requested
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
    return size


def _cold_fill(plane: ControlPlane, result: MillionResult, *, db: Path, namespace: str) -> Sidecar:
    """warmwatch started on a fresh database and filled: the time to ready and the peak."""
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
    return sidecar


def _measure_filled(
    plane: ControlPlane,
    sidecar: Sidecar,
    result: MillionResult,
    *,
    db: Path,
    path: str,
    args: argparse.Namespace,
) -> None:
    """The filled cache: its RSS, warm restarts, full LISTs, then LISTs under watchers."""
    size = result.size
    time.sleep(2)
    result.rss_filled = sidecar.rss_bytes()
    result.objects_filled = _count_objects(db)
    result.db_filled = _db_bytes(db)
    say(
        f"  filled in {result.fill:.1f} s, {result.objects_filled:.0f} objects, RSS "
        f"{result.rss_filled / 1e6:.0f} MB (peak {result.fill_hwm / 1e6:.0f} MB)"
    )
    with Phase(result, "warm restarts"):
        for _ in range(args.restarts):
            restart = warm_restart(sidecar, path)
            say(f"  {restart}")
            result.restarts.append(restart)
        passed = sidecar.metric("warmwatch_passthrough_requests_total")
        if passed:
            result.notes.append(
                f"N={size:,}: {passed:.0f} requests passed through during the last warm "
                "restart (a LIST answered by the apiserver, not the cache?)"
            )
    with Phase(result, "full LISTs"):
        _full_lists(plane, sidecar, result, path=path, runs=args.list_runs)
    with Phase(result, "4 LISTs + 100 watchers"):
        result.served = asyncio.run(serve_under_load(sidecar, path))
        say(f"  {result.served}")
        for read in result.served.reads:
            if read.error:
                result.notes.append(
                    f"N={size:,}: one of the 4 concurrent LISTs was {read.describe()}"
                )


def _full_lists(
    plane: ControlPlane, sidecar: Sidecar, result: MillionResult, *, path: str, runs: int
) -> None:
    """Full LISTs from warmwatch and from the apiserver's watch cache (gzip and identity)."""
    admin_ssl = kubeapi.client_ssl(plane.pki, identity="admin")
    result.ww_lists = asyncio.run(list_reads(f"{sidecar.url}{path}", ssl_context=None, runs=runs))
    result.api_lists = asyncio.run(
        list_reads(
            f"{plane.server}{path}",
            ssl_context=admin_ssl,
            runs=runs,
            params={"resourceVersion": "0"},
        )
    )
    result.api_plain_lists = asyncio.run(
        list_reads(
            f"{plane.server}{path}",
            ssl_context=admin_ssl,
            runs=runs,
            params={"resourceVersion": "0"},
            identity=True,
        )
    )
    for read in result.ww_lists + result.api_lists + result.api_plain_lists:
        say(f"  {read}")
    cut = [r for r in result.ww_lists + result.api_lists + result.api_plain_lists if r.error]
    for read in cut:
        source = "warmwatch" if read in result.ww_lists else "the apiserver"
        result.notes.append(
            f"N={result.size:,}: a full LIST from {source} "
            f"({read.encoding or 'identity'}) was {read.describe()}"
        )


def _relist(
    plane: ControlPlane,
    sidecar: Sidecar,
    result: MillionResult,
    *,
    db: Path,
    namespace: str,
    args: argparse.Namespace,
) -> int:
    """Half the objects deleted upstream while warmwatch is stopped, the apiserver restarted
    (its resume gets 410), warmwatch started again until it relisted; its log offset before."""
    with Phase(result, "delete half upstream"):
        result.delete = asyncio.run(
            delete_half(plane, namespace=namespace, count=result.size, concurrency=args.concurrency)
        )
    with Phase(result, "apiserver restart"):
        plane.stop_apiserver()
        for attempt in range(10):  # its watch cache of N/2 objects may take a while
            try:
                plane.start_apiserver()
                break
            except TimeoutError:
                say(f"  apiserver not ready yet (attempt {attempt + 1}); waiting on")
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
            say(f"  {result.relist_line}")
        finally:
            sidecar.stop()
    return offset


def _note_counts(
    sidecar: Sidecar, result: MillionResult, *, db: Path, offset: int, size: int
) -> None:
    """Notes on what does not add up: no 410 before the relist, objects missing after the
    fill or the relist, warnings and errors in warmwatch's log."""
    result.objects_relisted = _count_objects(db)
    relist_log = _log_lines(sidecar.log, offset)
    if not any("410" in line or "too old" in line.lower() for line in relist_log):
        result.notes.append(f"N={size:,}: no 410 seen in the log before the relist")
    assert result.delete is not None
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


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _ms(value: float) -> str:
    return f"{value * 1000:,.0f} ms"


def _best(reads: Sequence[ListRead]) -> ListRead:
    """The fastest complete read; the longest cut one when none completed."""
    whole = [read for read in reads if not read.error]
    if whole:
        return max(whole, key=lambda r: r.rate)
    return max(reads, key=lambda r: r.seconds)


def _ratio(x: ListRead, y: ListRead) -> str:
    return "n/a (cut)" if x.error or y.error else f"{x.rate / y.rate:.2f}x"


MILLION_ROWS: list[tuple[str, Callable[[Any], object]]] = [
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
        lambda r: _ms(_median([x.port_open for x in r.restarts])),
    ),
    (
        "warm restart: process start → first LIST byte from the cache (median; min-max)",
        lambda r: (
            f"{_ms(_median([x.first_list_byte for x in r.restarts]))} "
            f"({_ms(min(x.first_list_byte for x in r.restarts))}-"
            f"{_ms(max(x.first_list_byte for x in r.restarts))})"
        ),
    ),
    (
        "warm restart: first LIST byte minus port open (median)",
        lambda r: _ms(_median([x.first_list_byte - x.port_open for x in r.restarts])),
    ),
    (
        "warm restart: process start → /readyz 200 (median)",
        lambda r: _ms(_median([x.ready for x in r.restarts])),
    ),
    (
        "LIST time to first byte once ready (median)",
        lambda r: _ms(_median([x.list_ttfb_ready for x in r.restarts])),
    ),
    ("full LIST size, MB (JSON)", lambda r: _mb(_best(r.ww_lists).size)),
    (
        "full LIST from warmwatch: MB/s (s), best of runs",
        lambda r: _best(r.ww_lists).describe(),
    ),
    (
        "full LIST from the apiserver rv=0: MB/s (s), best of runs",
        lambda r: _best(r.api_lists).describe(),
    ),
    (
        "full LIST from the apiserver rv=0, Accept-Encoding identity: MB/s (s)",
        lambda r: _best(r.api_plain_lists).describe(),
    ),
    (
        "warmwatch / apiserver LIST rate (gzip; identity)",
        lambda r: (
            f"{_ratio(_best(r.ww_lists), _best(r.api_lists))}; "
            f"{_ratio(_best(r.ww_lists), _best(r.api_plain_lists))}"
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
"""The rows of the million-object table: a label, and how a result renders in it (a field
not measured, None, renders as "n/a")."""


def million_table(results: Sequence[MillionResult], *, machine: str, startup: float) -> list[str]:
    def cells(render: Callable[[Any], object]) -> str:
        out = []
        for result in results:
            try:
                out.append(str(render(result)))
            except (TypeError, ValueError, AttributeError, ZeroDivisionError):
                out.append("n/a")
        return " | ".join(out)

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
    lines += [f"| {label} | {cells(render)} |" for label, render in MILLION_ROWS]
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
        say(f"process start-up reference (python -m proxy --help): {startup:.2f} s")
        for size in sizes:
            result = MillionResult(requested=size)
            results.append(result)
            try:
                run_million(plane, directory, result, args)
            except Exception as error:  # the table still shows what was measured
                result.notes.append(f"N={size:,}: FAILED: {error!r}"[:2000])
                say(f"N={size:,}: FAILED: {error!r}")
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
