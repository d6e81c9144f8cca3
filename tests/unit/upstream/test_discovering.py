"""Discovery answered from confirmed copies (proxy/upstream/discovering.py): which copy
answers a request, the rule and the bounds as pure bookkeeping on a fake clock, then against
the in-process fake apiserver."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy.kube.status import StatusError
from proxy.metrics import Metrics
from proxy.upstream.connecting import ConnectionBudget, ConnectionSettings, Upstream, connect
from proxy.upstream.discovering import (
    CachedDocument,
    DiscoveryCopies,
    DiscoverySettings,
    changes_discovery,
    discovery_key,
    is_canonical_key,
    keep_confirmed,
    parse_discovery_key,
    revalidate,
)
from proxy.upstream.forwarding import PassthroughSettings
from tests.unit.upstream.conftest import (
    FakeApiserver,
    MemoryDiscoveryCache,
    Served,
    eventually,
    start_proxy,
    token_kubeconfig,
)

ACCEPT = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def document(
    body: bytes = b"{}", *, etag: str | None = '"e1"', cache_control: str = ""
) -> CachedDocument:
    headers: tuple[tuple[str, str], ...] = (("Content-Type", "application/json"),)
    if cache_control:
        headers += (("Cache-Control", cache_control),)
    return CachedDocument(status=200, headers=headers, body=body, etag=etag)


def copies_with(clock: Clock, **settings: float) -> DiscoveryCopies:
    return DiscoveryCopies(settings=DiscoverySettings(**settings), clock=clock)  # type: ignore[arg-type]


# ------------------------------------------------------------------------- the key rule


@pytest.mark.parametrize(
    ("path", "query", "user_agent", "key"),
    [
        # no handler reads these: the path's copy
        ("/version", "n=1", "", "/version?|A"),
        ("/version", "timeout=32s&n=2", "", "/version?|A"),  # client-go's discovery
        ("/version", "timeout=", "", "/version?|A"),  # empty: no timeout
        ("/version", "pretty=true", "curl/8", "/version?|A"),  # always indented
        ("/openapi/v2", "pretty=true&hash=x", "", "/openapi/v2?|A"),
        ("/openapi/v3", "hash=AB", "", "/openapi/v3?|A"),
        # a timeout the apiserver refuses with 400: passed through, not stored
        ("/version", "timeout=32", "", None),
        ("/apis", "timeout=1x&pretty=1", "", None),
        (
            "/openapi/v3/apis/apps/v1",
            "timeout=-1.5h&hash=AB",
            "",
            "/openapi/v3/apis/apps/v1?hash=AB|A",
        ),
        # the negotiated serializer indents JSON: pretty, else the User-Agent
        ("/apis", "pretty=true", "", "/apis?pretty=true|A"),
        ("/apis", "pretty=T&pretty=0", "", "/apis?pretty=true|A"),  # the first value
        ("/apis", "pretty=yes", "curl/8", "/apis?|A"),  # ParseBool fails: false
        ("/apis", "pretty=0", "curl/8", "/apis?|A"),
        ("/apis", "pretty=", "curl/8", "/apis?pretty=true|A"),  # empty: the User-Agent
        ("/apis", "pretty=1;x=2", "", "/apis?|A"),  # Go drops a pair with ';'
        ("/api", "", "Wget/1.21", "/api?pretty=true|A"),
        ("/apis/apps/v1", "", "Mozilla/5.0 (X11)", "/apis/apps/v1?pretty=true|A"),
        ("/api/v1", "watch=true&x=1", "kubectl/v1.37", "/api/v1?|A"),
        # openapi v3 group-versions: the hash
        ("/openapi/v3/apis/apps/v1", "hash=AB&x=1", "", "/openapi/v3/apis/apps/v1?hash=AB|A"),
        ("/openapi/v3/api/v1", "hash=A+B/C", "", "/openapi/v3/api/v1?hash=A%20B%2FC|A"),
        ("/openapi/v3/apis/apps/v1", "hash=&hash=CD", "", "/openapi/v3/apis/apps/v1?|A"),
        # plain health checks only
        ("/healthz", "", "", "/healthz?|A"),
        ("/readyz", "verbose", "", None),
        # not discovery
        ("/api/v1/pods", "", "", None),
        ("/apis/apps/v1/deployments", "", "", None),
        ("/openapi/v4", "", "", None),
    ],
)
def test_the_query_is_in_the_key_only_where_it_changes_the_answer(
    path: str, query: str, user_agent: str, key: str | None
) -> None:
    assert discovery_key(path=path, query=query, accept="A", user_agent=user_agent) == key


def test_keys_round_trip() -> None:
    key = discovery_key(
        path="/openapi/v3/apis/apps/v1", query="hash=A+B", accept="*/*", user_agent=""
    )
    assert key is not None and parse_discovery_key(key) == (
        "/openapi/v3/apis/apps/v1?hash=A%20B",
        "*/*",
    )
    assert is_canonical_key(key)
    plain = discovery_key(path="/apis", query="", accept="", user_agent="")
    assert plain is not None and parse_discovery_key(plain) == ("/apis", "")
    # stored by an earlier build, keyed by the whole query
    assert not is_canonical_key("/version?n=1|*/*")
    assert not is_canonical_key("/apis?timeout=32s|*/*")
    assert is_canonical_key("/apis?pretty=true|*/*")


# ------------------------------------------------------------------------------- the rule


def test_a_copy_is_answered_only_while_recently_confirmed() -> None:
    clock = Clock()
    copies = copies_with(clock, max_age=10.0)
    assert copies.answer("k") is None  # never seen
    assert copies.keep("k", document()).write
    assert copies.answer("k") == document()
    clock.now += 10.0
    assert copies.answer("k") == document()
    clock.now += 0.1
    assert copies.answer("k") is None  # older than max_age: ask the apiserver
    assert copies.keep("k", document(b"new")).write
    assert copies.answer("k") == document(b"new")


def test_an_unchanged_answer_is_confirmed_not_written_again() -> None:
    clock = Clock()
    copies = copies_with(clock, max_age=10.0)
    assert copies.keep("k", document()).write
    clock.now += 20.0
    kept = copies.keep("k", document())
    assert (kept.write, kept.same) == (False, True)
    assert copies.answer("k") == document()  # confirmed again


def test_an_immutable_copy_is_answered_without_revalidation() -> None:
    clock = Clock()
    copies = copies_with(clock, max_age=10.0)
    hashed = document(cache_control="public, immutable")
    copies.keep("hashed", hashed)
    copies.keep("plain", document())
    copies.api_changed()
    clock.now += 3600.0
    assert copies.answer("hashed") == hashed and copies.answer("plain") is None
    assert [key for key, _ in copies.due(limit=10)] == ["plain"]


def test_a_write_to_crds_or_apiservices_passes_discovery_through_for_a_while() -> None:
    clock = Clock()
    copies = copies_with(clock, max_age=10.0, quiet_after_change=60.0)
    copies.keep("k", document())
    copies.api_changed()
    assert copies.answer("k") is None
    copies.keep("k", document())  # confirmed during the quiet time: still passed through
    clock.now += 59.9
    copies.keep("k", document())
    assert copies.answer("k") is None
    clock.now += 0.2
    assert copies.answer("k") == document()


@pytest.mark.parametrize(
    ("path", "changes"),
    [
        ("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", True),
        ("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/a.b.c/status", True),
        ("/apis/apiregistration.k8s.io/v1/apiservices/v1.metrics.k8s.io", True),
        ("/api/v1/namespaces/a/configmaps", False),
        ("/apis/apps/v1/deployments", False),
    ],
)
def test_which_writes_change_discovery(path: str, changes: bool) -> None:
    assert changes_discovery(path) is changes


def test_due_copies() -> None:
    clock = Clock()
    copies = copies_with(clock, max_age=10.0, keep_for=100.0, keep_max_bytes=10, in_use_for=1.0)
    copies.remember([("/api?|earlier", 5)])
    copies.keep("fresh", document())
    copies.keep("large-without-etag", document(b"x" * 11, etag=None))
    copies.keep("large-with-etag", document(b"x" * 11))
    assert [key for key, _ in copies.due(limit=10)] == ["/api?|earlier"]
    clock.now += 5.1  # past half of max_age: the most recently asked first
    assert [key for key, _ in copies.due(limit=10)] == [
        "large-with-etag",
        "fresh",
        "/api?|earlier",
    ]
    copies.revalidating("fresh", busy=True)
    assert "fresh" not in [key for key, _ in copies.due(limit=10)]
    copies.revalidating("fresh", busy=False)
    clock.now += 90.0
    copies.answer("fresh")  # asked again: kept confirmed
    clock.now += 10.0
    assert [key for key, _ in copies.due(limit=10)] == ["fresh"]  # the others: not asked lately
    assert copies.count == 4  # ...but still stored, for an offline start


def test_revalidations_per_pass_are_limited_most_recently_asked_first() -> None:
    clock = Clock()
    copies = copies_with(clock, max_age=10.0)
    for key in "abcde":
        copies.keep(key, document())
        clock.now += 1.0
    copies.answer("a")
    clock.now += 10.0
    assert [key for key, _ in copies.due(limit=3)] == ["a", "e", "d"]


# ------------------------------------------------------------------------------- the bounds


def test_copies_are_bounded_in_count_least_recently_asked_evicted() -> None:
    clock = Clock()
    metrics = Metrics()
    copies = DiscoveryCopies(
        settings=DiscoverySettings(max_copies=3, in_use_for=60.0), clock=clock, metrics=metrics
    )
    for key in ("a", "b", "c"):
        assert copies.keep(key, document(key.encode())).evict == ()
    clock.now += 61.0
    copies.answer("a")  # asked again: the least recently asked is now b
    kept = copies.keep("d", document(b"d"))
    assert (kept.write, kept.evict) == (True, ("b",))
    assert copies.count == 3 and copies.bytes == 3
    assert metrics.value("warmwatch_discovery_copies") == 3
    assert metrics.value("warmwatch_discovery_copy_bytes") == 3
    assert metrics.value("warmwatch_discovery_copies_dropped_total", {"reason": "evicted"}) == 1


def test_copies_in_use_are_never_evicted() -> None:
    clock = Clock()
    metrics = Metrics()
    copies = DiscoveryCopies(
        settings=DiscoverySettings(max_copies=2, in_use_for=60.0), clock=clock, metrics=metrics
    )
    copies.keep("a", document())
    copies.keep("b", document())
    clock.now += 30.0
    kept = copies.keep("c", document())  # a and b were asked within in_use_for
    assert (kept.write, kept.evict) == (False, ())
    assert copies.answer("c") is None and copies.count == 2
    assert metrics.value("warmwatch_discovery_copies_dropped_total", {"reason": "no room"}) == 1
    copies.revalidating("a", busy=True)
    clock.now += 31.0
    assert copies.keep("c", document()).evict == ("b",)  # a is being revalidated


def test_copies_are_bounded_in_bytes() -> None:
    clock = Clock()
    copies = copies_with(clock, max_bytes=10, in_use_for=0.0)
    copies.keep("a", document(b"x" * 4))
    clock.now += 1.0
    copies.keep("b", document(b"x" * 4))
    clock.now += 1.0
    assert copies.keep("c", document(b"x" * 4)).evict == ("a",)
    assert copies.bytes == 8
    clock.now += 1.0
    assert copies.keep("c", document(b"x" * 6)).evict == ()  # replaced: 4 + 6
    assert copies.bytes == 10
    clock.now += 1.0
    kept = copies.keep("d", document(b"x" * 11))  # larger than the bound alone
    assert (kept.write, kept.evict, copies.count) == (False, (), 2)
    assert copies.answer("c") is not None
    assert copies.keep("c", document(b"x" * 11)).write is False  # grown past the bound
    assert copies.answer("c") is None  # the stored one is no longer the apiserver's


def test_a_copy_evicted_while_revalidated_is_not_brought_back() -> None:
    clock = Clock()
    copies = copies_with(clock, max_copies=1, in_use_for=0.0)
    copies.keep("a", document())
    clock.now += 1.0
    copies.keep("b", document())  # evicts a
    assert copies.keep("a", document(b"new"), asked=False).write is False
    assert copies.count == 1


def test_copies_of_an_earlier_run_are_brought_within_the_bounds() -> None:
    clock = Clock()
    copies = copies_with(clock, max_copies=3, max_bytes=100)
    stored = [
        ("/version?n=1|*/*", 10),  # keyed by a query this build leaves out
        ("/apis?|old", 60),
        ("/apis?|a", 30),
        ("/api?|a", 20),
        ("/version?|*/*", 10),
    ]
    assert copies.remember(stored) == ["/version?n=1|*/*", "/apis?|old"]  # oldest first
    assert (copies.count, copies.bytes) == (3, 60)
    clock.now += 1.0  # remembered copies are not in use: evicted first
    assert copies.keep("/openapi/v2?|*/*", document(b"x" * 30)).evict == ("/apis?|a",)


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="--discovery-max-copies must be positive"):
        DiscoverySettings(max_copies=0)


# ------------------------------------------------------------------- against the fake apiserver


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


async def test_a_confirmed_copy_is_answered_without_asking_the_apiserver(
    apiserver: Served, upstream: Upstream, fake: FakeApiserver, session: aiohttp.ClientSession
) -> None:
    clock = Clock()
    copies = copies_with(clock, max_age=10.0)
    proxy = await start_proxy(upstream, credentials="sidecar", copies=copies)
    try:
        url, headers = f"{proxy.url}/apis", {"Accept": ACCEPT}
        async with session.get(url, headers=headers) as response:
            first = await response.read()
        assert fake.discovery_hits == 1
        async with session.get(url, headers=headers) as response:
            assert response.status == 200
            assert await response.read() == first
            assert response.headers["ETag"] == '"etag-apis"'
        async with session.get(url, headers={**headers, "If-None-Match": '"etag-apis"'}) as r304:
            assert r304.status == 304
        assert fake.discovery_hits == 1  # both answered from the copy

        clock.now += 11.0  # unconfirmed for longer than max_age: passed through again
        fake.discovery_version = 2
        async with session.get(url, headers=headers) as response:
            assert response.headers["ETag"] == '"etag-apis-2"'
        assert fake.discovery_hits == 2

        # a CRD created through warmwatch: discovery passes through for a while
        async with session.post(
            f"{proxy.url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions", data=b"{}"
        ) as response:
            assert response.status == 201
        async with session.get(url, headers=headers) as response:
            assert response.status == 200
        assert fake.discovery_hits == 3
    finally:
        await proxy.served.stop()


async def test_a_plain_health_check_is_answered_from_a_confirmed_copy(
    apiserver: Served, upstream: Upstream, fake: FakeApiserver, session: aiohttp.ClientSession
) -> None:
    clock = Clock()
    copies = copies_with(clock, max_age=10.0)

    async def offline(request: web.Request, error: Exception) -> web.StreamResponse:
        return web.Response(status=200, text="warmwatch's own answer")

    proxy = await start_proxy(upstream, credentials="sidecar", copies=copies, offline=offline)
    try:

        def hits() -> int:
            return sum(1 for seen in fake.seen if seen.path_qs.startswith("/healthz"))

        for _ in range(2):
            async with session.get(f"{proxy.url}/healthz") as response:
                assert (response.status, await response.text()) == (200, "ok")
        assert hits() == 1  # the second from the copy
        async with session.get(f"{proxy.url}/healthz?verbose") as response:
            assert response.status == 200
        assert hits() == 2  # a query is always passed through

        fake.unhealthy = True
        clock.now += 11.0  # unconfirmed: asked again, and a failure is not kept
        for expected_hits in (3, 4):
            async with session.get(f"{proxy.url}/healthz") as response:
                assert response.status == 500
            assert hits() == expected_hits

        fake.unhealthy = False
        async with session.get(f"{proxy.url}/healthz") as response:
            assert response.status == 200
        await apiserver.stop()
        clock.now += 11.0  # unreachable: the caller's answer, not the stored "ok"
        async with session.get(f"{proxy.url}/healthz") as response:
            assert await response.text() == "warmwatch's own answer"
    finally:
        await proxy.served.stop()


async def test_revalidation_confirms_replaces_or_forgets(
    upstream: Upstream, fake: FakeApiserver, metrics: Metrics
) -> None:
    clock = Clock()
    copies = copies_with(clock, max_age=10.0)
    store = MemoryDiscoveryCache()
    key = discovery_key(path="/apis", query="", accept=ACCEPT, user_agent="")
    assert key is not None
    settings = PassthroughSettings()

    copies.remember([(key, 0)])  # stored by an earlier run, but unreadable now
    await revalidate(copies, key, None, upstream=upstream, cache=store, settings=settings)
    stored = store.documents[key]  # fetched whole, stored, confirmed
    assert stored.etag == '"etag-apis"' and copies.answer(key) == stored
    assert b'"accept":"' + ACCEPT.encode() in stored.body

    clock.now += 20.0
    await revalidate(copies, key, stored, upstream=upstream, cache=store, settings=settings)
    assert fake.seen[-1].headers["if-none-match"] == '"etag-apis"'  # conditional: a 304
    assert copies.answer(key) == stored

    fake.discovery_version = 3
    clock.now += 20.0
    await revalidate(copies, key, stored, upstream=upstream, cache=store, settings=settings)
    assert store.documents[key].etag == '"etag-apis-3"'
    assert copies.answer(key) == store.documents[key]

    gone, failing = "/status/404?|", "/status/503?|"
    for other in (gone, failing):
        copies.keep(other, document())
        await store.put(other, document())
    clock.now += 20.0
    for other in (gone, failing):
        await revalidate(
            copies, other, document(), upstream=upstream, cache=store, settings=settings
        )
        assert copies.answer(other) is None
    assert gone not in store.documents  # the API is gone: so is its copy
    assert failing in store.documents  # an error: unconfirmed, still there for offline
    assert [k for k, _ in copies.due(limit=10)] == [failing, key]
    results = {
        s.labels["result"]: s.value
        for m in metrics.registry.collect()
        if m.name == "warmwatch_discovery_revalidations"
        for s in m.samples
        if s.name.endswith("_total")
    }
    assert results == {"changed": 2.0, "unchanged": 1.0, "gone": 2.0}


async def test_keep_confirmed_keeps_remembered_copies_fresh(
    upstream: Upstream, fake: FakeApiserver
) -> None:
    copies = DiscoveryCopies(settings=DiscoverySettings(max_age=1.0))
    key = discovery_key(path="/api", query="", accept="application/json", user_agent="")
    assert key is not None
    copies.remember([(key, 0)])  # stored by an earlier run
    task = asyncio.create_task(
        keep_confirmed(
            copies,
            upstream=upstream,
            cache=MemoryDiscoveryCache(),
            breaker=None,
            settings=PassthroughSettings(),
        )
    )
    try:
        await eventually(lambda: copies.answer(key) is not None, timeout=5)
        hits = fake.discovery_hits
        await eventually(lambda: fake.discovery_hits >= hits + 2, timeout=5)  # every max_age/2
        assert copies.answer(key) is not None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_keep_confirmed_revalidates_at_most_its_rate(
    upstream: Upstream, fake: FakeApiserver
) -> None:
    """50 copies due at once (one per Accept header, as a client varying it would make):
    revalidated 5 per pass of 0.25 s, not all 50 every pass."""
    settings = DiscoverySettings(max_age=1.0, revalidation_rate=20.0)
    copies = DiscoveryCopies(settings=settings)
    copies.remember([(f"/apis?|application/json;q=0.{index:02d}", 0) for index in range(1, 51)])
    task = asyncio.create_task(
        keep_confirmed(
            copies,
            upstream=upstream,
            cache=MemoryDiscoveryCache(),
            breaker=None,
            settings=PassthroughSettings(),
        )
    )
    started = time.monotonic()
    try:
        await eventually(lambda: fake.discovery_hits >= 30, timeout=10)
        elapsed = time.monotonic() - started
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    # 30 revalidations at 20 a second (5 per pass): 6 passes, the first after 0.25 s
    assert elapsed >= 6 * 0.25, f"30 revalidations in {elapsed:.2f} s"


async def test_keep_confirmed_outlives_a_full_connection_budget(
    apiserver: Served, fake: FakeApiserver, tmp_path: Path, metrics: Metrics
) -> None:
    """Every discovery connection held by client requests: a revalidation fails with
    UpstreamBusy, counted as an error, and the next pass revalidates again."""
    kubeconfig = token_kubeconfig(tmp_path / "kc", server=apiserver.url, token="t")
    budget = ConnectionBudget(discovery=1, wait=0.01)
    upstream = await connect(
        ConnectionSettings(kubeconfig=str(kubeconfig), budget=budget), metrics=metrics
    )
    copies = DiscoveryCopies(settings=DiscoverySettings(max_age=1.0), metrics=metrics)
    copies.remember([("/api?|application/json", 0)])
    task = asyncio.create_task(
        keep_confirmed(
            copies,
            upstream=upstream,
            cache=MemoryDiscoveryCache(),
            breaker=None,
            settings=PassthroughSettings(),
        )
    )
    errors = {"result": "error"}
    try:
        async with upstream.request("GET", "/slow", stream=True, purpose="discovery"):
            await eventually(
                lambda: (
                    (metrics.value("warmwatch_discovery_revalidations_total", errors) or 0) >= 2
                ),
                timeout=5,
            )
        await eventually(lambda: copies.answer("/api?|application/json") is not None, timeout=5)
        assert not task.done()
    finally:
        fake.gate.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await upstream.close()


async def test_a_query_that_changes_no_answer_shares_the_path_s_copy(
    apiserver: Served, upstream: Upstream, fake: FakeApiserver, session: aiohttp.ClientSession
) -> None:
    """Stored once (an unchanged answer is not written again), answered offline to any such
    query; a query the apiserver refuses is passed through and not stored."""

    class Counting(MemoryDiscoveryCache):
        puts = 0

        async def put(self, key: str, doc: CachedDocument, *, evict: Sequence[str] = ()) -> None:
            self.puts += 1
            await super().put(key, doc, evict=evict)

    cache = Counting()
    proxy = await start_proxy(upstream, credentials="sidecar", discovery=cache)
    try:
        for index in range(20):
            async with session.get(f"{proxy.url}/version?n={index}&timeout=32s") as response:
                assert response.status == 200
        assert fake.discovery_hits == 20  # not answered from copies here (max_age 0)
        assert (list(cache.documents), cache.puts) == (["/version?|*/*"], 1)
        async with session.get(f"{proxy.url}/version?timeout=32") as response:
            assert response.status == 200  # the fake accepts it; the apiserver answers 400
        assert fake.discovery_hits == 21 and list(cache.documents) == ["/version?|*/*"]
        await apiserver.stop()
        async with session.get(f"{proxy.url}/version?n=99") as response:
            assert response.status == 200
            assert orjson.loads(await response.read())["path"] == "/version"
        async with session.get(f"{proxy.url}/version?timeout=32") as response:
            assert response.status == 503  # not the path's copy: the apiserver's answer
    finally:
        await proxy.served.stop()


async def test_offline_copies_only_for_admitted_clients(
    apiserver: Served, upstream: Upstream, session: aiohttp.ClientSession
) -> None:
    """``--client-auth delegated``: while the apiserver is unreachable a stored document is
    answered only to a client the admission check lets through."""

    async def admit(request: web.BaseRequest) -> None:
        if request.headers.get("Authorization") != "Bearer known":
            raise StatusError.service_unavailable("cannot be authenticated now")

    proxy = await start_proxy(upstream, credentials="client", discovery_offline=admit)
    try:
        url = f"{proxy.url}/apis"
        async with session.get(url, headers={"Authorization": "Bearer known"}) as response:
            assert response.status == 200
        await apiserver.stop()
        async with session.get(url, headers={"Authorization": "Bearer known"}) as response:
            assert response.status == 200
            assert orjson.loads(await response.read())["kind"] == "APIGroupList"
        for headers in ({}, {"Authorization": "Bearer other"}):
            async with session.get(url, headers=headers) as response:
                assert response.status == 503
                assert orjson.loads(await response.read())["kind"] == "Status"
    finally:
        await proxy.served.stop()
