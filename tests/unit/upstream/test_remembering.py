"""The review decision cache: TTLs, hashed keys, single flight, errors not kept, the offline
window, positive decisions kept apart from negative ones, the admission of reviews — on a fake
clock."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from proxy.upstream.errors import UpstreamStatusError, UpstreamUnavailable
from proxy.upstream.remembering import Decisions, digest


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def decisions(clock: Clock, **overrides: float) -> Decisions[bool]:
    settings: dict[str, float] = {
        "positive_ttl": 10.0,
        "negative_ttl": 3.0,
        "offline_window": 60.0,
        "max_entries": 100,
        "max_negative": 100,
        "max_per_owner": 100,
    }
    settings.update(overrides)
    return Decisions(
        name="test",
        positive_ttl=settings["positive_ttl"],
        negative_ttl=settings["negative_ttl"],
        offline_window=settings["offline_window"],
        max_entries=int(settings["max_entries"]),
        max_negative=int(settings["max_negative"]),
        max_per_owner=int(settings["max_per_owner"]),
        positive=lambda allowed: allowed,
        outage=lambda error: isinstance(error, UpstreamUnavailable),
        clock=clock,
    )


class Reviewer:
    """Counts reviews; answers ``answer`` or raises ``error``."""

    def __init__(self, answer: bool = True) -> None:
        self.answer = answer
        self.error: Exception | None = None
        self.calls = 0
        self.gate: asyncio.Event | None = None

    async def __call__(self) -> bool:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        return self.answer


def test_keys_are_length_prefixed_sha256_digests() -> None:
    assert len(digest("token")) == 32
    assert digest("token") == digest(b"token")
    assert digest("ab", "c") != digest("a", "bc")
    # SHA-256 over the length-prefixed parts: the token itself is never kept.
    expected = hashlib.sha256((5).to_bytes(8, "big") + b"token").digest()
    assert digest("token") == expected


async def test_positive_decisions_are_reused_for_their_ttl() -> None:
    clock = Clock()
    cache, review = decisions(clock), Reviewer(True)
    key = digest("secret-token")
    assert await cache.decide(key, review) is True
    clock.now += 9.9
    assert await cache.decide(key, review) is True
    assert review.calls == 1
    clock.now += 0.2  # past the 10 s allow TTL
    assert await cache.decide(key, review) is True
    assert review.calls == 2


async def test_negative_decisions_have_their_own_ttl() -> None:
    clock = Clock()
    cache, review = decisions(clock), Reviewer(False)
    key = digest("k")
    assert await cache.decide(key, review) is False
    clock.now += 2.9
    assert await cache.decide(key, review) is False
    assert review.calls == 1
    clock.now += 0.2  # past the 3 s deny TTL
    review.answer = True  # a new grant shows once the denial expired
    assert await cache.decide(key, review) is True
    assert review.calls == 2


async def test_concurrent_lookups_share_one_review() -> None:
    cache, review = decisions(Clock()), Reviewer(True)
    review.gate = asyncio.Event()
    key = digest("same")
    waiters = [asyncio.create_task(cache.decide(key, review)) for _ in range(20)]
    await asyncio.sleep(0)
    other = asyncio.create_task(cache.decide(digest("other"), review))
    await asyncio.sleep(0.01)
    review.gate.set()
    assert await asyncio.gather(*waiters) == [True] * 20
    assert await other is True
    assert review.calls == 2  # one per key


async def test_a_cancelled_caller_does_not_cancel_the_shared_review() -> None:
    cache, review = decisions(Clock()), Reviewer(True)
    review.gate = asyncio.Event()
    key = digest("k")
    first = asyncio.create_task(cache.decide(key, review))
    second = asyncio.create_task(cache.decide(key, review))
    await asyncio.sleep(0.01)
    first.cancel()
    review.gate.set()
    assert await second is True
    assert review.calls == 1


async def test_failed_reviews_are_not_remembered() -> None:
    clock = Clock()
    cache, review = decisions(clock), Reviewer(True)
    review.error = UpstreamStatusError(code=500, reason="InternalError", message="x", status={})
    key = digest("k")
    with pytest.raises(UpstreamStatusError):
        await cache.decide(key, review)
    assert len(cache) == 0
    review.error = None
    assert await cache.decide(key, review) is True  # asked again at once
    assert review.calls == 2


async def test_every_waiter_of_a_failed_flight_gets_the_error() -> None:
    cache, review = decisions(Clock()), Reviewer(True)
    review.gate = asyncio.Event()
    review.error = UpstreamUnavailable("down")
    key = digest("k")
    waiters = [asyncio.create_task(cache.decide(key, review)) for _ in range(3)]
    await asyncio.sleep(0.01)
    review.gate.set()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(r, UpstreamUnavailable) for r in results)
    assert review.calls == 1


async def test_offline_window_holds_recent_decisions_only() -> None:
    clock = Clock()
    cache, review = decisions(clock), Reviewer(True)
    allowed, denied, never = digest("allowed"), digest("denied"), digest("never")
    assert await cache.decide(allowed, review) is True
    review.answer = False
    assert await cache.decide(denied, review) is False

    review.error = UpstreamUnavailable("apiserver unreachable")
    clock.now += 30  # TTLs over, inside the 60 s window
    assert await cache.decide(allowed, review) is True
    assert await cache.decide(denied, review) is False  # a denial holds too
    with pytest.raises(UpstreamUnavailable):
        await cache.decide(never, review)  # nothing decided: refused

    clock.now += 31  # beyond the window
    with pytest.raises(UpstreamUnavailable):
        await cache.decide(allowed, review)


async def test_the_window_applies_to_outages_only() -> None:
    clock = Clock()
    cache, review = decisions(clock), Reviewer(True)
    key = digest("k")
    await cache.decide(key, review)
    clock.now += 20
    review.error = UpstreamStatusError(code=403, reason="Forbidden", message="x", status={})
    with pytest.raises(UpstreamStatusError):
        await cache.decide(key, review)


async def test_entries_are_bounded_and_expired_ones_dropped() -> None:
    clock = Clock()
    cache, review = decisions(clock, max_entries=3), Reviewer(True)
    for n in range(5):
        await cache.decide(digest(str(n)), review)
    assert len(cache) == 3
    assert cache.fresh(digest("0")) is None and cache.fresh(digest("4")) is not None
    clock.now += 61  # past every TTL and the window
    await cache.decide(digest("new"), review)
    assert len(cache) == 1


async def test_a_flood_of_negative_decisions_never_evicts_a_positive_one() -> None:
    clock = Clock()
    cache = decisions(clock, max_entries=3, max_negative=2)
    accepted = digest("good-token")
    assert await cache.decide(accepted, Reviewer(True)) is True
    junk = Reviewer(False)
    for n in range(1_000):
        assert await cache.decide(digest(f"junk-{n}"), junk) is False
    assert junk.calls == 1_000
    assert len(cache) == 1 + 2  # the negative ones bounded on their own
    # An outage right after the flood: the accepted decision still holds.
    clock.now += 30
    down = Reviewer(True)
    down.error = UpstreamUnavailable("apiserver unreachable")
    assert await cache.decide(accepted, down) is True
    assert cache.known_positive(accepted) and not cache.known_positive(digest("junk-999"))


async def test_one_identity_cannot_push_out_the_allowed_decisions_of_others() -> None:
    """A client with a valid token asks with ever new attributes (random label selectors:
    each a SubjectAccessReview of its own): its own oldest decisions go, never another
    identity's, which still holds when the apiserver goes away."""
    clock = Clock()
    cache = decisions(clock, max_entries=10, max_per_owner=3)
    other, flooder = digest("other"), digest("flooder")
    assert await cache.decide(digest("other", "list"), Reviewer(True), owner=other) is True
    allowed = Reviewer(True)
    for n in range(1_000):
        assert await cache.decide(digest("flooder", str(n)), allowed, owner=flooder)
    assert allowed.calls == 1_000
    assert len(cache) == 1 + 3
    assert cache.known_positive(digest("flooder", "999"))
    assert not cache.known_positive(digest("flooder", "996"))  # its own oldest went
    clock.now += 30
    down = Reviewer(True)
    down.error = UpstreamUnavailable("apiserver unreachable")
    assert await cache.decide(digest("other", "list"), down, owner=other) is True


async def test_negative_decisions_are_bounded_and_the_oldest_go_first() -> None:
    cache = decisions(Clock(), max_entries=3, max_negative=2)
    for n in range(4):
        await cache.decide(digest(f"no-{n}"), Reviewer(False))
    assert [cache.fresh(digest(f"no-{n}")) is not None for n in range(4)] == [
        False,
        False,
        True,
        True,
    ]
    # Positive ones still fill their own bound.
    for n in range(3):
        await cache.decide(digest(f"yes-{n}"), Reviewer(True))
    assert len(cache) == 5


async def test_a_decision_that_changes_sides_moves() -> None:
    clock = Clock()
    cache = decisions(clock, max_entries=1, max_negative=1)
    key = digest("k")
    await cache.decide(key, Reviewer(True))
    clock.now += 11  # past the allow TTL: asked again, now refused
    assert await cache.decide(key, Reviewer(False)) is False
    assert len(cache) == 1 and not cache.known_positive(key)
    clock.now += 4
    assert await cache.decide(key, Reviewer(True)) is True
    assert len(cache) == 1 and cache.known_positive(key)


async def test_admit_is_asked_only_before_a_review_of_the_callers_own() -> None:
    clock = Clock()
    cache, review = decisions(clock), Reviewer(True)
    admitted: list[bytes] = []
    key = digest("k")

    def admit() -> None:
        admitted.append(key)

    review.gate = asyncio.Event()
    first = asyncio.create_task(cache.decide(key, review, admit=admit))
    await asyncio.sleep(0)
    joined = asyncio.create_task(cache.decide(key, review, admit=admit))
    await asyncio.sleep(0.01)
    review.gate.set()
    assert await first is True and await joined is True
    assert len(admitted) == 1  # the flight's starter only
    assert await cache.decide(key, review, admit=admit) is True
    assert len(admitted) == 1  # fresh: no review, nothing asked

    def refuse() -> None:
        raise RuntimeError("over budget")

    clock.now += 11
    with pytest.raises(RuntimeError, match="over budget"):
        await cache.decide(key, review, admit=refuse)
    assert review.calls == 1  # refused before a review was sent
    assert await cache.decide(key, review, admit=admit) is True  # no flight was left behind
    assert review.calls == 2


async def test_close_cancels_reviews_in_flight() -> None:
    cache, review = decisions(Clock()), Reviewer(True)
    review.gate = asyncio.Event()
    waiter = asyncio.create_task(cache.decide(digest("k"), review))
    await asyncio.sleep(0.01)
    await cache.close()
    with pytest.raises(asyncio.CancelledError):
        await waiter
