"""The cache: one SQLite file, one writer, readers on their own connections.

:class:`Store` is the async shell around the writer's transactions (``appending``,
``relisting``, ``maintaining``, ``registering``: see ``writing``), ``reading``
(queries, on ``pooling.Readers``) and ``tailing`` (each shape's ring of new log entries), and
holds the registry of shapes (``shapes.Shape``). The writer connection serialises every write;
each write is one transaction and is published to watchers only after it committed. Readers
take a consistent snapshot (a read transaction in WAL mode) so a LIST streams one RV's state
however long it takes (docs/design.md §3).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import stat
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from proxy.cache import (
    appending,
    maintaining,
    memory,
    reading,
    registering,
    relisting,
    schema,
    snapshotting,
    writing,
)
from proxy.cache.pooling import Readers, Snapshot, connect, on_thread
from proxy.cache.records import Change, EventRecord
from proxy.cache.shapes import Shape, ShapeKey
from proxy.cache.tailing import RING_SIZE
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

BYTES_HEADROOM = 8
"""A log over ``retention_bytes`` is cut to ``1 - 1/BYTES_HEADROOM`` of it (7/8), not to the
bound itself: a collection at its bound would otherwise be trimmed after every commit, one
more transaction each; this way once per eighth of the bound appended (32 MiB at the
default)."""

PRIVATE_MODE = 0o600
"""The database, its WAL and its shared-memory file: they hold every cached object, Secrets
included, so only warmwatch's own user may read them."""

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
    retention_bytes: int = 256 * 1024 * 1024
    """Bytes of log entries (their objects, new and old, and labels: ``schema.EVENT_BYTES``)
    kept per shape. The count alone bounds nothing for large objects: 200,000 entries of up
    to 1.5 MiB (etcd's limit) each; 150 updates of one 878 KiB ConfigMap grew the database by
    141 MiB. 256 MiB leaves the count in charge for typical objects (200,000 entries of
    1.3 KiB), and keeps ~60,000 changes of 4 KiB Pods (10 minutes at 100 a second, twice
    etcd's window) or ~300 of that ConfigMap. Enforced as soon as a commit takes a log past
    it, so the database grows by no more than this per shape (and one commit). No total
    across shapes: one collection's churn would take another's history; a quiet
    collection's log stays small, and ``--max-shapes`` bounds how many there are."""
    readers: int = 4
    """Concurrent snapshot readers (LIST streams, initial watch state, log catch-up)."""
    ring_size: int = RING_SIZE
    """Newest log entries per shape kept in memory for watchers."""

    def __post_init__(self) -> None:
        # Checked here, not only by the flag's choices: the value becomes a PRAGMA, where
        # SQLite reads anything else as another level ("0" is OFF, which a crash can corrupt).
        if self.synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"--sync-mode is NORMAL or FULL, not {self.synchronous!r}")
        if not self.retention_bytes > 0:
            raise ValueError("--retention-bytes must be positive")


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
        self._readers = Readers(
            path=settings.path, synchronous=settings.synchronous, size=settings.readers
        )
        self._new_shapes: dict[ShapeKey, bool] = {}
        """Shapes asked for and not inserted yet (and whether configured): the next
        :meth:`_insert_new_shapes` inserts them all in one transaction."""
        self._inserting: asyncio.Task[None] | None = None
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
        keep_private(settings.path)
        marker = _corrupt_marker(settings.path)
        try:
            if marker.exists():
                raise schema.SchemaError(
                    f"an integrity check found it broken: {marker.read_text()}"
                )
            writer = await cls._connect(settings)
            await on_thread(writer, schema.migrate)
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
            keep_private(settings.path)
            writer = await cls._connect(settings)
            await on_thread(writer, schema.migrate)
        await on_thread(writer, maintaining.checkpoint, mode="TRUNCATE")
        store = cls(settings=settings, writer=writer, metrics=metrics)
        for row in await on_thread(writer, registering.open_shapes):
            store._remember(row, how="resumed")
        return store

    @staticmethod
    async def _connect(settings: StoreSettings) -> aiosqlite.Connection:
        return await connect(
            settings.path,
            synchronous=settings.synchronous,
            cache_kib=schema.WRITER_CACHE_KIB,
            isolation_level="DEFERRED",
        )

    def _remember(self, row: tuple[Any, ...], *, how: str) -> Shape:
        """Hold the shape of a ``shapes`` row, and log what it is, once per process: metrics
        name a shape by its id alone (``proxy.metrics``), this line says which selectors it
        has. ``how``: resumed (from the file) or new."""
        shape = Shape.from_row(row, ring_size=self.settings.ring_size)
        self.shapes[shape.key] = shape
        fields = shape.key.described()
        selected = "".join(
            f' {name}="{fields[name]}"'
            for name in ("labelSelector", "fieldSelector")
            if fields[name]
        )
        logger.info(
            "shape %d (%s, %s): %s%s%s %s",
            shape.id,
            how,
            "configured" if shape.configured else "learned",
            fields["resource"],
            f" namespace={fields['namespace']}" if fields["namespace"] else "",
            selected,
            fields["encoding"],
            extra={"shape": shape.id, "configured": shape.configured, **fields},
        )
        return shape

    async def close(self) -> None:
        for shape in self.shapes.values():
            shape.log.close()
        await self._readers.close()
        if self._inserting is not None:
            await asyncio.gather(self._inserting, return_exceptions=True)
        async with self._write_lock:
            await self._writer.close()

    # -- writing ---------------------------------------------------------------------------

    async def _write(self, function: Callable[..., T], *, inline: bool = False, **kwargs: Any) -> T:
        """``function(connection, **kwargs)`` (a transaction: ``appending``, ``relisting``, ...)
        on the writer, one at a time: on its thread, or with ``inline`` on the event loop's own
        (:data:`INLINE_COMMIT`). The connection is never used by two threads at once: the write
        lock is held."""
        async with self._write_lock:
            return await self._write_locked(function, inline=inline, **kwargs)

    async def _write_locked(
        self, function: Callable[..., T], *, inline: bool = False, **kwargs: Any
    ) -> T:
        """:meth:`_write` for a caller that holds the write lock."""
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
                result = await on_thread(self._writer, function, **kwargs)
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
        the same moment get the same one.

        New shapes asked for while the writer is busy are inserted together, in one
        transaction: a controller starting asks for dozens at once (kube-controller-manager:
        ~60), and inserted one after another, each behind the commits of the fills already
        under way, they took seconds to learn while a large collection filled."""
        while (existing := self.shapes.get(key)) is None:
            self._new_shapes[key] = self._new_shapes.get(key, False) or configured
            if self._inserting is None:
                self._inserting = asyncio.create_task(
                    self._insert_new_shapes(), name="inserting new shapes"
                )
            # A caller cancelled (its client left) does not cancel the others' insert.
            await asyncio.shield(self._inserting)
        if configured and not existing.configured:
            existing.configured = True
            await self._write(registering.set_configured, shape_id=existing.id)
        return existing

    async def _insert_new_shapes(self) -> None:
        """Insert every shape asked for until the writer is free for it."""
        async with self._write_lock:
            self._inserting = None  # shapes asked for from now on go into the next insert
            new, self._new_shapes = self._new_shapes, {}
            # A shape asked for again while the previous insert was on the writer's thread
            # was not known yet, and is in this batch too: it is now.
            new = {key: configured for key, configured in new.items() if key not in self.shapes}
            rows = await self._write_locked(registering.insert_shapes, shapes=new) if new else []
        for row in rows:
            self._remember(row, how="new")

    async def drop_shape(self, shape: Shape) -> None:
        with contextlib.suppress(writing.ShapeGone):  # dropped meanwhile by another path
            await self._write(registering.discard_shape, shape_id=shape.id)
        if self.shapes.get(shape.key) is shape:
            del self.shapes[shape.key]
        shape.log.close()

    async def touch(self, shape: Shape) -> None:
        """Mark the shape used (for dropping unused learned shapes); in memory, lazily saved."""
        shape.used_at = time.time()

    async def apply(self, shape: Shape, changes: Sequence[Change]) -> None:
        """Commit upstream events, then publish them (never the other way round)."""
        if not changes:
            return
        if shape.unpublished:
            await self._drop_unpublished(shape)
        committed = await self._write(
            appending.apply_changes,
            inline=len(changes) <= INLINE_COMMIT.changes
            and sum(len(change.raw) for change in changes) <= INLINE_COMMIT.bytes,
            shape_id=shape.id,
            changes=changes,
            tail=self.settings.ring_size,
        )
        shape.rv = committed.rv
        shape.log.publish(last_seq=committed.last_seq, records=committed.records)
        await self._bound_log(shape, log_bytes=committed.log_bytes)

    async def stage(self, shape: Shape, objects: Sequence[Change]) -> None:
        await self._write(relisting.stage, shape_id=shape.id, objects=objects)

    async def begin_list(self, shape: Shape) -> None:
        """``relisting.begin_list``: before a list's first page (a fill, a relist, a retry).
        What an abandoned relist appended to the log is deleted first, in slices."""
        if shape.unpublished:
            await self._drop_unpublished(shape)
        await self._write(relisting.begin_list, shape_id=shape.id)

    async def _drop_unpublished(self, shape: Shape) -> None:
        """``relisting.drop_unpublished`` until none is left, a slice per transaction (other
        shapes commit in between)."""
        while await self._write(relisting.drop_unpublished, shape_id=shape.id):
            pass
        shape.unpublished = False

    async def finish_list(self, shape: Shape, *, rv: str, kind: str, api_version: str) -> int:
        """Make a staged list visible (a first fill, or a relist in bounded steps between
        which other shapes commit); returns events appended."""
        if shape.rv is None:
            committed = await self._write(
                relisting.finish_fill, shape_id=shape.id, rv=rv, kind=kind, api_version=api_version
            )
        else:
            relist = relisting.Relist(
                shape_id=shape.id,
                rv=rv,
                kind=kind,
                api_version=api_version,
                tail=self.settings.ring_size,
            )
            try:
                while (published := await self._write(relist.step)) is None:
                    pass
            except BaseException:
                shape.unpublished = True  # the steps so far appended to the log
                raise
            committed = published
        shape.rv, shape.kind, shape.api_version = rv, kind, api_version
        if shape.log_start_rv is None:
            shape.log_start_rv = rv
        shape.log.publish(last_seq=committed.last_seq, records=committed.records)
        await self._bound_log(shape, log_bytes=committed.log_bytes)
        await self.collect_garbage()
        memory.give_back()  # the list's batches passed through the heap
        return committed.count - 1  # the list-RV bookmark is a position, not an event

    async def collect_garbage(self) -> None:
        """Delete replaced and abandoned generations, a slice per transaction."""
        while await self._write(maintaining.collect_garbage):
            pass

    async def trim(self) -> int:
        """Apply log retention to every shape (a shape dropped while the pass goes on is
        passed over), collect garbage; returns how many entries were dropped."""
        dropped = 0
        for shape in list(self.shapes.values()):
            dropped += await self._trim_shape(shape)
        await self.collect_garbage()  # what an abandoned list or a dropped shape left
        memory.give_back()
        return dropped

    async def _bound_log(self, shape: Shape, *, log_bytes: int) -> None:
        """After a commit: a log it took past ``retention_bytes`` is trimmed now, not at the
        next maintenance pass, by when a collection of large objects could have written
        gigabytes."""
        shape.log_bytes = log_bytes
        if log_bytes > self.settings.retention_bytes:
            await self._trim_shape(shape)

    async def _trim_shape(self, shape: Shape) -> int:
        """``maintaining.trim`` of one shape, a slice per transaction (other shapes commit in
        between); a log over ``retention_bytes`` is cut to 7/8 of it (:data:`BYTES_HEADROOM`).
        Returns how many entries were dropped; stops when the shape was dropped meanwhile
        (its row, or its place in the registry, is gone)."""
        bound = self.settings.retention_bytes
        max_bytes = bound - bound // BYTES_HEADROOM if shape.log_bytes > bound else bound
        dropped = 0
        while self.shapes.get(shape.key) is shape:
            try:
                trimmed = await self._write(
                    maintaining.trim,
                    shape_id=shape.id,
                    max_events=self.settings.retention_events,
                    max_age=self.settings.retention_seconds,
                    max_bytes=max_bytes,
                )
            except writing.ShapeGone:
                break
            shape.log_start_rv = trimmed.log_start_rv
            shape.log_bytes = trimmed.log_bytes
            dropped += trimmed.dropped
            if trimmed.reason is not None and self.metrics is not None:
                trims = self.metrics.events_trimmed.labels(
                    resource=shape.resource, reason=trimmed.reason
                )
                trims.inc(trimmed.dropped)
            if not trimmed.more:
                break
        return dropped

    async def keep_checkpointed(self, *, interval: float = CHECKPOINT_INTERVAL) -> None:
        """Copy the WAL's new pages into the database every ``interval`` in which something
        was committed inline, on a connection of its own: inline commits never checkpoint
        (``schema.AUTOCHECKPOINT_PAGES``), so neither the writer nor a watcher waits for it.
        PASSIVE: it copies what no reader's snapshot still needs and never waits for a reader
        (a long LIST); the WAL restarts at the first commit after a complete one. Runs until
        cancelled."""
        checkpointed = 0
        db = await self._readers.open_connection()
        try:
            while True:
                await asyncio.sleep(interval)
                if self._inline_commits != checkpointed:
                    checkpointed = self._inline_commits
                    await on_thread(db, maintaining.checkpoint, mode="PASSIVE")
        finally:
            await db.close()

    async def save_usage(self) -> None:
        await self._write(
            registering.save_usage, used={s.id: s.used_at for s in self.shapes.values()}
        )

    # -- discovery documents ----------------------------------------------------------------

    async def get_document(self, key: str) -> tuple[int, bytes, bytes, str] | None:
        return await self._readers.read(reading.get_document, key=key)

    async def document_sizes(self) -> list[tuple[str, int]]:
        return await self._readers.read(reading.document_sizes)

    async def put_document(
        self,
        key: str,
        *,
        status: int,
        headers: bytes,
        body: bytes,
        etag: str,
        evict: Sequence[str] = (),
    ) -> None:
        await self._write(
            registering.put_document,
            key=key,
            status=status,
            headers=headers,
            body=body,
            etag=etag,
            evict=evict,
        )

    async def drop_documents(self, keys: Sequence[str]) -> None:
        if keys:
            await self._write(registering.drop_documents, keys=keys)

    # -- reading ---------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def snapshot(
        self, shape: Shape, *, namespace: str | None = None, batch: int = 1000
    ) -> AsyncIterator[Snapshot]:
        """A consistent read of the shape's objects at its current RV (``pooling.Snapshot``)."""
        async with self._readers.snapshot(
            shape_id=shape.id, namespace=namespace, batch=batch
        ) as snapshot:
            if snapshot is None:
                raise StatusError.service_unavailable(
                    f"the cache of {shape.resource} is not filled yet"
                )
            yield snapshot

    async def read_events(
        self, shape: Shape, *, after: int, limit: int, max_bytes: int | None = None
    ) -> list[EventRecord]:
        """Committed log entries after seq ``after``: from the shape's ring when it reaches,
        else from the database (``pooling.Readers.events_after``: at most ``max_bytes`` of
        objects, but at least one entry; one read shared by every watcher asking the same).
        The result is shared: callers must not change it."""
        in_memory = shape.log.read_after(after, limit=limit)
        if in_memory is not None:
            return in_memory
        return await self._readers.events_after(
            shape_id=shape.id,
            after=after,
            limit=limit,
            last_seq=shape.log.last_seq,
            max_bytes=max_bytes,
        )

    async def position(self, shape: Shape, rv: str) -> int:
        """``reading.position`` of ``rv`` in the shape's log."""
        assert shape.rv is not None and shape.log_start_rv is not None
        return await self._readers.read(reading.position, shape_id=shape.id, rv=rv)

    async def check_integrity(self) -> bool:
        """Run SQLite's ``quick_check`` on a reader (in the background: it is O(size)). A
        broken file is reported (``storage_error``, so /readyz fails; logged; counted) and
        marked, and the next start moves it aside and rebuilds from upstream."""
        try:
            problem = await self._readers.read(schema.integrity_problem)
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

    async def copy_into(self, target: Path) -> None:
        """``snapshotting.copy_into`` a new private file at ``target`` (on a reader: the
        writer goes on). The caller deletes it."""
        target.unlink(missing_ok=True)
        keep_private(target)
        await self._readers.read(snapshotting.copy_into, target=target)

    async def cluster_identity(self) -> str | None:
        """``snapshotting.cluster_identity``."""
        return await self._readers.read(snapshotting.cluster_identity)

    async def record_cluster_identity(self, uid: str) -> None:
        """``snapshotting.record_cluster_identity``; a changed identity is logged."""
        before = await self._write(snapshotting.record_cluster_identity, uid=uid)
        if before is not None and before != uid:
            logger.warning(
                "database %s was filled from another cluster (kube-system uid %s, now %s)",
                self.settings.path,
                before,
                uid,
            )

    async def get_object(self, shape: Shape, *, namespace: str, name: str) -> bytes | None:
        """``reading.get_object``."""
        return await self._readers.read(
            reading.get_object, shape_id=shape.id, namespace=namespace, name=name
        )

    async def present(
        self, shape: Shape, keys: Sequence[tuple[str, str]]
    ) -> tuple[tuple[str, str], ...]:
        """``reading.present``: which of ``keys`` (namespace, name) the shape holds now."""
        return await self._readers.read(reading.present, shape_id=shape.id, keys=keys)

    async def object_counts(self) -> dict[int, int]:
        """``reading.object_counts``."""
        return await self._readers.read(reading.object_counts)

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


def keep_private(path: Path) -> None:
    """Make the database at ``path`` and its WAL and shared-memory files :data:`PRIVATE_MODE`.

    A new database is created empty with that mode whatever the umask (SQLite reads an empty
    file as an empty database, and creates the WAL and shared-memory files with the
    database file's mode). An existing file that others could open (created under the umask
    by an earlier build: 0644 under the usual 022) is tightened, with a warning: what it
    held was exposed until now."""
    try:
        created = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, PRIVATE_MODE)
    except FileExistsError:
        pass
    else:
        try:
            os.fchmod(created, PRIVATE_MODE)  # the umask took bits off at creation
        finally:
            os.close(created)
    for suffix in ("", "-wal", "-shm"):
        file = Path(f"{path}{suffix}")
        try:
            mode = stat.S_IMODE(file.stat().st_mode)
            if mode & 0o077:  # group or others
                file.chmod(PRIVATE_MODE)
                logger.warning(
                    "%s had mode %04o (others could open it); now %04o", file, mode, PRIVATE_MODE
                )
        except FileNotFoundError:
            continue
        except OSError as error:  # not its owner, a read-only file system
            logger.warning("cannot make %s private: %s", file, error)


def _corrupt_marker(path: Path) -> Path:
    return path.with_name(f"{path.name}.corrupt")
