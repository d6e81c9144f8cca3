"""The faults, injected at seeded random moments and counted (see the package docstring for
each kind)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from loadtest import toxiproxy
from loadtest.cluster import ControlPlane
from loadtest.faults import say
from loadtest.faults.cachelog import CacheLog
from loadtest.faults.clients import WatchClient
from loadtest.faults.options import Options
from loadtest.faults.resources import RESOURCES
from loadtest.history import EtcdHistory, compact, current_revision
from loadtest.sidecar import Sidecar


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
