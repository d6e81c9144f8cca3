"""``GET /seed``: who is answered (a fake reviewer), and what (a real store on a file)."""

from __future__ import annotations

import contextlib
import hashlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

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
from proxy.serve.certifying import make_pair
from proxy.serve.limiting import Limits
from proxy.serve.securing import ServingCertificate
from proxy.serve.seeding import REVIEW_BURST, SnapshotServer, check_requester
from proxy.upstream.binding import REPLY_HEADER, fingerprint, reply_audience
from proxy.upstream.errors import UpstreamUnavailable
from proxy.upstream.reviewing import UserInfo
from proxy.upstream.seeding import DIGEST_HEADER, SEED_PATH, SeedSettings
from tests.unit.cache.conftest import cm

OWN = UserInfo(username="system:serviceaccount:team:ctl", uid="sa-uid")
"""(The fake apiserver's own identity, and its service account ``team/ctl``.)"""
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


class FakeUpstream:
    """The apiserver's reviews and token requests. A token is ``IDENTITY@AUDIENCE``: the
    TokenReview accepts it for that audience when TOKENS knows the identity."""

    def __init__(self) -> None:
        self.requested: list[str] = []

    async def json_request(self, method: str, target: str, **options: Any) -> dict[str, Any]:
        spec = (options.get("json") or {}).get("spec") or {}
        if target.endswith("/tokenreviews"):
            identity, _, audience = spec["token"].partition("@")
            user = TOKENS.get(identity)
            if user is None or audience not in spec["audiences"]:
                return {"status": {"authenticated": False}}
            payload = {"username": user.username, "uid": user.uid}
            return {"status": {"authenticated": True, "user": payload, "audiences": [audience]}}
        if target.endswith("/selfsubjectreviews"):
            return {"status": {"userInfo": {"username": OWN.username, "uid": OWN.uid}}}
        assert target == "/api/v1/namespaces/team/serviceaccounts/ctl/token", target
        (audience,) = spec["audiences"]
        self.requested.append(audience)
        return {"status": {"token": f"own@{audience}"}}


class Listener:
    def __init__(self, server: SnapshotServer, url: str, upstream: FakeUpstream) -> None:
        self.server, self.url, self.upstream = server, url, upstream

    async def get(
        self, identity: str | None = "own", *, audience: str | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        """``/seed`` with a token of ``identity`` for ``audience`` (default: this
        listener's)."""
        token = f"{identity}@{audience or self.server.audience}"
        headers = {"Authorization": f"Bearer {token}"} if identity else {}
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{self.url}{SEED_PATH}", headers=headers, ssl=False) as answer,
        ):
            return answer.status, dict(answer.headers), await answer.read()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_pair(tmp_path_factory.mktemp("seed-tls"))


@contextlib.asynccontextmanager
async def listener(store: Store | None, certificate: tuple[Path, Path]) -> AsyncIterator[Listener]:
    cert_file, key_file = certificate
    der = ssl.PEM_cert_to_DER_cert(cert_file.read_text())
    server = SnapshotServer(settings=SeedSettings(), certificate=der)
    upstream = FakeUpstream()
    if store is not None:
        server.bind(store=store, upstream=upstream, breaker=None)  # type: ignore[arg-type]
    port = free_port()
    runner, _ = await connections.serve(
        routing.seed_app(server),
        address=("127.0.0.1", port),
        limits=Limits(),
        metrics=Metrics(),
        shutdown_timeout=0.1,
        ssl_context=ServingCertificate(cert_file=cert_file, key_file=key_file).context,
    )
    try:
        yield Listener(server, f"https://127.0.0.1:{port}", upstream)
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


async def test_the_snapshot_is_sent_with_its_length_digest_and_reply_then_deleted(
    store: Store, tmp_path: Path, certificate: tuple[Path, Path]
) -> None:
    await store.record_cluster_identity("cluster-uid")
    async with listener(store, certificate) as served:
        der = ssl.PEM_cert_to_DER_cert(certificate[0].read_text())
        assert served.server.audience == f"warmwatch.io/seed/sha256:{fingerprint(der)}"
        status, headers, body = await served.get()
        assert status == 200
        assert int(headers["Content-Length"]) == len(body)
        assert headers[DIGEST_HEADER] == hashlib.sha256(body).hexdigest()
        # The reply: a token of its own account for this request's token.
        request_token = f"own@{served.server.audience}"
        assert served.upstream.requested == [reply_audience(request_token)]
        assert headers[REPLY_HEADER] == f"own@{reply_audience(request_token)}"
        received = tmp_path / "received.db"
        received.write_bytes(body)
        summary = snapshotting.check_snapshot(received, cluster_uid="cluster-uid")
        assert summary == snapshotting.Summary(shapes=1, objects=50)
        assert sorted(p.name for p in tmp_path.iterdir() if "seed" in p.name) == []


async def test_only_a_token_bound_to_this_listeners_certificate_is_answered(
    store: Store, certificate: tuple[Path, Path]
) -> None:
    """A token for another certificate (one a man in the middle captured) is refused."""
    await store.record_cluster_identity("cluster-uid")
    async with listener(store, certificate) as served:
        other = f"warmwatch.io/seed/sha256:{'0' * 64}"
        assert (await served.get(audience=other))[0] == 401
        assert (await served.get(audience="warmwatch.io/seed"))[0] == 401  # unbound
        assert (await served.get("sibling"))[0] == 403
        assert (await served.get(None))[0] == 401
        assert served.upstream.requested == []  # no reply token made for any of them
        assert (await served.get())[0] == 200


async def test_a_second_request_meanwhile_is_429(
    store: Store, certificate: tuple[Path, Path]
) -> None:
    await store.record_cluster_identity("cluster-uid")
    async with listener(store, certificate) as served:
        async with served.server._serving:
            status, _, body = await served.get()
        assert status == 429 and b'"reason":"TooManyRequests"' in body
        assert (await served.get())[0] == 200


async def test_requests_with_a_token_are_limited_per_address(
    store: Store, certificate: tuple[Path, Path]
) -> None:
    """Each costs a TokenReview: past the burst, 429 before any review."""
    await store.record_cluster_identity("cluster-uid")
    async with listener(store, certificate) as served:
        codes = [(await served.get("stranger"))[0] for _ in range(REVIEW_BURST + 2)]
        assert codes == [401] * REVIEW_BURST + [429, 429]
        assert (await served.get(None))[0] == 401  # no token, no review: not limited


async def test_without_a_cluster_identity_nothing_is_offered(
    store: Store, certificate: tuple[Path, Path]
) -> None:
    async with listener(store, certificate) as served:
        status, _, body = await served.get()
        assert status == 503 and b"kube-system" in body


async def test_while_starting_503(certificate: tuple[Path, Path]) -> None:
    async with listener(None, certificate) as served:
        assert (await served.get())[0] == 503
