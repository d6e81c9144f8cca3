"""Seeding from a fake peer (a small aiohttp server over TLS) with a fake apiserver (the
cluster's identity, warmwatch's own, its tokens and their reviews): a good snapshot is
installed, asked with a token bound to the peer's certificate; a refusal, a peer that does
not prove to be warmwatch's own account, a truncated or corrupted answer, another cluster's
snapshot, an unreadable cluster identity or a peer too slow give a cold start with no file
left; a database already there is never replaced."""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from aiohttp import web

from loadtest.ports import free_port
from proxy.cache import snapshotting
from proxy.metrics import Metrics
from proxy.serve.certifying import make_pair
from proxy.upstream.binding import AUDIENCE, REPLY_HEADER, fingerprint, reply_audience
from proxy.upstream.connecting import ConnectionSettings, Upstream, connect
from proxy.upstream.errors import UpstreamStatusError
from proxy.upstream.reviewing import review_token
from proxy.upstream.seeding import DIGEST_HEADER, SEED_PATH, SeedSettings, seed
from tests.unit.cache.test_snapshotting import CLUSTER, database, snapshot_of
from tests.unit.upstream.conftest import Served, token_kubeconfig

OWN = {"username": "system:serviceaccount:team:ctl", "uid": "sa-uid"}


@dataclass
class FakeUpstream:
    """The apiserver: ``kube-system`` (the cluster's identity), a SelfSubjectReview
    (``identity``), TokenRequests (a token is ``USERNAME@AUDIENCE``) and TokenReviews of
    such tokens."""

    uid: str | None = CLUSTER
    identity: dict[str, str] = field(default_factory=lambda: dict(OWN))
    asked: list[str] = field(default_factory=list)
    audiences: list[str] = field(default_factory=list)
    """Of the tokens requested."""

    async def json_request(self, method: str, target: str, **options: Any) -> dict[str, Any]:
        self.asked.append(f"{method} {target}")
        spec = (options.get("json") or {}).get("spec") or {}
        if target.endswith("/selfsubjectreviews"):
            return {"status": {"userInfo": self.identity}}
        if target.endswith("/token"):
            assert target == "/api/v1/namespaces/team/serviceaccounts/ctl/token"
            self.audiences += spec["audiences"]
            return {"status": {"token": f"{OWN['username']}@{spec['audiences'][0]}"}}
        if target.endswith("/tokenreviews"):
            username, _, audience = spec["token"].partition("@")
            if audience not in spec["audiences"]:
                return {"status": {"authenticated": False}}
            user = {"username": username, "uid": OWN["uid"]}
            return {"status": {"authenticated": True, "user": user, "audiences": [audience]}}
        if self.uid is None:
            raise UpstreamStatusError(
                code=403, reason="Forbidden", message="forbidden", status={"code": 403}
            )
        return {"metadata": {"name": "kube-system", "uid": self.uid}}


@dataclass
class FakePeer:
    body: bytes
    answer: str = "good"
    tokens: list[str] = field(default_factory=list)

    def reply(self, token: str) -> str:
        """The reply token: a real peer's, or an impostor's."""
        if self.answer == "impostor":  # another account's token for this request
            return f"system:serviceaccount:team:other@{reply_audience(token)}"
        if self.answer == "replayed":  # its account's, for another request
            return f"{OWN['username']}@{reply_audience('another request')}"
        return f"{OWN['username']}@{reply_audience(token)}"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        self.tokens.append(token)
        if self.answer == "refuse":
            return web.json_response({"kind": "Status", "code": 403}, status=403)
        if self.answer == "slow":
            await asyncio.sleep(30)
        body, digest = self.body, hashlib.sha256(self.body).hexdigest()
        if self.answer == "corrupt":  # a byte flipped in transit, after the digest
            body = body[:5000] + bytes([body[5000] ^ 1]) + body[5001:]
        headers = {DIGEST_HEADER: digest}
        if self.answer != "no-reply":
            headers[REPLY_HEADER] = self.reply(token)
        response = web.StreamResponse(headers=headers)
        response.content_length = len(body)
        await response.prepare(request)
        if self.answer == "truncated":
            await response.write(body[: len(body) // 2])
            assert request.transport is not None
            request.transport.close()
            return response
        await response.write(body)
        await response.write_eof()
        return response


@dataclass
class Peer:
    fake: FakePeer
    address: tuple[str, int]
    certificate: bytes
    """Its DER certificate."""


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_pair(tmp_path_factory.mktemp("peer-tls"))


@pytest.fixture
async def peer(tmp_path: Path, pair: tuple[Path, Path]) -> AsyncIterator[Peer]:
    body = snapshot_of(database(tmp_path / "peer.db"), tmp_path / "peer-snapshot.db").read_bytes()
    fake = FakePeer(body=body)
    app = web.Application()
    app.router.add_get(SEED_PATH, fake.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*pair)
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=context).start()
    der = ssl.PEM_cert_to_DER_cert(pair[0].read_text())
    yield Peer(fake=fake, address=("127.0.0.1", port), certificate=der)
    await runner.cleanup()


def settings(address: tuple[str, int], **options: Any) -> SeedSettings:
    return SeedSettings(peers=(address,), **options)


async def run(
    tmp_path: Path, seeding: SeedSettings, *, upstream: FakeUpstream | None = None
) -> tuple[str, Metrics, Path]:
    metrics = Metrics()
    target = tmp_path / "new" / "cache.db"
    target.parent.mkdir(exist_ok=True)
    result = await seed(
        seeding,
        upstream=cast(Upstream, upstream or FakeUpstream()),
        database=target,
        metrics=metrics,
    )
    assert metrics.value("warmwatch_seedings_total", {"result": result}) == 1
    return result, metrics, target


def leftovers(target: Path) -> list[str]:
    return sorted(path.name for path in target.parent.iterdir())


async def test_a_good_snapshot_is_installed_asked_with_a_token_bound_to_the_peer(
    tmp_path: Path, peer: Peer
) -> None:
    upstream = FakeUpstream()
    result, metrics, target = await run(tmp_path, settings(peer.address), upstream=upstream)
    assert result == "installed"
    bound = f"warmwatch.io/seed/sha256:{fingerprint(peer.certificate)}"
    assert upstream.audiences == [bound]
    assert peer.fake.tokens == [f"{OWN['username']}@{bound}"]
    assert target.read_bytes() == peer.fake.body
    assert leftovers(target) == ["cache.db"]
    assert target.stat().st_mode & 0o077 == 0
    assert metrics.value("warmwatch_seeding_bytes_total") == len(peer.fake.body)
    assert snapshotting.check_snapshot(target, cluster_uid=CLUSTER).objects == 300


@pytest.mark.parametrize("answer", ["no-reply", "impostor", "replayed"])
async def test_a_peer_that_does_not_prove_itself_is_not_read(
    tmp_path: Path, peer: Peer, answer: str
) -> None:
    """An impostor (no reply token, another account's, or one for another request) could
    send forged objects: nothing of its answer is written."""
    peer.fake.answer = answer
    result, metrics, target = await run(tmp_path, settings(peer.address))
    assert (result, leftovers(target)) == ("failed", [])
    assert metrics.value("warmwatch_seeding_bytes_total") == 0


async def test_a_peer_whose_certificate_changed_is_not_sent_the_token(
    tmp_path: Path, peer: Peer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The token is bound to the certificate seen first; a connection that then presents
    another (a man in the middle) is closed before the request is sent."""
    from proxy.upstream import seeding as seeding_module

    async def another(address: tuple[str, int]) -> bytes:
        return peer.certificate[:-1] + bytes([peer.certificate[-1] ^ 1])

    monkeypatch.setattr(seeding_module, "peer_certificate", another)
    result, _, target = await run(tmp_path, settings(peer.address))
    assert (result, leftovers(target), peer.fake.tokens) == ("failed", [], [])


async def test_an_identity_that_is_no_service_account_asks_nobody(
    tmp_path: Path, peer: Peer
) -> None:
    admin = FakeUpstream(identity={"username": "kubernetes-admin"})
    result, _, target = await run(tmp_path, settings(peer.address), upstream=admin)
    assert (result, leftovers(target), peer.fake.tokens) == ("failed", [], [])


@pytest.mark.parametrize("answer", ["truncated", "corrupt"])
async def test_a_damaged_answer_fails_and_leaves_no_file(
    tmp_path: Path, peer: Peer, answer: str
) -> None:
    peer.fake.answer = answer
    result, _, target = await run(tmp_path, settings(peer.address))
    assert result == "failed"
    assert leftovers(target) == []


async def test_a_refusal_is_refused(tmp_path: Path, peer: Peer) -> None:
    peer.fake.answer = "refuse"
    result, _, target = await run(tmp_path, settings(peer.address))
    assert (result, leftovers(target)) == ("refused", [])


async def test_another_clusters_snapshot_fails(tmp_path: Path, peer: Peer) -> None:
    other = FakeUpstream(uid="another-cluster")
    result, _, target = await run(tmp_path, settings(peer.address), upstream=other)
    assert (result, leftovers(target)) == ("failed", [])


async def test_without_the_clusters_identity_no_peer_is_asked(tmp_path: Path, peer: Peer) -> None:
    blind = FakeUpstream(uid=None)
    result, _, target = await run(tmp_path, settings(peer.address), upstream=blind)
    assert (result, leftovers(target), peer.fake.tokens) == ("failed", [], [])


async def test_a_slow_peer_is_given_up_within_the_bound(tmp_path: Path, peer: Peer) -> None:
    peer.fake.answer = "slow"
    started = asyncio.get_running_loop().time()
    result, _, target = await run(tmp_path, settings(peer.address, timeout=0.5))
    assert (result, leftovers(target)) == ("failed", [])
    assert asyncio.get_running_loop().time() - started < 5


async def test_the_next_peer_is_asked_after_a_failure(tmp_path: Path, peer: Peer) -> None:
    nobody = ("127.0.0.1", free_port())
    result, _, target = await run(tmp_path, SeedSettings(peers=(nobody, peer.address)))
    assert (result, leftovers(target)) == ("installed", ["cache.db"])


async def test_nothing_is_asked_unless_new_named_and_on(tmp_path: Path, peer: Peer) -> None:
    on = settings(peer.address)
    for seeding in (SeedSettings(mode="off", peers=on.peers), SeedSettings()):
        assert (await run(tmp_path, seeding))[0] == "none"
    warm = database(tmp_path / "new" / "cache.db")
    before = warm.read_bytes()
    assert (await run(tmp_path, on))[0] == "none"
    assert warm.read_bytes() == before
    assert peer.fake.tokens == []


def test_the_bound_grows_with_the_snapshot() -> None:
    seeding = SeedSettings(timeout=30, seconds_per_gib=20)
    assert seeding.bound(0) == 30
    assert seeding.bound(3 << 30) == 90
    with pytest.raises(ValueError, match="auto or off"):
        SeedSettings(mode="always")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="peers' port"):
        SeedSettings(pod_name="p", pod_namespace="n")


async def test_a_token_review_for_the_seeding_audience(tmp_path: Path) -> None:
    """The audience is sent, and a token is accepted only when the answer names it (an
    authenticator that ignored the audience must not pass for one that checked it)."""
    sent: list[dict[str, Any]] = []
    answered: list[str] = []

    async def token_review(request: web.Request) -> web.Response:
        body = await request.json()
        sent.append(body["spec"])
        status = {"authenticated": True, "user": {"username": "u"}, "audiences": answered}
        return web.json_response({**body, "status": status}, status=201)

    app = web.Application()
    app.router.add_post("/apis/authentication.k8s.io/v1/tokenreviews", token_review)
    served = Served(app)
    await served.start()
    kubeconfig = token_kubeconfig(tmp_path / "kc", server=served.url, token="sidecar")
    upstream = await connect(ConnectionSettings(kubeconfig=str(kubeconfig)), metrics=Metrics())
    try:
        assert await review_token(upstream, "t", audiences=(AUDIENCE,)) is None
        answered.append(AUDIENCE)
        user = await review_token(upstream, "t", audiences=(AUDIENCE,))
        assert user is not None and user.username == "u"
        assert sent == [{"token": "t", "audiences": [AUDIENCE]}] * 2
        assert await review_token(upstream, "t") is not None  # (the apiserver's own audiences)
        assert sent[-1] == {"token": "t"}
    finally:
        await upstream.close()
        await served.stop()
