"""Discovery answered from confirmed copies (proxy/upstream/discovering.py): the rule as pure
bookkeeping on a fake clock, then against the in-process fake apiserver."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy.kube.status import StatusError
from proxy.metrics import Metrics
from proxy.upstream.connecting import Upstream
from proxy.upstream.discovering import (
    CachedDocument,
    DiscoveryCopies,
    DiscoverySettings,
    changes_discovery,
    discovery_key,
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
)

ACCEPT = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def document(body: bytes = b"{}", *, etag: str | None = '"e1"') -> CachedDocument:
    return CachedDocument(
        status=200, headers=(("Content-Type", "application/json"),), body=body, etag=etag
    )


def copies_with(clock: Clock, **settings: float) -> DiscoveryCopies:
    return DiscoveryCopies(settings=DiscoverySettings(**settings), clock=clock)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------- the rule


def test_a_copy_is_answered_only_while_recently_confirmed() -> None:
    clock = Clock()
    copies = copies_with(clock, max_age=10.0)
    assert copies.answer("k") is None  # never seen
    copies.confirmed("k", document())
    assert copies.answer("k") == document()
    clock.now += 10.0
    assert copies.answer("k") == document()
    clock.now += 0.1
    assert copies.answer("k") is None  # older than max_age: ask the apiserver
    copies.confirmed("k", document(b"new"))
    assert copies.answer("k") == document(b"new")


def test_a_write_to_crds_or_apiservices_passes_discovery_through_for_a_while() -> None:
    clock = Clock()
    copies = copies_with(clock, max_age=10.0, quiet_after_change=60.0)
    copies.confirmed("k", document())
    copies.api_changed()
    assert copies.answer("k") is None
    copies.confirmed("k", document())  # confirmed during the quiet time: still passed through
    clock.now += 59.9
    copies.confirmed("k", document())
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
    copies = copies_with(clock, max_age=10.0, keep_for=100.0, keep_max_bytes=10)
    copies.confirmed("fresh", document())
    copies.confirmed("large-without-etag", document(b"x" * 11, etag=None))
    copies.confirmed("large-with-etag", document(b"x" * 11))
    copies.remember(["stored-earlier"])
    assert [key for key, _ in copies.due()] == ["stored-earlier"]
    clock.now += 5.1  # past half of max_age
    assert [key for key, _ in copies.due()] == ["fresh", "large-with-etag", "stored-earlier"]
    copies.revalidating("fresh", busy=True)
    assert "fresh" not in [key for key, _ in copies.due()]
    copies.revalidating("fresh", busy=False)
    clock.now += 90.0
    copies.answer("fresh")  # asked again: kept
    clock.now += 10.0
    assert [key for key, _ in copies.due()] == ["fresh"]  # the others nobody asked for: dropped
    assert copies.answer("large-with-etag") is None


def test_keys_round_trip() -> None:
    key = discovery_key(path="/openapi/v3/apis/apps/v1", query=[("hash", "AB")], accept="*/*")
    assert parse_discovery_key(key) == ("/openapi/v3/apis/apps/v1?hash=AB", "*/*")
    assert parse_discovery_key(discovery_key(path="/apis", query=[], accept="")) == ("/apis", "")


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
    key = discovery_key(path="/apis", query=[], accept=ACCEPT)
    settings = PassthroughSettings()

    await revalidate(copies, key, None, upstream=upstream, cache=store, settings=settings)
    stored = store.documents[key]  # nothing stored yet: fetched whole, stored, confirmed
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

    gone = discovery_key(path="/status/404", query=[], accept="")
    copies.confirmed(gone, document())
    clock.now += 20.0
    await revalidate(copies, gone, document(), upstream=upstream, cache=store, settings=settings)
    assert copies.answer(gone) is None and gone not in [k for k, _ in copies.due()]
    results = {
        s.labels["result"]: s.value
        for m in metrics.registry.collect()
        if m.name == "warmwatch_discovery_revalidations"
        for s in m.samples
        if s.name.endswith("_total")
    }
    assert results == {"changed": 2.0, "unchanged": 1.0, "gone": 1.0}


async def test_keep_confirmed_keeps_remembered_copies_fresh(
    upstream: Upstream, fake: FakeApiserver
) -> None:
    copies = DiscoveryCopies(settings=DiscoverySettings(max_age=1.0))
    key = discovery_key(path="/api", query=[], accept="application/json")
    copies.remember([key])  # stored by an earlier run
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
