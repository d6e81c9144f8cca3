"""The reflector against a scripted in-process apiserver: WatchList fallback, pagination,
429/Retry-After, 410 mid-watch (relist diff), the concurrent-list limit and the breaker.

The real apiserver cases (fill, resume, relist after an apiserver restart) are end-to-end
tests; these are the answers a real apiserver gives only under load or on purpose.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from proxy.cache.records import ChangeType
from proxy.cache.shapes import Shape, ShapeKey
from proxy.cache.store import Store, StoreSettings
from proxy.kube.resources import GroupVersionResource
from proxy.metrics import Metrics
from proxy.upstream.connecting import ConnectionSettings, Upstream, connect
from proxy.upstream.reflecting import Reflector, ReflectorSettings
from proxy.upstream.resilience import (
    Backoff,
    BackoffSettings,
    BreakerSettings,
    CircuitBreaker,
    ListLimiter,
    ListLimiterSettings,
)
from tests.unit.upstream.conftest import free_slots, token_kubeconfig

Answer = tuple[int, dict[str, str], list[dict[str, Any]] | dict[str, Any]]


def cm(name: str, rv: int) -> dict[str, Any]:
    return {
        "kind": "ConfigMap",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": "a",
            "resourceVersion": str(rv),
            "uid": f"u-{name}",
        },
    }


def status(code: int, reason: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": reason,
        "reason": reason,
        "code": code,
    }


@dataclass
class Scripted:
    """Answers LISTs from ``objects`` (paginated) and WATCHes from the ``watches`` script;
    records when each request arrived and how many LISTs ran at once."""

    objects: list[dict[str, Any]] = field(default_factory=list)
    list_rv: int = 10
    watch_list: Answer | None = None
    watches: list[Answer] = field(default_factory=list)
    requests: list[tuple[float, str]] = field(default_factory=list)
    list_delay: float = 0.0
    later: tuple[list[dict[str, Any]], int] | None = None
    """The state (objects, RV) LISTs see once a scripted watch has been served."""
    watches_served: int = 0
    expire_continue: int = 0
    """Answer this many ``continue`` requests 410 Expired (etcd compacted the list's RV)."""
    list_limits: list[str | None] = field(default_factory=list)
    lists_now: int = 0
    lists_max: int = 0
    continued_now: int = 0
    """LISTs in flight asking for a next page (``continue``)."""
    continued_max: int = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        query = request.query
        kind = (
            "WATCHLIST"
            if "sendInitialEvents" in query
            else ("WATCH" if "watch" in query else "LIST")
        )
        self.requests.append((time.monotonic(), kind))
        if kind == "LIST":
            return await self._list(request)
        if kind == "WATCHLIST":
            answer = self.watch_list or (422, {}, status(422, "Invalid"))
        elif self.watches:
            answer = self.watches.pop(0)
            self.watches_served += 1
        else:  # nothing scripted: an idle watch that ends when its timeout would
            answer = (200, {}, [])
            await asyncio.sleep(0.2)
        code, headers, body = answer
        if code != 200:
            return web.json_response(body, status=code, headers=headers)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        for event in body:  # type: ignore[union-attr]
            await response.write(orjson.dumps(event) + b"\n")
        return response

    async def _list(self, request: web.Request) -> web.Response:
        self.lists_now += 1
        self.lists_max = max(self.lists_max, self.lists_now)
        continued = "continue" in request.query
        self.continued_now += continued
        self.continued_max = max(self.continued_max, self.continued_now)
        if self.later is not None and self.watches_served:
            self.objects, self.list_rv = self.later
        try:
            await asyncio.sleep(self.list_delay)
            self.list_limits.append(request.query.get("limit"))
            if "continue" in request.query and self.expire_continue:
                self.expire_continue -= 1
                return web.json_response(status(410, "Expired"), status=410)
            limit = int(request.query.get("limit") or 1_000_000)
            start = int(request.query.get("continue") or 0)
            page = self.objects[start : start + limit]
            metadata: dict[str, Any] = {"resourceVersion": str(self.list_rv)}
            if start + limit < len(self.objects):
                metadata["continue"] = str(start + limit)
                metadata["remainingItemCount"] = len(self.objects) - start - limit
            items = [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in page]
            return web.json_response(
                {"kind": "ConfigMapList", "apiVersion": "v1", "metadata": metadata, "items": items}
            )
        finally:
            self.lists_now -= 1
            self.continued_now -= continued


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Scripted, Upstream, Store, Metrics]]:
    scripted = Scripted()
    app = web.Application()
    app.router.add_get("/api/v1/{tail:.*}", scripted.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    metrics = Metrics()
    kubeconfig = token_kubeconfig(
        tmp_path / "kubeconfig", server=f"http://127.0.0.1:{port}", token="t"
    )
    upstream = await connect(ConnectionSettings(kubeconfig=str(kubeconfig)), metrics=metrics)
    store = await Store.open(StoreSettings(path=tmp_path / "cache.db"), metrics=metrics)
    yield scripted, upstream, store, metrics
    await store.close()
    await upstream.close()
    await runner.cleanup()


FAST = BackoffSettings(initial=0.05, cap=0.2, jitter=0.0)


async def shape_for(store: Store, namespace: str = "a") -> Shape:
    key = ShapeKey.of(GroupVersionResource.parse("v1/configmaps"), namespace=namespace)
    return await store.ensure_shape(key, configured=True)


def reflector(
    shape: Shape,
    store: Store,
    upstream: Upstream,
    metrics: Metrics,
    *,
    limiter: ListLimiter | None = None,
    breaker: CircuitBreaker | None = None,
    backoff: BackoffSettings = FAST,
) -> Reflector:
    return Reflector(
        shape=shape,
        store=store,
        upstream=upstream,
        settings=ReflectorSettings(page_size=2, watch_timeout_min=1, watch_timeout_max=2),
        limiter=limiter or ListLimiter(),
        breaker=breaker or CircuitBreaker(target="t"),
        backoff=Backoff(backoff),
        metrics=metrics,
    )


async def run_until(task_body: Reflector, condition: Any, timeout: float = 10) -> None:
    task = asyncio.create_task(task_body.run())
    try:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, "condition not reached"
            assert not task.done(), task.exception() if task.done() else None
            await asyncio.sleep(0.02)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_watchlist_refused_falls_back_to_paginated_list(
    served: tuple[Scripted, Upstream, Store, Metrics],
) -> None:
    scripted, upstream, store, metrics = served
    scripted.objects = [cm(f"o{i}", i + 1) for i in range(5)]
    shape = await shape_for(store)
    worker = reflector(shape, store, upstream, metrics)
    await run_until(worker, lambda: shape.rv is not None)
    assert shape.rv == "10"
    assert worker.watch_list is False  # remembered: no WatchList attempt next time
    kinds = [k for _, k in scripted.requests]
    assert kinds[:4] == ["WATCHLIST", "LIST", "LIST", "LIST"]  # 5 objects, pages of 2
    async with store.snapshot(shape) as snapshot:
        rows = [row async for batch in snapshot.rows for row in batch]
    assert [name for _, name, _, _ in rows] == [f"o{i}" for i in range(5)]
    assert all(orjson.loads(raw)["kind"] == "ConfigMap" for *_, raw in rows)  # kind added


async def test_429_retry_after_is_honoured(
    served: tuple[Scripted, Upstream, Store, Metrics],
) -> None:
    scripted, upstream, store, metrics = served
    scripted.watches = [
        (429, {"Retry-After": "1"}, status(429, "TooManyRequests")),
        (200, {}, [{"type": "ADDED", "object": cm("late", 11)}]),
    ]
    shape = await shape_for(store)
    worker = reflector(shape, store, upstream, metrics)
    await run_until(worker, lambda: shape.rv == "11")
    watches = [t for t, k in scripted.requests if k == "WATCH"]
    assert watches[1] - watches[0] >= 1.0  # waited Retry-After, not the 50 ms backoff


async def test_410_mid_watch_relists_and_appends_the_difference(
    served: tuple[Scripted, Upstream, Store, Metrics],
) -> None:
    scripted, upstream, store, metrics = served
    scripted.objects = [cm("keep", 1), cm("gone", 2)]
    scripted.watches = [
        (
            200,
            {},
            [
                {"type": "MODIFIED", "object": cm("keep", 11)},
                {"type": "ERROR", "object": status(410, "Expired")},
            ],
        )
    ]
    shape = await shape_for(store)
    worker = reflector(shape, store, upstream, metrics)
    # After the 410 the apiserver's state: "keep" changed again, "gone" deleted, "new" added.
    scripted.later = ([cm("keep", 15), cm("new", 16)], 20)
    await run_until(worker, lambda: shape.rv == "20")
    log = await store.read_events(shape, after=0, limit=100)
    changes = [(r.type, r.name, r.rv, r.batch) for r in log if r.type is not ChangeType.BOOKMARK]
    assert changes == [
        (ChangeType.MODIFIED, "keep", "11", False),
        (ChangeType.MODIFIED, "keep", "15", True),
        (ChangeType.ADDED, "new", "16", True),
        (ChangeType.DELETED, "gone", "20", True),
    ]
    assert metrics.value("warmwatch_upstream_relists_total", {"resource": "v1/configmaps"}) == 2


async def fill_all(
    shapes: list[Shape], store: Store, upstream: Upstream, metrics: Metrics, limiter: ListLimiter
) -> None:
    workers = [reflector(s, store, upstream, metrics, limiter=limiter) for s in shapes]
    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        deadline = time.monotonic() + 20
        while not all(s.rv is not None for s in shapes):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.parametrize("free_bytes", [0, 512 * 1024])
async def test_only_large_lists_wait_for_a_slot(
    served: tuple[Scripted, Upstream, Store, Metrics], free_bytes: int
) -> None:
    """Found with kube-controller-manager on a fresh warmwatch: ~60 small collections listed
    three at a time took seconds (longer behind a big one); small lists need no slot."""
    scripted, upstream, store, metrics = served
    scripted.objects = [cm("o", 1)]
    scripted.list_delay = 0.5
    limiter = ListLimiter(ListLimiterSettings(concurrent_lists=3, free_bytes=free_bytes))
    shapes = [await shape_for(store, namespace=f"n{i}") for i in range(12)]
    await fill_all(shapes, store, upstream, metrics, limiter)
    # Exactly three when every list needs a slot; more (all twelve on an idle machine,
    # fewer when the starts spread over more than the delay) when small lists need none.
    if free_bytes:
        assert scripted.lists_max > 3
    else:
        assert scripted.lists_max == 3


async def test_a_list_found_large_goes_on_in_a_slot(
    served: tuple[Scripted, Upstream, Store, Metrics],
) -> None:
    """The first page of each is free; the next pages come three lists at a time."""
    scripted, upstream, store, metrics = served
    scripted.objects = [cm(f"o{i}", 1) for i in range(6)]  # three pages of two
    scripted.list_delay = 0.1
    limiter = ListLimiter(ListLimiterSettings(concurrent_lists=3, free_bytes=1))
    shapes = [await shape_for(store, namespace=f"n{i}") for i in range(12)]
    await fill_all(shapes, store, upstream, metrics, limiter)
    assert scripted.lists_max > 3
    assert scripted.continued_max == 3
    assert await free_slots(limiter) == 3  # every slot given back


async def test_the_breaker_opens_on_repeated_failures_and_limits_requests(
    served: tuple[Scripted, Upstream, Store, Metrics],
) -> None:
    scripted, upstream, store, metrics = served
    shape = await shape_for(store)
    worker = reflector(shape, store, upstream, metrics)
    await run_until(worker, lambda: shape.rv is not None)
    scripted.watches = [(503, {}, status(503, "ServiceUnavailable"))] * 1000
    breaker = CircuitBreaker(
        target="apiserver",
        metrics=metrics,
        settings=BreakerSettings(failure_threshold=3, cool_down=1.0),
    )
    failing = reflector(
        shape,
        store,
        upstream,
        metrics,
        breaker=breaker,
        backoff=BackoffSettings(initial=0.01, cap=0.01, jitter=0.0),
    )
    started = len(scripted.requests)
    task = asyncio.create_task(failing.run())
    await asyncio.sleep(2.5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert metrics.value("warmwatch_circuit_breaker_state", {"target": "apiserver"}) == 2
    # 3 failures open it; then one probe per 1 s cool-down, instead of one per 10 ms backoff.
    assert len(scripted.requests) - started <= 6


async def test_waiting_reflectors_resume_as_soon_as_the_probe_succeeds(
    served: tuple[Scripted, Upstream, Store, Metrics],
) -> None:
    """While another reflector's probe is in flight the breaker says "retry in 60 s" (the
    probe timeout); a probe that succeeds must release the waiting shapes at once."""
    scripted, upstream, store, metrics = served
    scripted.objects = [cm("o", 1)]
    breaker = CircuitBreaker(
        target="apiserver", settings=BreakerSettings(failure_threshold=1, cool_down=0.0)
    )
    breaker.record_failure()
    assert breaker.allow()  # someone else's probe is now in flight
    shape = await shape_for(store)
    worker = reflector(shape, store, upstream, metrics, breaker=breaker)
    task = asyncio.create_task(worker.run())
    try:
        await asyncio.sleep(0.3)
        assert shape.rv is None and not scripted.requests  # held back by the breaker
        breaker.record_success()
        started = time.monotonic()
        while shape.rv is None:
            assert time.monotonic() - started < 2.5, "still waiting for the breaker"
            await asyncio.sleep(0.02)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_an_expired_continue_token_falls_back_to_one_whole_list(
    served: tuple[Scripted, Upstream, Store, Metrics],
) -> None:
    """Found by review: a paginated relist whose continue token expired started over, page
    by page, and on a huge collection would expire again; client-go's pager lists whole."""
    scripted, upstream, store, metrics = served
    scripted.objects = [cm(f"o{i}", i + 1) for i in range(5)]
    scripted.expire_continue = 1
    shape = await shape_for(store)
    worker = reflector(shape, store, upstream, metrics)
    worker.watch_list = False
    await run_until(worker, lambda: shape.rv is not None)
    assert scripted.list_limits == ["2", "2", None]  # page, expired page, whole list
    async with store.snapshot(shape) as snapshot:
        rows = [row async for batch in snapshot.rows for row in batch]
    assert [name for _, name, _, _ in rows] == [f"o{i}" for i in range(5)]


async def test_a_watch_that_fails_after_a_relist_resumes_instead_of_relisting(
    served: tuple[Scripted, Upstream, Store, Metrics],
) -> None:
    """Found by the blackhole fault: a WatchList relist goes on as the watch; when that watch
    failed, the reflector listed the whole collection again instead of resuming from the RV
    it had just committed."""
    scripted, upstream, store, metrics = served
    end = {
        "kind": "ConfigMap",
        "apiVersion": "v1",
        "metadata": {
            "resourceVersion": "10",
            "annotations": {"k8s.io/initial-events-end": "true"},
        },
    }
    scripted.watch_list = (
        200,
        {},
        [
            {"type": "ADDED", "object": cm("o", 1)},
            {"type": "BOOKMARK", "object": end},
            {"type": "ERROR", "object": status(500, "InternalError")},
        ],
    )
    scripted.watches = [(200, {}, [{"type": "ERROR", "object": status(410, "Expired")}])]
    shape = await shape_for(store)
    worker = reflector(shape, store, upstream, metrics)

    def kinds() -> list[str]:
        return [k for _, k in scripted.requests]

    await run_until(worker, lambda: len(kinds()) >= 4)
    assert kinds()[:4] == ["WATCHLIST", "WATCH", "WATCHLIST", "WATCH"]


async def test_a_long_cold_watch_list_learns_its_total_for_the_fill_log(
    served: tuple[Scripted, Upstream, Store, Metrics],
) -> None:
    """A WatchList announces no total; a ``limit=1`` LIST (etcd's ``remainingItemCount``)
    gives the fill log one, so its lines can estimate the time left."""
    scripted, upstream, store, metrics = served
    scripted.objects = [cm(f"o{i}", i + 1) for i in range(7)]
    worker = reflector(await shape_for(store), store, upstream, metrics)
    assert worker._fill_log.expected is None
    await worker._count_ahead()
    assert scripted.list_limits == ["1"]
    assert worker._fill_log.expected == 7
