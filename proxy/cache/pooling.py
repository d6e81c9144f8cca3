"""Connections to the cache file, and the pool of readers (docs/design.md §3).

Every SQLite call runs on a connection's own thread (aiosqlite keeps one per connection), and
every query is a plain function of ``reading`` or a writer's transaction shipped there whole by
:func:`on_thread`: one hop per transaction, not one await per statement.

:class:`Readers` lends a few reader connections to LIST streams, watch catch-ups, resume
checks and offline discovery; the pool is bounded, so a crowd of requests queues for a reader
instead of opening connections without end. A :class:`Snapshot` holds its reader for one
response; what bounds that time is the response's write deadline (``serve.streaming``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from proxy.cache import reading, schema
from proxy.cache.records import EventRecord

T = TypeVar("T")
RowT = TypeVar("RowT", reading.Row, reading.Head)

SNAPSHOT_BATCH_BYTES = 1 << 20
"""A snapshot's batches hold at most about this many bytes of objects (and at most ``batch``
rows): a LIST of large objects to a client that stopped reading pins one such batch."""


async def on_thread(db: aiosqlite.Connection, function: Callable[..., T], **kwargs: Any) -> T:
    """Run ``function(connection, **kwargs)`` on the connection's own thread.

    aiosqlite runs every call on one thread per connection; a whole transaction is shipped there
    in one hop rather than one await per statement. ``_execute``/``_conn`` are aiosqlite's own
    entry points for this (stable across 0.17-0.22); this is the one place we use them.
    """
    return await db._execute(lambda: function(db._conn, **kwargs))  # type: ignore[no-any-return,no-untyped-call]


async def connect(
    path: Path, *, synchronous: str, cache_kib: int, isolation_level: str | None
) -> aiosqlite.Connection:
    """A configured connection (``schema.configure``). One whose configuring fails or is
    cancelled (a task stopped at shutdown) is closed at once: the thread of a connection left
    open keeps the process from exiting."""
    db = await aiosqlite.connect(path, isolation_level=isolation_level, check_same_thread=False)
    try:
        await on_thread(db, schema.configure, synchronous=synchronous, cache_kib=cache_kib)
    except BaseException:
        await db.close()
        raise
    return db


@dataclass(frozen=True, kw_only=True, slots=True)
class Snapshot:
    """One consistent read of a shape: its RV, the log position of that state, and its
    objects, read as often as needed within the same read transaction
    (``reading.begin_snapshot``)."""

    rv: str
    last_seq: int
    kind: str
    api_version: str
    _db: aiosqlite.Connection
    _gen: int
    _namespace: str | None
    _batch: int

    async def _pages(self, read: Callable[..., list[RowT]]) -> AsyncIterator[list[RowT]]:
        after: tuple[str, str] | None = None
        while True:
            page = await on_thread(
                self._db,
                read,
                gen=self._gen,
                namespace=self._namespace,
                after=after,
                limit=self._batch,
                max_bytes=SNAPSHOT_BATCH_BYTES,
            )
            if not page:
                return
            yield page
            after = (page[-1][0], page[-1][1])

    @property
    def rows(self) -> AsyncIterator[list[reading.Row]]:
        """Batches of rows, ordered by key."""
        return self._pages(reading.object_rows)

    @property
    def heads(self) -> AsyncIterator[list[reading.Head]]:
        """The same rows' keys, labels and sizes, without their bodies."""
        return self._pages(reading.object_heads)


EventReadKey = tuple[int, int, int, int | None]
"""(shape id, after, limit, max bytes): log reads with equal keys answer each other."""


class Readers:
    """A bounded pool of reader connections, opened on first need."""

    def __init__(self, *, path: Path, synchronous: str, size: int) -> None:
        self._path = path
        self._synchronous = synchronous
        self._size = size
        self._idle: asyncio.Queue[aiosqlite.Connection] = asyncio.Queue()
        self._opened = 0
        self._opening = asyncio.Lock()
        self._event_reads: dict[EventReadKey, asyncio.Task[list[EventRecord]]] = {}
        """Log reads in flight, shared by every watcher asking the same (:meth:`events_after`)."""

    async def open_connection(self) -> aiosqlite.Connection:
        """A reader connection of its own, outside the pool (the caller closes it)."""
        return await connect(
            self._path,
            synchronous=self._synchronous,
            cache_kib=schema.READER_CACHE_KIB,
            isolation_level=None,
        )

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[aiosqlite.Connection]:
        """A pooled reader, lent until the block ends (a transaction left open is rolled back)."""
        async with self._opening:
            if self._idle.empty() and self._opened < self._size:
                self._idle.put_nowait(await self.open_connection())
                self._opened += 1
        db = await self._idle.get()
        try:
            yield db
        finally:
            if db.in_transaction:
                await db.execute("ROLLBACK")
            self._idle.put_nowait(db)

    async def read(self, function: Callable[..., T], **kwargs: Any) -> T:
        """``function(connection, **kwargs)`` (a ``reading`` function) on a pooled reader."""
        async with self.connection() as db:
            return await on_thread(db, function, **kwargs)

    @contextlib.asynccontextmanager
    async def snapshot(
        self, *, shape_id: int, namespace: str | None, batch: int
    ) -> AsyncIterator[Snapshot | None]:
        """A consistent read of the shape's objects at its current RV (a read transaction on a
        pooled reader, held until the block ends); None when the shape has no RV yet."""
        async with self.connection() as db:
            head = await on_thread(db, reading.begin_snapshot, shape_id=shape_id)
            if head is None:
                yield None
                return
            try:
                yield Snapshot(
                    rv=head.rv,
                    last_seq=head.last_seq,
                    kind=head.kind,
                    api_version=head.api_version,
                    _db=db,
                    _gen=head.gen,
                    _namespace=namespace or None,
                    _batch=batch,
                )
            finally:
                await on_thread(db, reading.end_snapshot)

    async def events_after(
        self, *, shape_id: int, after: int, limit: int, last_seq: int, max_bytes: int | None
    ) -> list[EventRecord]:
        """``reading.events_after``, one read in flight per (shape, after, limit, max_bytes).

        Watchers behind the ring that resume from the same position read the same batches: one
        database read answers all who ask for it meanwhile, so a crowd resuming together
        (clients that lost their connections at once) costs one reader, not one each, and LISTs
        still get a reader. The result is shared: callers must not change it."""
        key = (shape_id, after, limit, max_bytes)
        read = self._event_reads.get(key)
        if read is None:
            read = asyncio.create_task(
                self.read(
                    reading.events_after,
                    shape_id=shape_id,
                    after=after,
                    limit=limit,
                    last_seq=last_seq,
                    max_bytes=max_bytes,
                ),
                name=f"read events of shape {shape_id} after {after}",
            )
            self._event_reads[key] = read
            read.add_done_callback(lambda done: self._event_read_done(key, done))
        # A caller cancelled (its client left) does not cancel the read the others await.
        return await asyncio.shield(read)

    def _event_read_done(self, key: EventReadKey, read: asyncio.Task[list[EventRecord]]) -> None:
        del self._event_reads[key]
        if not read.cancelled():
            read.exception()  # retrieved: the callers that awaited it have raised it

    async def close(self) -> None:
        """Wait for shared reads in flight, then close the idle readers (every lent one has
        come back by the time its users are stopped)."""
        await asyncio.gather(*self._event_reads.values(), return_exceptions=True)
        while not self._idle.empty():
            await self._idle.get_nowait().close()
