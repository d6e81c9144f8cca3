"""The syncer against an in-process apiserver that answers WatchList and then keeps each
watch open, as the real one does: many shapes fill at once without starving, two clients
asking for one new shape get one shape, a failed reflector is restarted, and a shape whose
access is revoked upstream stops being served.

The real controllers (kube-controller-manager's dozen informers) are end-to-end tests; these
pin down the mechanisms in milliseconds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from proxy.cache.shapes import Shape, ShapeKey
from proxy.cache.store import Store, StoreSettings
from proxy.kube.resources import GroupVersionResource
from proxy.metrics import Metrics
from proxy.upstream.connecting import ConnectionSettings, connect
from proxy.upstream.errors import UpstreamStatusError
from proxy.upstream.reflecting import Reflector, ReflectorSettings
from proxy.upstream.resilience import (
    BackoffSettings,
    BreakerState,
    CircuitBreaker,
    ListLimiter,
    ListLimiterSettings,
    ListSlot,
)
from proxy.upstream.syncing import Syncer, SyncSettings
from tests.unit.upstream.conftest import eventually, token_kubeconfig
from tests.unit.upstream.test_reflecting import status

CONFIGMAPS = GroupVersionResource.parse("v1/configmaps")


def key(namespace: str) -> ShapeKey:
    return ShapeKey.of(CONFIGMAPS, namespace=namespace)


def cm(namespace: str, name: str, rv: int) -> dict[str, Any]:
    return {
        "kind": "ConfigMap",
        "apiVersion": "v1",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": str(rv)},
    }


@dataclass
class Apiserver:
    """WatchList: three objects, a pause (so fills overlap), the initial-events-end bookmark,
    then the watch stays open and streams what a test pushes. ``denied[ns]`` answers that
    code to every later request for the namespace and ends its open watches."""

    initial_delay: float = 0.05
    rv: int = 100
    denied: dict[str, int] = field(default_factory=dict)
    initial_now: int = 0
    initial_max: int = 0
    lists: list[str] = field(default_factory=list)
    resumes: int = 0
    """Watches from an RV (not WatchList)."""
    queues: dict[str, list[asyncio.Queue[dict[str, Any] | None]]] = field(
        default_factory=lambda: defaultdict(list)
    )

    def push(self, namespace: str, event: dict[str, Any]) -> None:
        for queue in self.queues[namespace]:
            queue.put_nowait(event)

    def deny(self, namespace: str, code: int) -> None:
        self.denied[namespace] = code
        for queue in self.queues[namespace]:
            queue.put_nowait(None)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        namespace = request.match_info["namespace"]
        if namespace in self.denied:
            code = self.denied[namespace]
            reason = {403: "Forbidden", 404: "NotFound"}.get(code, "InternalError")
            return web.json_response(status(code, reason), status=code)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.queues[namespace].append(queue)
        try:
            await response.prepare(request)
            if "sendInitialEvents" not in request.query:
                self.resumes += 1
            else:
                self.lists.append(namespace)
                self.initial_now += 1
                self.initial_max = max(self.initial_max, self.initial_now)
                try:
                    for i in range(3):
                        event = {"type": "ADDED", "object": cm(namespace, f"o{i}", self.rv - i)}
                        await response.write(orjson.dumps(event) + b"\n")
                    await asyncio.sleep(self.initial_delay)
                finally:
                    self.initial_now -= 1
                bookmark = {
                    "kind": "ConfigMap",
                    "apiVersion": "v1",
                    "metadata": {
                        "resourceVersion": str(self.rv),
                        "annotations": {"k8s.io/initial-events-end": "true"},
                    },
                }
                await response.write(orjson.dumps({"type": "BOOKMARK", "object": bookmark}) + b"\n")
            while request.transport is not None and not request.transport.is_closing():
                try:
                    event = await asyncio.wait_for(queue.get(), 0.05)
                except TimeoutError:
                    continue
                if event is None:
                    break
                await response.write(orjson.dumps(event) + b"\n")
        finally:
            self.queues[namespace].remove(queue)
        return response


FAST = BackoffSettings(initial=0.02, cap=0.05, jitter=0.0)


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[tuple[Apiserver, Store, Metrics, Any]]:
    """The fake apiserver, a store, metrics, and ``make(limit=...)`` for a started Syncer
    (whose every list takes a slot of the limiter unless ``free_bytes`` says otherwise)."""
    apiserver = Apiserver()
    app = web.Application()
    app.router.add_get("/api/v1/namespaces/{namespace}/configmaps", apiserver.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    metrics = Metrics()
    kubeconfig = token_kubeconfig(tmp_path / "kc", server=f"http://127.0.0.1:{port}", token="t")
    upstream = await connect(ConnectionSettings(kubeconfig=str(kubeconfig)), metrics=metrics)
    store = await Store.open(StoreSettings(path=tmp_path / "cache.db"), metrics=metrics)
    syncers: list[Syncer] = []

    async def make(
        *,
        limit: int = 3,
        configured: tuple[ShapeKey, ...] = (),
        idle_timeout: float = 120.0,
        max_shapes: int = 500,
        free_bytes: int = 0,
    ) -> Syncer:
        syncer = Syncer(
            store=store,
            upstream=upstream,
            settings=SyncSettings(backoff=FAST, maintenance_interval=3600, max_shapes=max_shapes),
            reflector_settings=ReflectorSettings(
                watch_timeout_min=60, watch_timeout_max=60, idle_timeout=idle_timeout
            ),
            limiter=ListLimiter(ListLimiterSettings(concurrent_lists=limit, free_bytes=free_bytes)),
            breaker=CircuitBreaker(target="apiserver"),
            metrics=metrics,
        )
        await syncer.start(configured)
        syncers.append(syncer)
        return syncer

    yield apiserver, store, metrics, make
    for syncer in syncers:
        await syncer.stop()
    for queues in apiserver.queues.values():
        for queue in queues:
            queue.put_nowait(None)
    await store.close()
    await upstream.close()
    await runner.cleanup()


async def test_watchlists_found_large_pause_until_a_slot_is_free(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A WatchList that has received ``free_bytes`` stops reading until it holds a slot (its
    stream waits in TCP); each such fill still completes, one at a time with one slot."""
    _, store, _, make = world
    syncer = await make(limit=1, free_bytes=1)
    holders: list[ListSlot] = []
    active: list[int] = []
    waiting: list[int] = []
    hold, release = ListSlot.hold, ListSlot.release

    async def counted_hold(slot: ListSlot) -> None:
        waiting.append(waiting[-1] + 1 if waiting else 1)
        try:
            await hold(slot)
        finally:
            waiting.append(waiting[-1] - 1)
        if slot.held and slot not in holders:
            holders.append(slot)
            active.append(len(holders))

    def counted_release(slot: ListSlot) -> None:
        release(slot)
        if slot in holders:
            holders.remove(slot)

    monkeypatch.setattr(ListSlot, "hold", counted_hold)
    monkeypatch.setattr(ListSlot, "release", counted_release)
    shapes = [await syncer.learn(key(f"n{i}")) for i in range(5)]
    filled = await asyncio.wait_for(
        asyncio.gather(*(syncer.wait_filled(shape) for shape in shapes if shape)), 10
    )
    assert filled == [True] * 5
    assert max(active) == 1 and max(waiting) >= 2  # the pause happened, one list at a time
    for shape in shapes:
        assert shape is not None
        async with store.snapshot(shape) as snapshot:
            assert [len(rows) async for rows in snapshot.rows] == [3]


async def test_twenty_shapes_fill_concurrently_with_three_list_slots(world: Any) -> None:
    """Each WatchList stays open as its shape's watch; only the initial-events phase holds a
    slot, so every client is answered from the cache and none waits for a timeout."""
    apiserver, store, _, make = world
    syncer = await make(limit=3)

    async def client(namespace: str) -> bool:
        shape = await syncer.learn(key(namespace))
        filled: bool = await syncer.wait_filled(shape)
        return filled

    started = time.monotonic()
    answers = await asyncio.wait_for(
        asyncio.gather(*(client(f"n{i}") for i in range(20))), timeout=10
    )
    assert answers == [True] * 20  # all filled, none passed through
    assert apiserver.initial_max == 3  # the limit held, and was used
    assert sorted(apiserver.lists) == sorted(f"n{i}" for i in range(20))  # one fill each
    assert len(apiserver.queues) == 20 and all(len(q) == 1 for q in apiserver.queues.values())
    # 20 fills of ~50 ms, three at a time: well under a second, not 20 x a timeout.
    assert time.monotonic() - started < 5
    assert all(store.shapes[key(f"n{i}")].rv == "100" for i in range(20))


async def test_a_client_waits_for_a_queued_fill_while_the_queue_moves(world: Any) -> None:
    """With one slot and slow fills, the last client waits longer than the stall bound
    would allow for one fill alone; it is not passed through, because fills progress."""
    apiserver, _, _, make = world
    apiserver.initial_delay = 0.3
    syncer = await make(limit=1)
    object.__setattr__(syncer.settings, "fill_stall", 0.5)  # frozen dataclass, test only
    shapes = [await syncer.learn(key(f"q{i}")) for i in range(4)]
    answers = await asyncio.gather(*(syncer.wait_filled(s) for s in shapes))
    assert answers == [True] * 4


async def test_two_clients_learning_the_same_shape_get_one_shape(world: Any) -> None:
    _, store, _, make = world
    syncer = await make()
    first, second = await asyncio.gather(syncer.learn(key("same")), syncer.learn(key("same")))
    assert first is second
    assert [s.key for s in store.shapes.values()] == [key("same")]
    assert await syncer.wait_filled(first)


async def test_a_request_finding_a_new_shape_before_its_learner_resumed_waits_for_its_fill(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new shape is in the store from its insert on, before the client that learned it has
    resumed to start its reflector. Another client's request planned in between finds the
    shape unfilled and waits for its fill; it was passed through as if the fill had failed
    (its list then came from the apiserver, at an RV older than the fill's, and its watch
    from that RV got 410 from the cache: a relist the apiserver would not have caused)."""
    _, _, _, make = world
    syncer = await make()
    requests: list[asyncio.Task[tuple[bool, bool]]] = []
    remember = Store._remember

    async def request(shape: Shape) -> tuple[bool, bool]:
        before_learner = shape.key not in syncer.reflectors
        return before_learner, await syncer.wait_filled(shape)

    def remember_then_plan(self: Store, row: tuple[Any, ...], *, how: str) -> Shape:
        shape = remember(self, row, how=how)
        # Scheduled here, the request runs before the learner's await returns.
        requests.append(asyncio.create_task(request(shape)))
        return shape

    monkeypatch.setattr(Store, "_remember", remember_then_plan)
    shape = await syncer.learn(key("early"))
    assert shape is not None and len(requests) == 1
    assert await asyncio.wait_for(requests[0], 10) == (True, True)  # early, and filled
    assert shape.rv == "100" and len(syncer.reflectors) == 1  # one reflector


async def test_store_creates_a_shape_once_under_concurrent_calls(tmp_path: Path) -> None:
    store = await Store.open(StoreSettings(path=tmp_path / "c.db"))
    try:
        shapes = await asyncio.gather(
            *(store.ensure_shape(key("race"), configured=False) for _ in range(5))
        )
        assert len({id(s) for s in shapes}) == 1
    finally:
        await store.close()


async def test_a_refused_learned_shape_is_dropped_and_its_client_told(world: Any) -> None:
    apiserver, store, metrics, make = world
    apiserver.denied["secret"] = 403
    syncer = await make()
    shape = await syncer.learn(key("secret"))
    outcome: bool | int
    try:
        outcome = await syncer.wait_filled(shape)
    except UpstreamStatusError as error:  # the refusal itself, when the client saw it first
        outcome = error.code
    assert outcome in (False, 403)  # either way the client is passed through
    await eventually(lambda: key("secret") not in store.shapes)
    # Never listed, and no discovery document seen that names it: counted as "other" (a
    # made-up resource must not name a series).
    assert metrics.value(
        "warmwatch_shapes_dropped_total", {"resource": "other", "reason": "refused"}
    )
    # Not learned again for a while: its requests pass through without an upstream list
    # each (a hostile or mistaken client repeating them).
    assert await syncer.learn(key("secret")) is None
    assert key("secret") not in store.shapes
    syncer.settings = dataclasses.replace(syncer.settings, refused_for=0.0)
    assert await syncer.learn(key("secret")) is not None


async def test_a_failed_reflector_is_restarted_and_counted(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    apiserver, store, metrics, make = world
    original = Reflector._apply
    failures = [RuntimeError("a bug")]

    async def flaky(self: Reflector, events: list[Any]) -> None:
        if failures:
            raise failures.pop()
        await original(self, events)

    monkeypatch.setattr(Reflector, "_apply", flaky)
    syncer = await make()
    shape = await syncer.learn(key("flaky"))
    assert await syncer.wait_filled(shape)
    await eventually(lambda: len(apiserver.queues["flaky"]) == 1)
    apiserver.push("flaky", {"type": "ADDED", "object": cm("flaky", "late", 101)})
    await eventually(
        lambda: (
            metrics.value(
                "warmwatch_reflector_restarts_total",
                {"resource": "v1/configmaps", "reason": "failed"},
            )
            == 1
        )
    )
    # The restarted reflector resumes from the committed RV and follows again.
    await eventually(lambda: apiserver.resumes == 1 and len(apiserver.queues["flaky"]) == 1)
    apiserver.push("flaky", {"type": "ADDED", "object": cm("flaky", "later", 102)})
    await eventually(lambda: store.shapes[key("flaky")].rv == "102")
    assert not failures


@pytest.mark.parametrize("code", [403, 404])
async def test_revoked_access_drops_a_filled_shape_and_ends_its_watches(
    world: Any, code: int
) -> None:
    apiserver, store, metrics, make = world
    syncer = await make()
    shape = await syncer.learn(key("revoked"))
    assert await syncer.wait_filled(shape)
    await eventually(lambda: len(apiserver.queues["revoked"]) == 1)
    apiserver.deny("revoked", code)
    await eventually(lambda: key("revoked") not in store.shapes)
    assert shape.log.closed  # open watches end; clients then get the apiserver's answer
    assert metrics.value(
        "warmwatch_shapes_dropped_total", {"resource": "v1/configmaps", "reason": "revoked"}
    )


async def test_a_revoked_configured_shape_starts_over_and_refills(world: Any) -> None:
    apiserver, store, metrics, make = world
    syncer = await make(configured=(key("conf"),))
    await eventually(lambda: syncer.ready())
    first = store.shapes[key("conf")]
    await eventually(lambda: len(apiserver.queues["conf"]) == 1)
    apiserver.deny("conf", 403)
    await eventually(lambda: store.shapes.get(key("conf")) is not first)
    assert first.log.closed
    assert not syncer.ready()  # refused while access is missing: not serveable
    del apiserver.denied["conf"]  # access granted again
    await eventually(lambda: syncer.ready())
    assert store.shapes[key("conf")].configured
    assert (
        metrics.value(
            "warmwatch_reflector_restarts_total",
            {"resource": "v1/configmaps", "reason": "revoked"},
        )
        == 1
    )


async def test_a_silent_upstream_watch_is_replaced_without_counting_as_a_failure(
    world: Any,
) -> None:
    """An upstream watch that says nothing for the idle bound may be on a dead connection (a
    node gone without a reset; found by review: a watch had no read timeout at all), or be the
    watch of a quiet collection: the apiserver's bookmarks do not advance while its watch
    cache's resourceVersion does not (measured: kube-controller-manager's idle collections,
    silent past two minutes, all replaced at once, opened the circuit breaker, and every
    passed-through write failed for 15 s). So it is replaced at once, and is no failure."""
    apiserver, store, metrics, make = world
    syncer = await make(idle_timeout=0.3)
    shape = await syncer.learn(key("quiet"))
    assert await syncer.wait_filled(shape)
    await eventually(lambda: apiserver.resumes >= 6, timeout=5)  # silent, replaced, ...
    restarts = {"resource": shape.resource}
    assert metrics.value("warmwatch_upstream_watch_restarts_total", {**restarts, "reason": "idle"})
    assert not metrics.value(
        "warmwatch_upstream_watch_restarts_total", {**restarts, "reason": "error"}
    )
    assert syncer.breaker.state is BreakerState.CLOSED  # five failures would have opened it
    # ... and the replacement delivers (pushed until a live watch takes it: each one is
    # itself replaced after 0.3 s of silence).
    for _ in range(50):
        apiserver.push("quiet", {"type": "ADDED", "object": cm("quiet", "late", 101)})
        await asyncio.sleep(0.1)
        if store.shapes[key("quiet")].rv == "101":
            break
    assert store.shapes[key("quiet")].rv == "101"


async def test_learning_stops_at_the_shape_limit(world: Any) -> None:
    """Found by review: every new namespace or selector became an upstream watch, without
    bound. Beyond --max-shapes learned shapes, requests pass through."""
    _, store, metrics, make = world
    syncer = await make(max_shapes=2, configured=(key("conf"),))
    assert await syncer.learn(key("a")) is not None
    assert await syncer.learn(key("b")) is not None
    assert await syncer.learn(key("c")) is None
    assert await syncer.learn(key("a")) is store.shapes[key("a")]  # known ones still serve
    assert metrics.value("warmwatch_shape_limit_total", {"reason": "shapes"}) == 1
    assert len(store.shapes) == 3  # two learned, one configured


async def test_maintenance_reports_each_logs_bytes(world: Any) -> None:
    apiserver, _, metrics, make = world
    syncer = await make()
    shape = await syncer.learn(key("a"))
    assert shape is not None and await syncer.wait_filled(shape)
    apiserver.push("a", {"type": "MODIFIED", "object": cm("a", "o0", 101)})
    await eventually(lambda: shape.rv == "101", timeout=5)
    await syncer.maintain_once()
    labels = {"resource": "v1/configmaps", "shape": str(shape.id)}
    assert metrics.value("warmwatch_shape_log_bytes", labels) == shape.log_bytes > 0


async def test_dropping_a_shape_dropped_meanwhile_leaves_its_successor_alone(
    world: Any,
) -> None:
    """Found by review: maintenance goes through a copy of the shapes; one dropped meanwhile
    (revoked) and learned again had its successor's reflector cancelled when maintenance
    dropped the old one as unused, and the new shape was served without a watch."""
    _, store, _, make = world
    syncer = await make()
    old = await syncer.learn(key("a"))
    assert old is not None
    await store.drop_shape(old)  # as its supervisor does when access is revoked
    new = await syncer.learn(key("a"))
    assert new is not None and new is not old
    running = syncer._tasks[key("a")]
    await syncer.drop(old)  # the maintenance pass, with its copy
    assert syncer._tasks.get(key("a")) is running and not running.done()
    assert store.shapes[key("a")] is new


def selecting(namespace: str, *, label_bytes: int, field_bytes: int) -> ShapeKey:
    return dataclasses.replace(
        key(namespace), label_selector="l" * label_bytes, field_selector="f" * field_bytes
    )


async def test_a_shape_is_not_learned_from_selectors_longer_than_its_key_may_be(
    world: Any,
) -> None:
    """Found by a probe: 12 shapes learned from label selectors of 683 KiB took warmwatch
    from 50 to 234 MiB; --max-shapes bounds how many shapes there are, not their size.
    Label and field selectors count together; such a request passes through."""
    _, store, metrics, make = world
    syncer = await make()
    longest = selecting("a", label_bytes=4000, field_bytes=96)
    assert longest.selector_bytes == SyncSettings().max_key_bytes
    assert await syncer.learn(longest) is store.shapes[longest]
    too_long = selecting("a", label_bytes=4000, field_bytes=97)
    assert await syncer.learn(too_long) is None
    assert too_long not in store.shapes
    assert metrics.value("warmwatch_shape_limit_total", {"reason": "key_bytes"}) == 1
    assert metrics.value("warmwatch_shape_limit_total", {"reason": "shapes"}) is None


async def test_a_shape_learned_with_a_longer_key_before_is_dropped_at_start(world: Any) -> None:
    """A database of an earlier build may hold such shapes: they are neither watched nor
    served (nor kept in memory)."""
    _, store, metrics, make = world
    kept = selecting("a", label_bytes=10, field_bytes=0)
    oversized = selecting("b", label_bytes=683 * 1024, field_bytes=0)
    for learned in (kept, oversized):
        await store.ensure_shape(learned, configured=False)
    metrics.resources.hold("v1/configmaps")  # a resource the apiserver serves
    syncer = await make()
    assert set(store.shapes) == {kept}
    assert set(syncer.reflectors) == {kept}
    dropped = {"resource": "v1/configmaps", "reason": "oversized"}
    assert metrics.value("warmwatch_shapes_dropped_total", dropped) == 1
