"""The cache: one SQLite file, one writer, readers on their own connections.

:class:`Store` is the async shell around ``writing`` (transactions) and ``tailing``
(fan-out). The writer connection serialises every write; each write is one transaction and is
published to watchers only after it committed. Readers take a consistent snapshot (a read
transaction in WAL mode) so a LIST streams one RV's state however long it takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite
import orjson

from proxy.cache import memory, reading, schema, writing
from proxy.cache.records import Change, EventRecord
from proxy.cache.shapes import Encoding, ShapeKey
from proxy.cache.tailing import RING_SIZE, ShapeLog
from proxy.kube.status import StatusError
from proxy.metrics import Metrics

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True, slots=True)
class InlineCommit:
    """A watch batch this small is committed on the event loop's thread, not the writer's.

    Measured with 100 watchers at ~500 events/s: shipped to the writer's thread, a commit of a
    few events waited for the GIL behind the watchers' writes at each of its statements (p50
    5 ms, p99 100 ms), and every watcher waited for the commit. On the loop it takes well
    under a millisecond (WAL, and no checkpoint inside: ``schema.AUTOCHECKPOINT_PAGES``),
    about what the hop to the thread costs. Anything larger — fills, relist steps, a burst
    after a pause — goes to the thread, so the loop never stalls for long."""

    changes: int = 64
    bytes: int = 256 * 1024


INLINE_COMMIT = InlineCommit()

CHECKPOINT_INTERVAL = 1.0
"""Seconds between WAL checkpoints while commits arrive: a second of a busy collection's
commits is a few MB of WAL, copied in milliseconds, and readers search a short WAL quickly."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StoreSettings:
    path: Path
    synchronous: str = "NORMAL"
    """NORMAL loses nothing committed on a process crash; FULL also survives power loss."""
    retention_events: int = 200_000
    """Log entries kept per shape. etcd compacts after ~5 minutes; this keeps hours of a busy
    collection so a controller can resume a watch instead of relisting."""
    retention_seconds: float = 24 * 3600.0
    """Log entries older than this are dropped (the log starts after the newest dropped)."""
    readers: int = 4
    """Concurrent snapshot readers (LIST streams, initial watch state, log catch-up)."""
    ring_size: int = RING_SIZE
    """Newest log entries per shape kept in memory for watchers."""


@dataclass(kw_only=True, eq=False)
class Shape:
    """A shape's state as the writer last committed it (mirrors its ``shapes`` row)."""

    id: int
    key: ShapeKey
    configured: bool
    kind: str
    api_version: str
    rv: str | None
    log_start_rv: str | None
    used_at: float
    log: ShapeLog

    @property
    def resource(self) -> str:
        return self.key.gvr_label


RowT = TypeVar("RowT", reading.Row, reading.Head)

SNAPSHOT_BATCH_BYTES = 1 << 20
"""A snapshot's batches hold at most about this many bytes of objects (and at most ``batch``
rows): a LIST of large objects to a client that stopped reading pins one such batch."""


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
            page = await _on_thread(
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


async def _on_thread(db: aiosqlite.Connection, function: Callable[..., T], **kwargs: Any) -> T:
    """Run ``function(connection, **kwargs)`` on the connection's own thread.

    aiosqlite runs every call on one thread per connection; a whole transaction is shipped there
    in one hop rather than one await per statement. ``_execute``/``_conn`` are aiosqlite's own
    entry points for this (stable across 0.17-0.22); this is the one place we use them.
    """
    return await db._execute(lambda: function(db._conn, **kwargs))  # type: ignore[no-any-return,no-untyped-call]


class Store:
    def __init__(
        self, *, settings: StoreSettings, writer: aiosqlite.Connection, metrics: Metrics | None
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self._writer = writer
        self._write_lock = asyncio.Lock()
        self._inline_commits = 0
        """Commits on the event loop so far, which never checkpoint (:meth:`keep_checkpointed`
        looks for new ones; the writer's thread checkpoints its own)."""
        self._autocheckpoint = schema.AUTOCHECKPOINT_PAGES
        """The writer's ``wal_autocheckpoint`` now: 0 for inline commits (:meth:`_write`)."""
        self._readers: asyncio.Queue[aiosqlite.Connection] = asyncio.Queue()
        self._reader_count = 0
        self._reader_lock = asyncio.Lock()
        self._shape_lock = asyncio.Lock()
        self.shapes: dict[ShapeKey, Shape] = {}
        self.storage_error: str | None = None
        """The last write failure (disk full, I/O error), cleared by the next success."""
        self.integrity_error: str | None = None
        """The background integrity check found the file broken (it stays so)."""

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    async def open(cls, settings: StoreSettings, *, metrics: Metrics | None = None) -> Store:
        """Open (or create) the database; a foreign or corrupted file is moved aside: one that
        does not open, and one that the background integrity check of an earlier run found
        broken (:meth:`check_integrity` leaves a marker file)."""
        settings.path.parent.mkdir(parents=True, exist_ok=True)
        marker = _corrupt_marker(settings.path)
        try:
            if marker.exists():
                raise schema.SchemaError(
                    f"an integrity check found it broken: {marker.read_text()}"
                )
            writer = await cls._connect(settings)
            await _on_thread(writer, schema.migrate)
        except (sqlite3.DatabaseError, schema.SchemaError) as error:
            with contextlib.suppress(UnboundLocalError):
                await writer.close()
            aside = settings.path.with_name(f"{settings.path.name}.broken-{int(time.time())}")
            logger.error(
                "database %s unusable (%s); moved to %s, rebuilding from upstream",
                settings.path,
                error,
                aside,
            )
            for suffix in ("", "-wal", "-shm"):
                source = Path(f"{settings.path}{suffix}")
                if source.exists():
                    source.rename(f"{aside}{suffix}")
            marker.unlink(missing_ok=True)
            writer = await cls._connect(settings)
            await _on_thread(writer, schema.migrate)
        await _on_thread(writer, _checkpoint, mode="TRUNCATE")
        store = cls(settings=settings, writer=writer, metrics=metrics)
        for row in await _on_thread(writer, _load_shapes):
            store._remember(row)
        return store

    @staticmethod
    async def _connect(settings: StoreSettings) -> aiosqlite.Connection:
        db = await aiosqlite.connect(
            settings.path, isolation_level="DEFERRED", check_same_thread=False
        )
        await _on_thread(
            db,
            schema.configure,
            synchronous=settings.synchronous,
            cache_kib=schema.WRITER_CACHE_KIB,
        )
        return db

    def _remember(self, row: sqlite3.Row | tuple[Any, ...]) -> Shape:
        (
            id_,
            grp,
            version,
            resource,
            namespace,
            label_selector,
            field_selector,
            encoding,
            configured,
            kind,
            api_version,
            rv,
            log_start_rv,
            last_seq,
            used_at,
        ) = row
        key = ShapeKey(
            group=grp,
            version=version,
            resource=resource,
            namespace=namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            encoding=Encoding(encoding),
        )
        shape = Shape(
            id=id_,
            key=key,
            configured=bool(configured),
            kind=kind,
            api_version=api_version,
            rv=rv,
            log_start_rv=log_start_rv,
            used_at=used_at,
            log=ShapeLog(last_seq=last_seq, ring_size=self.settings.ring_size),
        )
        self.shapes[key] = shape
        return shape

    async def close(self) -> None:
        for shape in self.shapes.values():
            shape.log.close()
        while not self._readers.empty():
            await self._readers.get_nowait().close()
        async with self._write_lock:
            await self._writer.close()

    # -- writing ---------------------------------------------------------------------------

    async def _write(self, function: Callable[..., T], *, inline: bool = False, **kwargs: Any) -> T:
        """``function(connection, **kwargs)`` (a ``writing`` function) on the writer, one at a
        time: on its thread, or with ``inline`` on the event loop's own (:data:`INLINE_COMMIT`).
        The connection is never used by two threads at once: the write lock is held."""
        async with self._write_lock:
            started = time.perf_counter()
            try:
                connection = self._writer._conn
                pages = 0 if inline else schema.AUTOCHECKPOINT_PAGES
                if pages != self._autocheckpoint:  # a pragma: microseconds, the writer idle
                    connection.execute(f"PRAGMA wal_autocheckpoint = {pages}")
                    self._autocheckpoint = pages
                if inline:
                    result = function(connection, **kwargs)
                else:
                    result = await _on_thread(self._writer, function, **kwargs)
            except sqlite3.Error as error:
                self.storage_error = f"{type(error).__name__}: {error}"
                if self.metrics is not None:
                    self.metrics.storage_errors.inc()
                raise StorageError(self.storage_error) from error
            self.storage_error = None
            self._inline_commits += inline
            if self.metrics is not None:
                self.metrics.commit_duration.observe(time.perf_counter() - started)
            return result

    async def ensure_shape(self, key: ShapeKey, *, configured: bool) -> Shape:
        """The shape ``key``, created if new. Two clients asking for the same new shape at
        the same moment get the same one (the check and the insert are one critical
        section, not two awaits apart)."""
        async with self._shape_lock:
            existing = self.shapes.get(key)
            if existing is not None:
                if configured and not existing.configured:
                    await self._write(_set_configured, shape_id=existing.id)
                    existing.configured = True
                return existing
            row = await self._write(_insert_shape, key=key, configured=configured)
            return self._remember(row)

    async def drop_shape(self, shape: Shape) -> None:
        await self._write(writing.discard_shape, shape_id=shape.id)
        self.shapes.pop(shape.key, None)
        shape.log.close()

    async def touch(self, shape: Shape) -> None:
        """Mark the shape used (for dropping unused learned shapes); in memory, lazily saved."""
        shape.used_at = time.time()

    async def apply(self, shape: Shape, changes: Sequence[Change]) -> None:
        """Commit upstream events, then publish them (never the other way round)."""
        if not changes:
            return
        committed = await self._write(
            writing.apply_changes,
            inline=len(changes) <= INLINE_COMMIT.changes
            and sum(len(change.raw) for change in changes) <= INLINE_COMMIT.bytes,
            shape_id=shape.id,
            changes=changes,
            tail=self.settings.ring_size,
        )
        shape.rv = committed.rv
        shape.log.publish(last_seq=committed.last_seq, records=committed.records)

    async def stage(self, shape: Shape, objects: Sequence[Change]) -> None:
        await self._write(writing.stage, shape_id=shape.id, objects=objects)

    async def begin_list(self, shape: Shape) -> None:
        """``writing.begin_list``: before a list's first page (a fill, a relist, a retry)."""
        await self._write(writing.begin_list, shape_id=shape.id)

    async def finish_list(self, shape: Shape, *, rv: str, kind: str, api_version: str) -> int:
        """Make a staged list visible (a first fill, or a relist in bounded steps between
        which other shapes commit); returns events appended."""
        if shape.rv is None:
            committed = await self._write(
                writing.finish_fill, shape_id=shape.id, rv=rv, kind=kind, api_version=api_version
            )
        else:
            relist = writing.Relist(
                shape_id=shape.id,
                rv=rv,
                kind=kind,
                api_version=api_version,
                tail=self.settings.ring_size,
            )
            while (published := await self._write(relist.step)) is None:
                pass
            committed = published
        shape.rv, shape.kind, shape.api_version = rv, kind, api_version
        if shape.log_start_rv is None:
            shape.log_start_rv = rv
        shape.log.publish(last_seq=committed.last_seq, records=committed.records)
        await self.collect_garbage()
        memory.give_back()  # the list's batches passed through the heap
        return committed.count - 1  # the list-RV bookmark is a position, not an event

    async def collect_garbage(self) -> None:
        """Delete replaced and abandoned generations, a slice per transaction."""
        while await self._write(writing.collect_garbage):
            pass

    async def trim(self) -> int:
        """Apply log retention to every shape, then truncate the WAL."""
        dropped = 0
        for shape in list(self.shapes.values()):
            dropped += await self._write(
                writing.trim,
                shape_id=shape.id,
                max_events=self.settings.retention_events,
                max_age=self.settings.retention_seconds,
            )
            row = await self._write(_shape_log_start, shape_id=shape.id)
            shape.log_start_rv = row
        await self.collect_garbage()  # what an abandoned list or a dropped shape left
        memory.give_back()
        return dropped

    async def keep_checkpointed(self, *, interval: float = CHECKPOINT_INTERVAL) -> None:
        """Copy the WAL's new pages into the database every ``interval`` in which something
        was committed inline, on a connection of its own: inline commits never checkpoint
        (``schema.AUTOCHECKPOINT_PAGES``), so neither the writer nor a watcher waits for it.
        PASSIVE: it copies what no reader's snapshot still needs and never waits for a reader
        (a long LIST); the WAL restarts at the first commit after a complete one. Runs until
        cancelled."""
        checkpointed = 0
        db = await self._new_reader()
        try:
            while True:
                await asyncio.sleep(interval)
                if self._inline_commits != checkpointed:
                    checkpointed = self._inline_commits
                    await _on_thread(db, _checkpoint, mode="PASSIVE")
        finally:
            await db.close()

    async def save_usage(self) -> None:
        await self._write(_save_usage, used={s.id: s.used_at for s in self.shapes.values()})

    # -- discovery documents ----------------------------------------------------------------

    async def get_document(self, key: str) -> tuple[int, bytes, bytes, str] | None:
        return await self._read(reading.get_document, key=key)

    async def document_keys(self) -> list[str]:
        return await self._read(reading.document_keys)

    async def put_document(
        self, key: str, *, status: int, headers: bytes, body: bytes, etag: str
    ) -> None:
        await self._write(
            _put_document, key=key, status=status, headers=headers, body=body, etag=etag
        )

    # -- reading ---------------------------------------------------------------------------

    async def _read(self, function: Callable[..., T], **kwargs: Any) -> T:
        """``function(connection, **kwargs)`` (a ``reading`` function) on a pooled reader."""
        async with self._reader() as db:
            return await _on_thread(db, function, **kwargs)

    @contextlib.asynccontextmanager
    async def _reader(self) -> AsyncIterator[aiosqlite.Connection]:
        async with self._reader_lock:
            if self._readers.empty() and self._reader_count < self.settings.readers:
                self._readers.put_nowait(await self._new_reader())
                self._reader_count += 1
        db = await self._readers.get()
        try:
            yield db
        finally:
            if db.in_transaction:
                await db.execute("ROLLBACK")
            self._readers.put_nowait(db)

    async def _new_reader(self) -> aiosqlite.Connection:
        """A configured reader connection. One whose opening fails or is cancelled (a task
        stopped at shutdown) is closed at once: :meth:`close` closes only the pooled ones,
        and the thread of a connection left open keeps the process from exiting."""
        db = await aiosqlite.connect(self.settings.path, isolation_level=None)
        try:
            await _on_thread(
                db,
                schema.configure,
                synchronous=self.settings.synchronous,
                cache_kib=schema.READER_CACHE_KIB,
            )
        except BaseException:
            await db.close()
            raise
        return db

    @contextlib.asynccontextmanager
    async def snapshot(
        self, shape: Shape, *, namespace: str | None = None, batch: int = 1000
    ) -> AsyncIterator[Snapshot]:
        """A consistent read of the shape's objects at its current RV (a read transaction)."""
        async with self._reader() as db:
            head = await _on_thread(db, reading.begin_snapshot, shape_id=shape.id)
            if head is None:
                raise StatusError.service_unavailable(
                    f"the cache of {shape.resource} is not filled yet"
                )
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
                await _on_thread(db, reading.end_snapshot)

    async def read_events(
        self, shape: Shape, *, after: int, limit: int, max_bytes: int | None = None
    ) -> list[EventRecord]:
        """Committed log entries after seq ``after`` (from memory when the ring reaches; from
        the database at most ``max_bytes`` of objects, but at least one entry)."""
        in_memory = shape.log.read_after(after, limit=limit)
        if in_memory is not None:
            return in_memory
        return await self._read(
            reading.events_after,
            shape_id=shape.id,
            after=after,
            limit=limit,
            last_seq=shape.log.last_seq,
            max_bytes=max_bytes,
        )

    async def position(self, shape: Shape, rv: str) -> int:
        """``reading.position`` of ``rv`` in the shape's log."""
        assert shape.rv is not None and shape.log_start_rv is not None
        return await self._read(reading.position, shape_id=shape.id, rv=rv)

    async def check_integrity(self) -> bool:
        """Run SQLite's ``quick_check`` on a reader (in the background: it is O(size)). A
        broken file is reported (``storage_error``, so /readyz fails; logged; counted) and
        marked, and the next start moves it aside and rebuilds from upstream."""
        try:
            problem = await self._read(schema.integrity_problem)
        except sqlite3.DatabaseError as error:
            problem = str(error)
        if problem is None:
            return True
        logger.error("database %s failed its integrity check: %s", self.settings.path, problem)
        _corrupt_marker(self.settings.path).write_text(problem)
        self.integrity_error = f"integrity check failed ({problem}); rebuilt at the next start"
        if self.metrics is not None:
            self.metrics.storage_errors.inc()
        return False

    async def get_object(self, shape: Shape, *, namespace: str, name: str) -> bytes | None:
        """``reading.get_object``."""
        return await self._read(
            reading.get_object, shape_id=shape.id, namespace=namespace, name=name
        )

    async def present(
        self, shape: Shape, keys: Sequence[tuple[str, str]]
    ) -> tuple[tuple[str, str], ...]:
        """``reading.present``: which of ``keys`` (namespace, name) the shape holds now."""
        return await self._read(reading.present, shape_id=shape.id, keys=keys)

    async def object_counts(self) -> dict[int, int]:
        """``reading.object_counts``."""
        return await self._read(reading.object_counts)

    def size(self) -> tuple[int, int]:
        """Database and WAL file sizes in bytes."""
        sizes = []
        for suffix in ("", "-wal"):
            try:
                sizes.append(os.path.getsize(f"{self.settings.path}{suffix}"))
            except OSError:
                sizes.append(0)
        return sizes[0], sizes[1]


class StorageError(Exception):
    """A write failed (disk full, I/O error). Nothing of it was committed: the transaction
    rolled back, so the cache is still the consistent state of the last commit."""


# -- small transactions (writer thread) ----------------------------------------------------

_SHAPE_COLUMNS = (
    "id, grp, version, resource, namespace, label_selector, field_selector, encoding, "
    "configured, kind, api_version, rv, log_start_rv, last_seq, used_at"
)


def _load_shapes(connection: sqlite3.Connection) -> list[tuple[Any, ...]]:
    # A list interrupted by a crash starts over; what it wrote is garbage, collected in slices
    # by the first maintenance pass (so a warm start does not wait for it).
    writing.abandon_lists(connection)
    return connection.execute(f"SELECT {_SHAPE_COLUMNS} FROM shapes ORDER BY id").fetchall()


def _insert_shape(
    connection: sqlite3.Connection, *, key: ShapeKey, configured: bool
) -> tuple[Any, ...]:
    now = time.time()
    with connection:
        connection.execute(
            "INSERT INTO shapes (key, grp, version, resource, namespace, label_selector, "
            "field_selector, encoding, configured, created_at, used_at, gen) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                key.identity,
                key.group,
                key.version,
                key.resource,
                key.namespace,
                key.label_selector,
                key.field_selector,
                str(key.encoding),
                int(configured),
                now,
                now,
                writing.new_generation(connection),
            ),
        )
        row: tuple[Any, ...] = connection.execute(
            f"SELECT {_SHAPE_COLUMNS} FROM shapes WHERE key = ?", (key.identity,)
        ).fetchone()
    return row


def _set_configured(connection: sqlite3.Connection, *, shape_id: int) -> None:
    with connection:
        connection.execute("UPDATE shapes SET configured = 1 WHERE id = ?", (shape_id,))


def _shape_log_start(connection: sqlite3.Connection, *, shape_id: int) -> str | None:
    row = connection.execute("SELECT log_start_rv FROM shapes WHERE id = ?", (shape_id,)).fetchone()
    return row[0] if row else None


def _save_usage(connection: sqlite3.Connection, *, used: dict[int, float]) -> None:
    with connection:
        connection.executemany(
            "UPDATE shapes SET used_at = ? WHERE id = ?",
            ((at, shape_id) for shape_id, at in used.items()),
        )


def _put_document(
    connection: sqlite3.Connection, *, key: str, status: int, headers: bytes, body: bytes, etag: str
) -> None:
    with connection:
        connection.execute(
            "INSERT OR REPLACE INTO discovery (key, status, headers, body, etag, stored_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (key, status, headers, body, etag, time.time()),
        )


def _corrupt_marker(path: Path) -> Path:
    return path.with_name(f"{path.name}.corrupt")


def _checkpoint(connection: sqlite3.Connection, *, mode: str) -> None:
    """TRUNCATE at start (nobody reads yet); PASSIVE otherwise: it copies what it can and
    never waits for readers, whose snapshots (a long LIST) would hold the writer up."""
    connection.execute(f"PRAGMA wal_checkpoint({mode})")


def encode_headers(headers: Sequence[tuple[str, str]]) -> bytes:
    return orjson.dumps([list(h) for h in headers])
