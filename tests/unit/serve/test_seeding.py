"""``GET /seed``: who is answered (a fake reviewer), and what (a real store on a file)."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from loadtest.ports import free_port
from proxy.cache import snapshotting
from proxy.cache.shapes import ShapeKey
from proxy.cache.store import Store, StoreSettings
from proxy.kube.resources import GroupVersionResource
from proxy.kube.status import StatusError
from proxy.metrics import Metrics
from proxy.serve import connections, routing
from proxy.serve.limiting import Limits
from proxy.serve.seeding import SnapshotServer, check_requester
from proxy.upstream.errors import UpstreamUnavailable
from proxy.upstream.reviewing import UserInfo
from proxy.upstream.seeding import DIGEST_HEADER, SEED_PATH, SeedSettings
from tests.unit.cache.conftest import cm

OWN = UserInfo(username="system:serviceaccount:team:ctl", uid="sa-uid")
TOKENS = {
    "own": OWN,
    "sibling": UserInfo(username="system:serviceaccount:team:other", uid="other-uid"),
    "recreated": UserInfo(username=OWN.username, uid="new-uid"),
}


async def review(token: str) -> UserInfo | None:
    return TOKENS.get(token)


async def own() -> UserInfo:
    return OWN


async def code_of(token: str | None) -> int:
    try:
        await check_requester(token, review=review, own=own)
    except StatusError as error:
        return error.code
    return 200


async def test_only_warmwatchs_own_identity_is_answered() -> None:
    assert await code_of("own") == 200
    assert await code_of(None) == 401  # no bearer token
    assert await code_of("not-accepted") == 401  # or not for the audience
    assert await code_of("sibling") == 403  # another service account
    assert await code_of("recreated") == 403  # same name, another account


async def test_a_review_that_cannot_be_made_is_503() -> None:
    async def unreachable(token: str) -> UserInfo | None:
        raise UpstreamUnavailable("connection refused")

    with pytest.raises(StatusError) as refused:
        await check_requester("own", review=unreachable, own=own)
    assert refused.value.code == 503


class Listener:
    def __init__(self, server: SnapshotServer, url: str) -> None:
        self.server, self.url = server, url

    async def get(self, token: str | None = "own") -> tuple[int, dict[str, str], bytes]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{self.url}{SEED_PATH}", headers=headers) as answer,
        ):
            return answer.status, dict(answer.headers), await answer.read()


@contextlib.asynccontextmanager
async def listener(store: Store | None, *, loopback: bool = True) -> AsyncIterator[Listener]:
    server = SnapshotServer(loopback=loopback, settings=SeedSettings())
    if store is not None:
        server.bind(store=store, upstream=None, breaker=None)  # type: ignore[arg-type]
        server._review = review  # the fake reviewer
        server._own = OWN
    app = routing.health_app(metrics=Metrics(), ready=lambda: (True, "ok"), snapshots=server)
    port = free_port()
    runner, _ = await connections.serve(
        app,
        address=("127.0.0.1", port),
        limits=Limits(),
        metrics=Metrics(),
        shutdown_timeout=0.1,
        ssl_context=None,
    )
    try:
        yield Listener(server, f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    store = await Store.open(StoreSettings(path=tmp_path / "cache.db"))
    shape = await store.ensure_shape(
        ShapeKey.of(GroupVersionResource.parse("v1/configmaps")), configured=True
    )
    await store.begin_list(shape)
    await store.stage(shape, [cm(f"cm-{i}", i + 1) for i in range(50)])
    await store.finish_list(shape, rv="51", kind="ConfigMap", api_version="v1")
    yield store
    await store.close()


async def test_the_snapshot_is_sent_with_its_length_and_digest_then_deleted(
    store: Store, tmp_path: Path
) -> None:
    await store.record_cluster_identity("cluster-uid")
    async with listener(store) as served:
        status, headers, body = await served.get()
        assert status == 200
        assert int(headers["Content-Length"]) == len(body)
        assert headers[DIGEST_HEADER] == hashlib.sha256(body).hexdigest()
        received = tmp_path / "received.db"
        received.write_bytes(body)
        summary = snapshotting.check_snapshot(received, cluster_uid="cluster-uid")
        assert summary == snapshotting.Summary(shapes=1, objects=50)
        assert sorted(p.name for p in tmp_path.iterdir() if "seed" in p.name) == []
        assert (await served.get("sibling"))[0] == 403
        assert (await served.get(None))[0] == 401


async def test_a_second_request_meanwhile_is_429(store: Store) -> None:
    await store.record_cluster_identity("cluster-uid")
    async with listener(store) as served:
        async with served.server._serving:
            status, _, body = await served.get()
        assert status == 429 and b'"reason":"TooManyRequests"' in body
        assert (await served.get())[0] == 200


async def test_without_a_cluster_identity_nothing_is_offered(store: Store) -> None:
    async with listener(store) as served:
        status, _, body = await served.get()
        assert status == 503 and b"kube-system" in body


async def test_beyond_loopback_every_request_is_403(store: Store) -> None:
    await store.record_cluster_identity("cluster-uid")
    async with listener(store, loopback=False) as served:
        status, _, body = await served.get()
        assert status == 403 and b"TLS" in body


async def test_while_starting_503() -> None:
    async with listener(None) as served:
        assert (await served.get())[0] == 503
