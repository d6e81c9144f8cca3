"""Seeding from a fake peer (a small aiohttp server) with a fake apiserver identity: a good
snapshot is installed; a refusal, a truncated or corrupted answer, another cluster's
snapshot, an unreadable cluster identity or a peer too slow give a cold start with no file
left; a database already there is never replaced."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from aiohttp import web

from loadtest.ports import free_port
from proxy.cache import snapshotting
from proxy.metrics import Metrics
from proxy.upstream.connecting import ConnectionSettings, Upstream, connect
from proxy.upstream.errors import UpstreamStatusError
from proxy.upstream.reviewing import review_token
from proxy.upstream.seeding import (
    AUDIENCE,
    DIGEST_HEADER,
    SEED_PATH,
    SeedSettings,
    seed,
)
from tests.unit.cache.test_snapshotting import CLUSTER, database, snapshot_of
from tests.unit.upstream.conftest import Served, token_kubeconfig


@dataclass
class FakeUpstream:
    """The apiserver's answer about ``kube-system`` (only that is asked)."""

    uid: str | None = CLUSTER
    asked: list[str] = field(default_factory=list)

    async def json_request(self, method: str, target: str, **_: Any) -> dict[str, Any]:
        self.asked.append(f"{method} {target}")
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

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.tokens.append(request.headers.get("Authorization", ""))
        if self.answer == "refuse":
            return web.json_response({"kind": "Status", "code": 403}, status=403)
        if self.answer == "slow":
            await asyncio.sleep(30)
        body, digest = self.body, hashlib.sha256(self.body).hexdigest()
        if self.answer == "corrupt":  # a byte flipped in transit, after the digest
            body = body[:5000] + bytes([body[5000] ^ 1]) + body[5001:]
        response = web.StreamResponse(headers={DIGEST_HEADER: digest})
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


@pytest.fixture
async def peer(tmp_path: Path) -> AsyncIterator[tuple[FakePeer, tuple[str, int]]]:
    body = snapshot_of(database(tmp_path / "peer.db"), tmp_path / "peer-snapshot.db").read_bytes()
    fake = FakePeer(body=body)
    app = web.Application()
    app.router.add_get(SEED_PATH, fake.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield fake, ("127.0.0.1", port)
    await runner.cleanup()


def settings(tmp_path: Path, address: tuple[str, int], **options: Any) -> SeedSettings:
    token = tmp_path / "seed.token"
    token.write_text("own-token\n")
    return SeedSettings(peers=(address,), token_file=token, **options)


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


async def test_a_good_snapshot_is_installed(
    tmp_path: Path, peer: tuple[FakePeer, tuple[str, int]]
) -> None:
    fake, address = peer
    result, metrics, target = await run(tmp_path, settings(tmp_path, address))
    assert result == "installed"
    assert fake.tokens == ["Bearer own-token"]
    assert target.read_bytes() == fake.body
    assert leftovers(target) == ["cache.db"]
    assert target.stat().st_mode & 0o077 == 0
    assert metrics.value("warmwatch_seeding_bytes_total") == len(fake.body)
    assert snapshotting.check_snapshot(target, cluster_uid=CLUSTER).objects == 300


@pytest.mark.parametrize("answer", ["truncated", "corrupt"])
async def test_a_damaged_answer_fails_and_leaves_no_file(
    tmp_path: Path, peer: tuple[FakePeer, tuple[str, int]], answer: str
) -> None:
    fake, address = peer
    fake.answer = answer
    result, _, target = await run(tmp_path, settings(tmp_path, address))
    assert result == "failed"
    assert leftovers(target) == []


async def test_a_refusal_is_refused(tmp_path: Path, peer: tuple[FakePeer, tuple[str, int]]) -> None:
    fake, address = peer
    fake.answer = "refuse"
    result, _, target = await run(tmp_path, settings(tmp_path, address))
    assert (result, leftovers(target)) == ("refused", [])


async def test_another_clusters_snapshot_fails(
    tmp_path: Path, peer: tuple[FakePeer, tuple[str, int]]
) -> None:
    _, address = peer
    other = FakeUpstream(uid="another-cluster")
    result, _, target = await run(tmp_path, settings(tmp_path, address), upstream=other)
    assert (result, leftovers(target)) == ("failed", [])


async def test_without_the_clusters_identity_no_peer_is_asked(
    tmp_path: Path, peer: tuple[FakePeer, tuple[str, int]]
) -> None:
    fake, address = peer
    blind = FakeUpstream(uid=None)
    result, _, target = await run(tmp_path, settings(tmp_path, address), upstream=blind)
    assert (result, leftovers(target), fake.tokens) == ("failed", [], [])


async def test_a_slow_peer_is_given_up_within_the_bound(
    tmp_path: Path, peer: tuple[FakePeer, tuple[str, int]]
) -> None:
    fake, address = peer
    fake.answer = "slow"
    started = asyncio.get_running_loop().time()
    result, _, target = await run(tmp_path, settings(tmp_path, address, timeout=0.5))
    assert (result, leftovers(target)) == ("failed", [])
    assert asyncio.get_running_loop().time() - started < 5


async def test_the_next_peer_is_asked_after_a_failure(
    tmp_path: Path, peer: tuple[FakePeer, tuple[str, int]]
) -> None:
    _, address = peer
    nobody = ("127.0.0.1", free_port())
    seeding = settings(tmp_path, address)
    seeding = SeedSettings(peers=(nobody, address), token_file=seeding.token_file)
    result, _, target = await run(tmp_path, seeding)
    assert (result, leftovers(target)) == ("installed", ["cache.db"])


async def test_nothing_is_asked_unless_new_named_and_on(
    tmp_path: Path, peer: tuple[FakePeer, tuple[str, int]]
) -> None:
    fake, address = peer
    on = settings(tmp_path, address)
    for seeding in (
        SeedSettings(mode="off", peers=on.peers, token_file=on.token_file),
        SeedSettings(token_file=on.token_file),
        SeedSettings(peers=on.peers),
    ):
        assert (await run(tmp_path, seeding))[0] == "none"
    warm = database(tmp_path / "new" / "cache.db")
    before = warm.read_bytes()
    assert (await run(tmp_path, on))[0] == "none"
    assert warm.read_bytes() == before
    assert fake.tokens == []


def test_the_bound_grows_with_the_snapshot() -> None:
    seeding = SeedSettings(timeout=30, seconds_per_gib=20)
    assert seeding.bound(0) == 30
    assert seeding.bound(3 << 30) == 90
    with pytest.raises(ValueError, match="auto or off"):
        SeedSettings(mode="always")  # type: ignore[arg-type]
    assert AUDIENCE == "warmwatch.io/seed"


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
