"""The tail of each shape's event log, in memory: watchers pull from it; the writer never waits.

The writer publishes each committed batch to the shape's :class:`ShapeLog`: a bounded ring of
the newest records plus a "something new" signal. Watchers pull: each keeps its own cursor
(a seq) and reads from the ring, or from the database when it has fallen behind the ring. The
writer never waits for a watcher, and a slow watcher costs only its own memory-free cursor.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence

from proxy.cache.records import EventRecord

RING_SIZE = 4096
"""Newest records kept in memory per shape: a watcher within this many of the head never
touches the database. Bounded so memory does not grow with traffic or object count."""


class ShapeLog:
    """The in-memory tail of one shape's event log."""

    def __init__(self, *, last_seq: int, ring_size: int = RING_SIZE) -> None:
        self.last_seq = last_seq
        self._ring: deque[EventRecord] = deque(maxlen=ring_size)
        self._changed = asyncio.Event()
        self.closed = False

    def publish(self, *, last_seq: int, records: Sequence[EventRecord]) -> None:
        """Called by the writer after commit, never before (docs/design.md §3: no time travel).

        ``records`` may be only the tail of what was committed; anything older than the ring
        is read back from the database by watchers that need it.
        """
        if records and records[0].seq != last_seq - len(records) + 1:
            raise ValueError("published records must end at last_seq")
        if records and self._ring and records[0].seq != self._ring[-1].seq + 1:
            self._ring.clear()  # a gap (tail-only publish): keep the ring contiguous
        self._ring.extend(records)
        self.last_seq = last_seq
        self._wake()

    def close(self) -> None:
        """The shape is gone: wake every watcher so it can end its stream."""
        self.closed = True
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
