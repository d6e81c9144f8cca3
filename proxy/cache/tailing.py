"""The tail of each shape's event log, in memory: watchers read from it; the writer never waits.

The writer publishes each committed batch to the shape's :class:`ShapeLog`: a bounded ring of
the newest records plus a "something new" signal. Each watcher keeps its own cursor (a seq)
and reads from the ring, or from the database when it has fallen behind the ring. The writer
never waits for a watcher, and a slow watcher costs only its own memory-free cursor.

A watcher that has sent everything parks as a :class:`Follower`. The next batch is *offered*
to it within :meth:`ShapeLog.publish` itself: a follower that can take it at once (its
client's socket accepts the bytes without waiting) does so and stays parked; any other is
woken to read the batch itself. With a hundred watchers this is the difference between one
pass over their sockets per commit and a hundred task switches (docs/design.md §5).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from proxy.cache.records import EventRecord

logger = logging.getLogger(__name__)

RING_SIZE = 4096
"""Newest records kept in memory per shape: a watcher within this many of the head never
touches the database. Bounded so memory does not grow with traffic or object count."""

RING_BYTES = 16 * 1024 * 1024
"""...and at most about this many bytes of them: with large objects (1.5 MiB at most) or
many learned shapes (``--max-shapes``) a count alone would bound nothing. Sized so that it
bites only above ~4 KiB a record (a typical object and its previous version): a full ring
of typical objects still holds the last 4096 changes, which a crowd of watchers resuming
together reads without the database. A watcher further behind reads the database."""

_RECORD_OVERHEAD = 200
"""Bytes of an EventRecord besides its byte strings (the object, its slots, the strings)."""


def _size(record: EventRecord) -> int:
    return (
        _RECORD_OVERHEAD
        + len(record.raw or b"")
        + len(record.prev_raw or b"")
        + len(record.labels or b"")
        + len(record.prev_labels or b"")
    )


class Follower(Protocol):
    """A parked watcher: it has sent everything up to its cursor and waits for more."""

    def offer(self, records: Sequence[EventRecord]) -> bool:
        """Take the newly committed ``records`` at once, without waiting, and move the cursor
        past them; False (having taken nothing) when it cannot — ``records`` do not follow
        its cursor, or its client's socket would make it wait. It is then woken."""

    def wake(self) -> None:
        """Resume the watcher's own loop, which reads what follows its cursor."""


class ShapeLog:
    """The in-memory tail of one shape's event log."""

    def __init__(
        self, *, last_seq: int, ring_size: int = RING_SIZE, ring_bytes: int = RING_BYTES
    ) -> None:
        self.last_seq = last_seq
        self._ring: deque[EventRecord] = deque()
        self._ring_size = ring_size
        self._ring_bytes = ring_bytes
        self._bytes = 0
        self._changed = asyncio.Event()
        self._parked: dict[Follower, None] = {}
        """Followers in the order they parked (a dict: an ordered set)."""
        self.closed = False

    def park(self, follower: Follower, *, cursor: int) -> bool:
        """Offer ``follower`` what is published from now on, until it is woken or unparks
        itself. False (not parked) when something after its ``cursor`` is already committed
        (it must read that first), or the log is closed."""
        if self.closed or cursor < self.last_seq:
            return False
        self._parked[follower] = None
        return True

    def unpark(self, follower: Follower) -> None:
        self._parked.pop(follower, None)

    def publish(self, *, last_seq: int, records: Sequence[EventRecord]) -> None:
        """Called by the writer after commit, never before (docs/design.md §3: no time travel).

        ``records`` may be only the tail of what was committed; anything older than the ring
        is read back from the database by watchers that need it.
        """
        if records and records[0].seq != last_seq - len(records) + 1:
            raise ValueError("published records must end at last_seq")
        if records and self._ring and records[0].seq != self._ring[-1].seq + 1:
            self._ring.clear()  # a gap (tail-only publish): keep the ring contiguous
            self._bytes = 0
        ring = self._ring
        for record in records:
            ring.append(record)
            self._bytes += _size(record)
        while ring and (len(ring) > self._ring_size or self._bytes > self._ring_bytes):
            self._bytes -= _size(ring.popleft())
        self.last_seq = last_seq
        if self._parked:
            self._offer(records)
        self._wake()

    def _offer(self, records: Sequence[EventRecord]) -> None:
        """Each parked follower takes ``records`` or is woken (and unparked) to read them."""
        woken: list[Follower] = []
        for follower in self._parked:
            try:
                taken = bool(records) and follower.offer(records)
            except Exception:
                # The writer must not fail for a watcher's sake; the watcher, woken, meets
                # the problem again in its own loop and ends its own stream.
                logger.exception("a parked watcher failed to take published events")
                taken = False
            if not taken:
                woken.append(follower)
        for follower in woken:
            del self._parked[follower]
            follower.wake()

    def close(self) -> None:
        """The shape is gone: wake every watcher so it can end its stream."""
        self.closed = True
        parked, self._parked = self._parked, {}
        for follower in parked:
            follower.wake()
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_beyond(self, seq: int, *, timeout: float) -> bool:
        """Wait until something after ``seq`` is committed (or the shape closes); False on
        timeout."""
        if self.last_seq > seq or self.closed:
            return True
        changed = self._changed
        try:
            async with asyncio.timeout(timeout):  # not wait_for: no task per wait
                await changed.wait()
        except TimeoutError:
            return self.last_seq > seq or self.closed
        return True

    def read_after(self, seq: int, *, limit: int) -> list[EventRecord] | None:
        """Records after ``seq`` from memory, or None if the ring no longer reaches back."""
        if seq >= self.last_seq:
            return []
        if not self._ring or self._ring[0].seq > seq + 1:
            return None
        start = seq + 1 - self._ring[0].seq  # the ring holds contiguous seqs
        end = min(start + limit, len(self._ring))
        return [self._ring[i] for i in range(start, end)]
