"""Backoff, Retry-After, circuit breaker, the limit on concurrent upstream lists, and rates
of upstream calls made for clients.

Pure logic: time comes from an injected clock and randomness from an injected source, so the
tests run in microseconds. The only I/O is ``asyncio.sleep`` in :meth:`Backoff.sleep` and the
waiting in :class:`ListLimiter`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Final

from proxy.metrics import BreakerStateValue, Metrics
from proxy.upstream.errors import UpstreamUnavailable

logger = logging.getLogger(__name__)

__all__ = [
    "Backoff",
    "BackoffSettings",
    "BreakerSettings",
    "BreakerState",
    "CircuitBreaker",
    "ListLimiter",
    "ListLimiterSettings",
    "ListSlot",
    "RateBuckets",
    "check_reachable",
    "choose_delay",
]

Clock = Callable[[], float]
RandomSource = Callable[[], float]


# ---------------------------------------------------------------------------- backoff


@dataclass(frozen=True, kw_only=True)
class BackoffSettings:
    """Capped exponential backoff with jitter: client-go's reflector values
    (``wait.NewExponentialBackoffManager(800ms, 30s, 2min, 2.0, 1.0)``)."""

    initial: float = 0.8
    """First delay: client-go's reflector starts at 800 ms, short enough that a blip (an
    apiserver rolling restart) costs under a second."""

    cap: float = 30.0
    """Largest base delay. With jitter 1.0 the delays settle in [30, 60) s: about 0.02 QPS per
    reflector against an apiserver that is down, client-go's "~98 % traffic reduction"."""

    factor: float = 2.0
    """Growth per consecutive failure (0.8, 1.6, 3.2, ... 25.6, 30)."""

    jitter: float = 1.0
    """Each delay is ``base * (1 + jitter * random())``, i.e. in [base, 2 * base): thousands
    of sidecars restarted together must not retry in lockstep."""

    reset_after: float = 120.0
    """A failure more than this long after the previous one starts again at ``initial``:
    two minutes without backing off means the apiserver was healthy (client-go's rule)."""


class Backoff:
    """client-go's ``exponentialBackoffManagerImpl``: call :meth:`next_delay` (or
    :meth:`sleep`) after each failure.

    Not thread-safe; one per reflector, used from one task.
    """

    def __init__(
        self,
        settings: BackoffSettings | None = None,
        *,
        clock: Clock = time.monotonic,
        random_source: RandomSource = random.random,
    ) -> None:
        self.settings: Final = settings or BackoffSettings()
        self._clock = clock
        self._random = random_source
        self._base = self.settings.initial
        self._last: float | None = None

    def next_delay(self) -> float:
        """The delay before the next attempt, advancing the sequence."""
        s = self.settings
        now = self._clock()
        if self._last is not None and now - self._last > s.reset_after:
            self._base = s.initial
        self._last = now
        base = self._base
        self._base = min(self._base * s.factor, s.cap)
        if s.jitter > 0:
            return base + self._random() * s.jitter * base
        return base

    def reset(self) -> None:
        """Forget past failures (e.g. after a watch delivered events)."""
        self._base = self.settings.initial
        self._last = None

    async def sleep(self, *, retry_after: float | None = None) -> float:
        """Sleep for :func:`choose_delay` of the next backoff and ``retry_after``; return
        the delay slept."""
        delay = choose_delay(backoff=self.next_delay(), retry_after=retry_after)
        await asyncio.sleep(delay)
        return delay


def choose_delay(*, backoff: float, retry_after: float | None, limit: float | None = None) -> float:
    """Honour ``Retry-After`` (429, 503, 504-too-large): wait at least what the apiserver
    asked for, and never less than the backoff. ``limit`` caps an absurd Retry-After (the
    backoff itself is never cut)."""
    if retry_after is None or retry_after <= 0:
        return backoff
    if limit is not None:
        retry_after = min(retry_after, limit)
    return max(backoff, retry_after)


# -------------------------------------------------------------------- circuit breaker


class BreakerState(enum.Enum):
    CLOSED = "closed"
    HALF_OPEN = "half-open"
    OPEN = "open"

    @property
    def gauge_value(self) -> BreakerStateValue:
        return _GAUGE[self]


_GAUGE: Final = {
    BreakerState.CLOSED: BreakerStateValue.CLOSED,
    BreakerState.HALF_OPEN: BreakerStateValue.HALF_OPEN,
    BreakerState.OPEN: BreakerStateValue.OPEN,
}


@dataclass(frozen=True, kw_only=True)
class BreakerSettings:
    failure_threshold: int = 5
    """Consecutive failures that open the breaker: more than a blip (a single dropped
    connection, one apiserver replica restarting) but few enough that a down apiserver is
    recognised within the first ~25 s of backoff."""

    first_cool_down: float = 1.0
    """Time the breaker stays open the first time it opens; each failed probe doubles it, up
    to ``cool_down`` (1, 2, 4, 8, 15, 15 ... s). An apiserver back after a short outage (a
    rolling restart; a warm start of warmwatch while it was away) is noticed within about as
    long again as the outage lasted, not a full ``cool_down`` later: with one fixed 15 s, a
    kopf operator restarted warm during an outage of a few seconds carried out the changes it
    had missed 15 s after the apiserver was back."""

    cool_down: float = 15.0
    """The longest time the breaker stays open before letting one probe through. About the
    middle of the backoff range, so a recovered apiserver is noticed within 15 s while a down
    one sees one probe per cool-down instead of one request per caller."""

    probe_timeout: float = 60.0
    """A half-open probe that reports neither success nor failure within this time (its
    caller was cancelled) is forgotten and another probe is allowed, so the breaker cannot
    stick in half-open. The apiserver's own request timeout is 60 s."""


class CircuitBreaker:
    """closed → open after N consecutive failures → half-open after a cool-down (one probe
    allowed) → closed after a success, or open again after a failure, for twice as long (up
    to :attr:`BreakerSettings.cool_down`).

    Callers ask :meth:`allow` before a request and report :meth:`record_success` or
    :meth:`record_failure` after it. Only failures that mean "the apiserver is unhealthy"
    should be recorded (unreachable, 5xx, 429) — a 404 or 403 is a healthy answer.

    The state is mirrored in ``warmwatch_circuit_breaker_state{target}`` on every change.
    The open → half-open transition happens when time has passed and someone looks
    (:attr:`state` or :meth:`allow`), so the gauge may show "open" a little past the
    cool-down while nobody asks.
    """

    def __init__(
        self,
        *,
        target: str,
        settings: BreakerSettings | None = None,
        metrics: Metrics | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.target: Final = target
        self.settings: Final = settings or BreakerSettings()
        self._metrics = metrics
        self._clock = clock
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._open_for = self.settings.first_cool_down
        self._probe_started: float | None = None
        self._publish()

    def __repr__(self) -> str:
        return f"CircuitBreaker(target={self.target!r}, state={self.state.value})"

    @property
    def state(self) -> BreakerState:
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= self._open_for:
            self._set(BreakerState.HALF_OPEN)
        return self._state

    def retry_in(self) -> float:
        """Seconds until a request may be attempted (0 when :meth:`allow` would say yes
        now, unless a probe is already in flight)."""
        state = self.state
        if state is BreakerState.OPEN:
            return max(0.0, self._opened_at + self._open_for - self._clock())
        if state is BreakerState.HALF_OPEN and self._probe_started is not None:
            return max(0.0, self._probe_started + self.settings.probe_timeout - self._clock())
        return 0.0

    def allow(self) -> bool:
        """May a request go upstream now? In half-open only one probe at a time does."""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.OPEN:
            return False
        now = self._clock()
        if (
            self._probe_started is not None
            and now - self._probe_started < self.settings.probe_timeout
        ):
            return False
        self._probe_started = now
        return True

    def record_success(self) -> None:
        self._failures = 0
        self._probe_started = None
        self._set(BreakerState.CLOSED)

    def record_failure(self) -> None:
        self._failures += 1
        self._probe_started = None
        state = self.state
        if state is BreakerState.HALF_OPEN:
            self._open_for = min(self._open_for * 2, self.settings.cool_down)
        elif state is BreakerState.CLOSED and self._failures >= self.settings.failure_threshold:
            self._open_for = min(self.settings.first_cool_down, self.settings.cool_down)
        else:
            return
        self._opened_at = self._clock()
        self._set(BreakerState.OPEN)

    def _set(self, state: BreakerState) -> None:
        if state is not self._state:
            # Opening is what an operator needs to see (requests now fail fast); half-open
            # and closed follow from it once the apiserver answers again.
            log = logger.warning if state is BreakerState.OPEN else logger.info
            log(
                "circuit breaker for %s: %s -> %s (%d consecutive failures)",
                self.target,
                self._state.value,
                state.value,
                self._failures,
            )
            self._state = state
            self._publish()

    def _publish(self) -> None:
        if self._metrics is not None:
            self._metrics.set_breaker_state(target=self.target, state=self._state.gauge_value)


def check_reachable(breaker: CircuitBreaker | None) -> None:
    """Fail at once while the breaker is open (reflectors found the apiserver unreachable)."""
    if breaker is not None and breaker.state is BreakerState.OPEN:
        raise UpstreamUnavailable(
            f"the apiserver is unreachable (circuit breaker open; next probe in "
            f"{breaker.retry_in():.0f}s)"
        )


# ------------------------------------------------------------------------ list limiter


@dataclass(frozen=True, kw_only=True)
class ListLimiterSettings:
    concurrent_lists: int = 3
    """Large upstream lists in flight at once. A cold start with dozens of shapes must not
    send dozens of full lists of big collections to the apiserver together (each costs it
    memory proportional to the collection and can trip its priority-and-fairness limits);
    three keep the fill fast while a restart storm stays gentle."""
    free_bytes: int = 512 * 1024
    """A list takes a slot only once it has received this many bytes of objects. Most of the
    collections a controller starts with are small (kube-controller-manager's ~60: a few
    objects each); each costs the apiserver little, and its list takes tens of milliseconds
    of round trips and a consistent read, not bandwidth. Queued three at a time behind one
    another — or behind one big collection — they made a cold start take seconds. Listed at
    once, they cost at most this much memory each while they are staged."""


class ListLimiter:
    """Bounds the upstream LIST phase of large fills and relists: an ``asyncio.Semaphore``
    taken once a list turns out large
    (``free_bytes``) and given back as soon as its list phase ends::

        async with limiter.slot() as slot:
            ... list upstream (report slot.progress()) ...
            if received >= limiter.settings.free_bytes:
                await slot.hold()  # waits for a place among the large lists
            slot.release()  # a WatchList's initial events are in: its watch goes on freely

    Only the list phase is bounded, never the watch that follows it: a WatchList fill keeps
    its stream open as the shape's watch, and holding the slot for that whole watch would
    starve every shape queued behind it (a controller with a dozen informers would wait for
    the fill timeout). ``progressed_at`` is the last time any slot holder reported progress,
    so a client waiting for a queued fill can tell a busy queue from a stuck one.
    """

    def __init__(
        self, settings: ListLimiterSettings | None = None, *, clock: Clock = time.monotonic
    ) -> None:
        self.settings: Final = settings or ListLimiterSettings()
        if self.settings.concurrent_lists < 1:
            raise ValueError("concurrent_lists must be at least 1")
        self._semaphore = asyncio.Semaphore(self.settings.concurrent_lists)
        self._clock = clock
        self.progressed_at = clock()

    def progressed(self) -> None:
        """A slot holder made progress (objects arrived, a slot changed hands)."""
        self.progressed_at = self._clock()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[ListSlot]:
        """A list's slot, taken when it asks (:meth:`ListSlot.hold`) and given back on leaving
        the block unless released before."""
        slot = ListSlot(self)
        try:
            yield slot
        finally:
            slot.release()

    async def _acquire(self) -> None:
        await self._semaphore.acquire()
        self.progressed()

    def _release(self) -> None:
        self._semaphore.release()
        self.progressed()


class ListSlot:
    """One list's place in a :class:`ListLimiter`: free until :meth:`hold`, then held until
    :meth:`release` (idempotent; after it, the list phase is over)."""

    def __init__(self, limiter: ListLimiter) -> None:
        self._limiter: ListLimiter | None = limiter
        self._held = False

    @property
    def held(self) -> bool:
        return self._held

    @property
    def released(self) -> bool:
        return self._limiter is None

    async def hold(self) -> None:
        """Take a place among the large lists, waiting for one (a no-op once held)."""
        if self._limiter is not None and not self._held:
            await self._limiter._acquire()
            self._held = True

    def progress(self) -> None:
        if self._limiter is not None:
            self._limiter.progressed()

    def release(self) -> None:
        if self._limiter is not None:
            limiter, self._limiter = self._limiter, None
            if self._held:
                self._held = False
                limiter._release()


# ------------------------------------------------------------------------- client rates


class RateBuckets:
    """A token bucket per client: each holds at most ``burst`` tokens, gains ``rate`` a second
    and starts full; :meth:`take` spends one, or returns False when the bucket is empty.

    State is kept only for clients whose bucket is not full again (a full bucket is what an
    unknown client starts with), and for at most ``max_clients`` of them, the least recently
    seen forgotten first: memory stays bounded however many addresses a flood comes from.
    """

    def __init__(
        self,
        *,
        rate: float,
        burst: int,
        max_clients: int = 10_000,
        clock: Clock = time.monotonic,
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("a rate must be positive and a burst at least 1")
        self.rate = rate
        self.burst = burst
        self.max_clients = max_clients
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}
        """Client -> (tokens, when counted); in the order last seen (dicts keep it)."""

    def __len__(self) -> int:
        return len(self._buckets)

    def _tokens(self, bucket: tuple[float, float], now: float) -> float:
        tokens, counted = bucket
        return min(float(self.burst), tokens + (now - counted) * self.rate)

    def take(self, client: str) -> bool:
        now = self._clock()
        bucket = self._buckets.pop(client, None)
        tokens = float(self.burst) if bucket is None else self._tokens(bucket, now)
        taken = tokens >= 1.0
        self._buckets[client] = (tokens - 1.0 if taken else tokens, now)
        self._forget(now)
        return taken

    def _forget(self, now: float) -> None:
        """Drop the least recently seen buckets while they are full again, and beyond
        ``max_clients``."""
        while self._buckets:
            oldest = next(iter(self._buckets))
            full = self._tokens(self._buckets[oldest], now) >= self.burst
            if not full and len(self._buckets) <= self.max_clients:
                break
            del self._buckets[oldest]
