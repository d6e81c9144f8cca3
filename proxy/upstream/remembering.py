"""Review decisions remembered for a while (docs/design.md §6): the cache in front of
TokenReviews and SubjectAccessReviews in ``--client-auth delegated``.

The rules are those of the apiserver's delegating authenticator and authorizer (and of
kube-rbac-proxy), so that warmwatch decides as the apiserver would, with the same staleness:

- a decision is reused for its TTL after the review that made it: one TTL for positive
  decisions (authenticated, allowed), one for negative ones (not authenticated, denied);
- keys are SHA-256 digests: a bearer token is never kept, only its hash;
- concurrent lookups of the same key that find nothing fresh share one review (single
  flight): a controller starting twenty informers sends one TokenReview, not twenty;
- a review that failed is never remembered: the next lookup asks again;
- while the apiserver cannot be reached (``outage(error)`` says so of the review's failure), a decision
  made within ``offline_window`` still holds, older or missing ones do not (the caller then
  denies). The window bounds how long a revocation can go unnoticed during an outage;
- positive and negative decisions are kept apart, each bounded on its own (``max_entries``,
  ``max_negative``; the least recently decided go first): anyone can make negative ones —
  a random bearer token is a refused one — so a flood of them must never push out the
  positive decision a client relies on, during an outage above all;
- a decision may name its ``owner`` (the identity it was made for): one owner keeps at most
  ``max_per_owner`` positive decisions, its own oldest going first, so an identity that
  makes requests with ever new attributes (random label selectors, each its own
  SubjectAccessReview) cannot push out the decisions other identities rely on;
- ``admit()`` is called before a review is sent (not for a decision still fresh, nor for
  a caller that joins a review in flight): it may refuse by raising, so a caller can put
  a budget on reviews without spending it on what the cache answers.

Everything but the single flight is synchronous and takes the time from ``clock``, so the
rules are tested without an event loop's timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Decisions", "Remembered", "digest"]

T = TypeVar("T")


def digest(*parts: str | bytes) -> bytes:
    """The SHA-256 of ``parts``, each length-prefixed (so ``("ab", "c")`` and ``("a", "bc")``
    differ): the only form in which a key is kept."""
    hashed = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        hashed.update(len(data).to_bytes(8, "big"))
        hashed.update(data)
    return hashed.digest()


@dataclass(frozen=True, kw_only=True, slots=True)
class Remembered(Generic[T]):
    value: T
    positive: bool
    decided_at: float
    """``clock()`` when the review that made this decision answered."""
    owner: bytes | None = None
    """The identity the decision was made for, when its kind has one (see the module
    docstring)."""


class Decisions(Generic[T]):
    """Decisions of one kind of review, by key digest.

    ``positive(value)`` tells a positive decision from a negative one (they have different
    TTLs and are kept apart). At most ``max_entries`` positive and ``max_negative`` negative
    decisions are kept; in each, the least recently decided go first.
    """

    def __init__(
        self,
        *,
        name: str,
        positive_ttl: float,
        negative_ttl: float,
        offline_window: float,
        max_entries: int,
        max_negative: int,
        max_per_owner: int | None = None,
        positive: Callable[[T], bool],
        outage: Callable[[BaseException], bool],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.positive_ttl = positive_ttl
        self.negative_ttl = negative_ttl
        self.offline_window = offline_window
        self.max_entries = max_entries
        self.max_negative = max_negative
        self.max_per_owner = max_per_owner
        self._positive = positive
        self._outage = outage
        self._clock = clock
        self._accepted: OrderedDict[bytes, Remembered[T]] = OrderedDict()
        """Positive decisions, oldest decided first."""
        self._refused: OrderedDict[bytes, Remembered[T]] = OrderedDict()
        """Negative decisions, oldest decided first."""
        self._flights: dict[bytes, asyncio.Task[T]] = {}
        self._owned: dict[bytes, OrderedDict[bytes, None]] = {}
        """Each owner's positive decisions, oldest decided first."""

    def __len__(self) -> int:
        return len(self._accepted) + len(self._refused)

    def _entry(self, key: bytes) -> Remembered[T] | None:
        entry = self._accepted.get(key)
        return entry if entry is not None else self._refused.get(key)

    # -- the synchronous rules ----------------------------------------------------------------

    def fresh(self, key: bytes) -> Remembered[T] | None:
        """The decision for ``key`` if it is still within its TTL."""
        entry = self._entry(key)
        if entry is None:
            return None
        ttl = self.positive_ttl if entry.positive else self.negative_ttl
        if self._clock() - entry.decided_at < ttl:
            return entry
        return None

    def held(self, key: bytes) -> Remembered[T] | None:
        """The decision for ``key`` if it was made within the offline window (for when the
        apiserver cannot be asked)."""
        entry = self._entry(key)
        if entry is None or self._clock() - entry.decided_at >= self.offline_window:
            return None
        return entry

    def known_positive(self, key: bytes) -> bool:
        """A positive decision for ``key`` is still kept (however old: it was made, so the
        key is no stranger)."""
        return key in self._accepted

    def remember(self, key: bytes, value: T, *, owner: bytes | None = None) -> Remembered[T]:
        entry = Remembered(
            value=value, positive=self._positive(value), decided_at=self._clock(), owner=owner
        )
        self._forget(key)
        kept = self._accepted if entry.positive else self._refused
        kept[key] = entry
        if entry.positive and owner is not None:
            owned = self._owned.setdefault(owner, OrderedDict())
            owned[key] = None
            if self.max_per_owner is not None and len(owned) > self.max_per_owner:
                self._forget(next(iter(owned)))
        self._prune(self._accepted, self.max_entries)
        self._prune(self._refused, self.max_negative)
        return entry

    def _forget(self, key: bytes) -> None:
        self._refused.pop(key, None)
        entry = self._accepted.pop(key, None)
        if entry is None or entry.owner is None:
            return
        owned = self._owned[entry.owner]
        del owned[key]
        if not owned:
            del self._owned[entry.owner]

    def _prune(self, entries: OrderedDict[bytes, Remembered[T]], bound: int) -> None:
        """Drop what can no longer be used (past both its TTL and the offline window), then
        the oldest beyond ``bound``. Entries are in decision order, oldest first."""
        keep = max(self.positive_ttl, self.negative_ttl, self.offline_window)
        now = self._clock()
        while entries:
            key, oldest = next(iter(entries.items()))
            if now - oldest.decided_at < keep and len(entries) <= bound:
                break
            self._forget(key)

    # -- asking -------------------------------------------------------------------------------

    async def decide(
        self,
        key: bytes,
        review: Callable[[], Awaitable[T]],
        *,
        admit: Callable[[], None] | None = None,
        owner: bytes | None = None,
    ) -> T:
        """The fresh decision for ``key``, or ``review()``'s (shared with every concurrent
        caller for the same key). A review that fails with an outage falls back to the
        decision held within the offline window; any other failure, or an outage with nothing
        held, is raised to every caller of that flight. ``admit()`` is called, and what it
        raises raised, before a review of this caller's own is started (see the module
        docstring)."""
        entry = self.fresh(key)
        if entry is not None:
            return entry.value
        flight = self._flights.get(key)
        if flight is None:
            if admit is not None:
                admit()
            flight = asyncio.create_task(
                self._fly(key, review, owner=owner), name=f"{self.name} review"
            )
            self._flights[key] = flight
            flight.add_done_callback(lambda _: self._flights.pop(key, None))
        # Shielded: a caller that goes away does not cancel the others' review.
        return await asyncio.shield(flight)

    async def _fly(
        self, key: bytes, review: Callable[[], Awaitable[T]], *, owner: bytes | None
    ) -> T:
        try:
            value = await review()
        except Exception as error:
            entry = self.held(key) if self._outage(error) else None
            if entry is None:
                raise
            return entry.value
        return self.remember(key, value, owner=owner).value

    async def close(self) -> None:
        """Cancel the reviews in flight and wait for them (shutdown)."""
        flights = list(self._flights.values())
        for flight in flights:
            flight.cancel()
        for flight in flights:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await flight
