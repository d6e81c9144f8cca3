"""Backoff, Retry-After, circuit breaker, list limiter and client rates, with a fake clock."""

from __future__ import annotations

import asyncio
import logging

import pytest

from proxy.metrics import Metrics
from proxy.upstream.resilience import (
    Backoff,
    BackoffSettings,
    BreakerSettings,
    BreakerState,
    CircuitBreaker,
    ListLimiter,
    ListLimiterSettings,
    RateBuckets,
    choose_delay,
)
from tests.unit.upstream.conftest import free_slots


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# ------------------------------------------------------------------------------ backoff


def test_backoff_sequence_without_jitter_matches_client_go() -> None:
    clock = Clock()
    backoff = Backoff(clock=clock, random_source=lambda: 0.0)
    delays = []
    for _ in range(9):
        delays.append(backoff.next_delay())
        clock.advance(1)
    assert delays == pytest.approx([0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0, 30.0])


def test_backoff_jitter_is_up_to_one_base() -> None:
    clock = Clock()
    backoff = Backoff(clock=clock, random_source=lambda: 0.999)
    assert backoff.next_delay() == pytest.approx(0.8 * 1.999)
    for _ in range(10):
        delay = backoff.next_delay()
    # capped base 30 s, jittered into [30, 60) as client-go's reflector comments say
    assert 30.0 <= delay < 60.0


def test_backoff_resets_after_two_quiet_minutes() -> None:
    clock = Clock()
    backoff = Backoff(clock=clock, random_source=lambda: 0.0)
    for _ in range(5):
        backoff.next_delay()
    clock.advance(120.0)  # exactly the reset duration: not yet (client-go uses ">")
    assert backoff.next_delay() == pytest.approx(25.6)
    clock.advance(120.1)
    assert backoff.next_delay() == pytest.approx(0.8)
    assert backoff.next_delay() == pytest.approx(1.6)
    backoff.reset()
    assert backoff.next_delay() == pytest.approx(0.8)


def test_backoff_settings_are_honoured() -> None:
    backoff = Backoff(
        BackoffSettings(initial=1.0, cap=5.0, factor=3.0, jitter=0.5, reset_after=10.0),
        clock=Clock(),
        random_source=lambda: 1.0,
    )
    assert [backoff.next_delay() for _ in range(4)] == pytest.approx([1.5, 4.5, 7.5, 7.5])


def test_settings_are_frozen_keyword_only() -> None:
    settings = BackoffSettings()
    with pytest.raises(AttributeError):
        settings.initial = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        BackoffSettings(0.5)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("backoff", "retry_after", "limit", "expected"),
    [
        (0.8, None, None, 0.8),
        (0.8, 0.0, None, 0.8),
        (0.8, 5.0, None, 5.0),
        (12.0, 5.0, None, 12.0),
        (0.8, 3600.0, 60.0, 60.0),
        (90.0, 3600.0, 60.0, 90.0),
    ],
)
def test_choose_delay(
    backoff: float, retry_after: float | None, limit: float | None, expected: float
) -> None:
    assert choose_delay(backoff=backoff, retry_after=retry_after, limit=limit) == expected


async def test_backoff_sleep_uses_retry_after(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []

    async def fake_sleep(delay: float) -> None:
        slept.append(delay)

    monkeypatch.setattr(asyncio, "sleep", fake_sleep)
    backoff = Backoff(clock=Clock(), random_source=lambda: 0.0)
    assert await backoff.sleep(retry_after=4.0) == 4.0
    assert await backoff.sleep() == pytest.approx(1.6)
    assert slept == pytest.approx([4.0, 1.6])


# ---------------------------------------------------------------------- circuit breaker


def gauge(metrics: Metrics, target: str = "apiserver") -> float | None:
    return metrics.value("warmwatch_circuit_breaker_state", {"target": target})


def test_breaker_opens_after_consecutive_failures() -> None:
    clock, metrics = Clock(), Metrics()
    breaker = CircuitBreaker(
        target="apiserver",
        settings=BreakerSettings(failure_threshold=3, first_cool_down=10.0, cool_down=10.0),
        metrics=metrics,
        clock=clock,
    )
    assert breaker.state is BreakerState.CLOSED
    assert gauge(metrics) == 0
    breaker.record_failure()
    breaker.record_failure()
    breaker.record_success()  # not consecutive any more
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.allow()
    assert breaker.state is BreakerState.CLOSED
    breaker.record_failure()
    assert breaker.state is BreakerState.OPEN
    assert gauge(metrics) == 2
    assert not breaker.allow()
    assert breaker.retry_in() == pytest.approx(10.0)
    clock.advance(4)
    assert breaker.retry_in() == pytest.approx(6.0)


def test_breaker_changes_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    breaker = CircuitBreaker(
        target="apiserver",
        settings=BreakerSettings(failure_threshold=2, first_cool_down=5.0),
        clock=clock,
    )
    caplog.set_level(logging.INFO, logger="proxy.upstream.resilience")
    breaker.record_failure()
    assert caplog.records == []
    breaker.record_failure()
    clock.advance(5)
    assert breaker.allow()
    breaker.record_success()
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "circuit breaker for apiserver: closed -> open (2 consecutive failures)"),
        ("INFO", "circuit breaker for apiserver: open -> half-open (2 consecutive failures)"),
        ("INFO", "circuit breaker for apiserver: half-open -> closed (0 consecutive failures)"),
    ]


def test_breaker_half_open_lets_one_probe_through() -> None:
    clock, metrics = Clock(), Metrics()
    breaker = CircuitBreaker(
        target="apiserver",
        settings=BreakerSettings(
            failure_threshold=1, first_cool_down=10.0, cool_down=10.0, probe_timeout=30.0
        ),
        metrics=metrics,
        clock=clock,
    )
    breaker.record_failure()
    assert breaker.state is BreakerState.OPEN
    clock.advance(10)
    assert breaker.state is BreakerState.HALF_OPEN
    assert gauge(metrics) == 1
    assert breaker.allow()  # the probe
    assert not breaker.allow()  # only one at a time
    assert breaker.retry_in() == pytest.approx(30.0)
    breaker.record_failure()  # probe failed: open again, fresh cool-down
    assert breaker.state is BreakerState.OPEN
    assert gauge(metrics) == 2
    clock.advance(9.9)
    assert not breaker.allow()
    clock.advance(0.1)
    assert breaker.allow()
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED
    assert gauge(metrics) == 0
    assert breaker.allow()
    assert breaker.allow()


def test_breaker_stays_open_longer_after_each_failed_probe() -> None:
    """1, 2, 4, 8, 15, 15 s; a success starts over at 1 s. Found with a kopf operator restarted
    warm during a short outage: with a fixed 15 s it caught up 15 s after the apiserver
    returned."""
    clock = Clock()
    breaker = CircuitBreaker(
        target="apiserver",
        settings=BreakerSettings(failure_threshold=1, first_cool_down=1.0, cool_down=15.0),
        clock=clock,
    )
    breaker.record_failure()
    waits = []
    for _ in range(6):
        waits.append(breaker.retry_in())
        clock.advance(breaker.retry_in())
        assert breaker.allow()  # the probe
        breaker.record_failure()
    assert waits == [1, 2, 4, 8, 15, 15]
    clock.advance(15)
    assert breaker.allow()
    breaker.record_success()
    breaker.record_failure()
    assert breaker.retry_in() == 1


def test_breaker_forgets_a_lost_probe() -> None:
    clock = Clock()
    breaker = CircuitBreaker(
        target="x",
        settings=BreakerSettings(failure_threshold=1, cool_down=1.0, probe_timeout=5.0),
        clock=clock,
    )
    breaker.record_failure()
    clock.advance(1)
    assert breaker.allow()  # probe whose caller is then cancelled and never reports
    clock.advance(4.9)
    assert not breaker.allow()
    clock.advance(0.1)
    assert breaker.allow()


def test_breaker_targets_are_separate_series() -> None:
    metrics = Metrics()
    a = CircuitBreaker(
        target="apiserver", settings=BreakerSettings(failure_threshold=1), metrics=metrics
    )
    CircuitBreaker(target="elsewhere", metrics=metrics)  # no target of warmwatch's: "other"
    a.record_failure()
    assert gauge(metrics, "apiserver") == 2
    assert gauge(metrics, "other") == 0


# ------------------------------------------------------------------------- list limiter


async def test_list_limiter_admits_a_bounded_number_of_listers() -> None:
    limiter = ListLimiter(ListLimiterSettings(concurrent_lists=2))
    assert await free_slots(limiter) == 2
    release = asyncio.Event()
    inside: list[int] = []

    async def lister(n: int) -> None:
        async with limiter.slot() as slot:
            await slot.hold()
            inside.append(n)
            await release.wait()

    tasks = [asyncio.create_task(lister(n), name=f"lister {n}") for n in range(5)]
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(inside) == 2  # three wait
    assert await free_slots(limiter) == 0
    release.set()
    await asyncio.gather(*tasks)
    assert sorted(inside) == [0, 1, 2, 3, 4]
    assert await free_slots(limiter) == 2


async def test_list_limiter_cancelled_waiter_takes_no_slot() -> None:
    limiter = ListLimiter(ListLimiterSettings(concurrent_lists=1))
    async with limiter.slot() as held:
        await held.hold()
        waiter = asyncio.create_task(_hold(limiter), name="waiter")
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert await free_slots(limiter) == 0
    assert await free_slots(limiter) == 1
    async with limiter.slot() as slot:
        assert await free_slots(limiter) == 1  # a slot is free until held
        await slot.hold()
        await slot.hold()  # once
        assert await free_slots(limiter) == 0
    assert await free_slots(limiter) == 1


async def test_a_slot_given_back_early_admits_the_next_lister_once() -> None:
    """A WatchList fill releases its slot when its initial events are in; its watch goes on
    without one, and leaving the block later does not release a second time."""
    clock = Clock()
    limiter = ListLimiter(ListLimiterSettings(concurrent_lists=1), clock=clock)
    holding = asyncio.Event()
    async with limiter.slot() as slot:
        await slot.hold()
        clock.advance(5)
        slot.progress()
        assert limiter.progressed_at == 1005
        queued = asyncio.create_task(_hold(limiter, holding=holding), name="queued")
        await asyncio.sleep(0)
        assert not holding.is_set()
        slot.release()
        assert not slot.held and slot.released
        await asyncio.wait_for(holding.wait(), 1)  # the queued lister got it
        slot.release()  # idempotent
        assert await free_slots(limiter) == 0
    assert await free_slots(limiter) == 0  # leaving the released block gave nothing back twice
    queued.cancel()
    await asyncio.gather(queued, return_exceptions=True)
    assert await free_slots(limiter) == 1


async def _hold(limiter: ListLimiter, *, holding: asyncio.Event | None = None) -> None:
    async with limiter.slot() as slot:
        await slot.hold()
        if holding is not None:
            holding.set()
        await asyncio.Event().wait()


def test_list_limiter_rejects_zero() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ListLimiter(ListLimiterSettings(concurrent_lists=0))


# ------------------------------------------------------------------------- client rates


def test_a_client_spends_its_burst_then_gets_the_rate() -> None:
    clock = Clock()
    buckets = RateBuckets(rate=4.0, burst=5, clock=clock)
    assert [buckets.take("a") for _ in range(6)] == [True] * 5 + [False]
    clock.advance(0.125)  # half a token
    assert buckets.take("a") is False
    clock.advance(0.125)
    assert buckets.take("a") is True and buckets.take("a") is False
    # Refusals cost nothing: 1 s later there are 4 tokens, however often it was refused.
    clock.advance(1.0)
    assert sum(buckets.take("a") for _ in range(20)) == 4
    clock.advance(60.0)
    assert sum(buckets.take("a") for _ in range(20)) == 5  # never more than the burst


def test_clients_have_buckets_of_their_own() -> None:
    clock = Clock()
    buckets = RateBuckets(rate=1.0, burst=2, clock=clock)
    assert [buckets.take("a") for _ in range(3)] == [True, True, False]
    assert [buckets.take("b") for _ in range(3)] == [True, True, False]


def test_full_buckets_are_forgotten_and_clients_bounded() -> None:
    clock = Clock()
    buckets = RateBuckets(rate=1.0, burst=2, max_clients=3, clock=clock)
    for client in ("a", "b", "c", "d", "e"):
        buckets.take(client)
    assert len(buckets) == 3  # the least recently seen forgotten beyond the bound
    clock.advance(1.0)  # every bucket full again
    buckets.take("f")
    assert len(buckets) == 1


def test_rates_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        RateBuckets(rate=0.0, burst=1)
    with pytest.raises(ValueError, match="burst at least 1"):
        RateBuckets(rate=1.0, burst=0)
