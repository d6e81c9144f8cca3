"""What a database holds, read without changing it: ``warmwatch inspect``, and the shapes
``warmwatch verify`` compares (docs/design.md §8).

Plain synchronous functions over a read-only ``sqlite3.Connection``, tested on an in-memory
database like ``writing`` and ``reading``. :func:`open_read_only` opens the file with SQLite's
``mode=ro`` URI: safe beside a running warmwatch (WAL mode lets a reader take its own snapshot
while the writer commits; nothing is written, not even a checkpoint), and on a stopped one.
"""

from __future__ import annotations

import os
import sqlite3
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from proxy.cache import schema
from proxy.cache.shapes import Encoding, ShapeKey


class InspectError(Exception):
    """The database cannot be read (missing, not a warmwatch file, another schema version)."""


def open_read_only(path: Path) -> sqlite3.Connection:
    """The database at ``path``, opened read-only, its schema version checked.

    Autocommit mode (``isolation_level=None``): a caller that needs one snapshot across
    several statements says ``BEGIN`` and ``COMMIT`` itself.
    """
    if not path.is_file():
        raise InspectError(f"{path}: no such database file")
    uri = f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro"
    try:
        connection = sqlite3.connect(uri, uri=True, isolation_level=None)
        connection.execute(f"PRAGMA busy_timeout = {schema.BUSY_TIMEOUT_MS}")
        connection.execute(f"PRAGMA cache_size = -{schema.READER_CACHE_KIB}")
        schema.check_version(connection)
    except (sqlite3.Error, schema.SchemaError) as error:
        raise InspectError(f"{path}: {error}") from error
    return connection


@dataclass(frozen=True, kw_only=True, slots=True)
class StoredShape:
    """A shape's row: its identity and the RV it reached (None: never filled)."""

    id: int
    key: ShapeKey
    configured: bool
    kind: str
    rv: str | None
    log_start_rv: str | None
    listed_at: float | None


def stored_shapes(connection: sqlite3.Connection) -> list[StoredShape]:
    """Every shape in the file, ordered by identity."""
    rows = connection.execute(
        "SELECT id, grp, version, resource, namespace, label_selector, field_selector, "
        "encoding, configured, kind, rv, log_start_rv, listed_at FROM shapes"
    ).fetchall()
    shapes = [
        StoredShape(
            id=int(row[0]),
            key=ShapeKey(
                group=row[1],
                version=row[2],
                resource=row[3],
                namespace=row[4],
                label_selector=row[5],
                field_selector=row[6],
                encoding=Encoding(row[7]),
            ),
            configured=bool(row[8]),
            kind=str(row[9]),
            rv=row[10],
            log_start_rv=row[11],
            listed_at=row[12],
        )
        for row in rows
    ]
    return sorted(shapes, key=lambda shape: shape.key.identity)


@dataclass(frozen=True, kw_only=True, slots=True)
class LogEntry:
    rv: str
    at: float
    """When it was committed (wall clock, seconds since the epoch)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ShapeContents:
    """One shape as ``inspect`` reports it."""

    shape: StoredShape
    objects: int
    object_bytes: int
    """The stored objects' bodies (JSON or protobuf, as served), without SQLite's overhead."""
    events: int
    """Entries in the event log, bookmarks included."""
    oldest: LogEntry | None
    newest: LogEntry | None

    @property
    def last_commit(self) -> float | None:
        """The newest committed change: the newest log entry, or the list that filled it."""
        times = [t for t in (self.newest.at if self.newest else None, self.shape.listed_at) if t]
        return max(times) if times else None


def shape_contents(connection: sqlite3.Connection, shape: StoredShape) -> ShapeContents:
    """Counts and log span of one shape. O(objects) for the byte count (``length(raw)`` reads
    each row's header, not its body); the log ends are two index look-ups."""
    objects, object_bytes = connection.execute(
        "SELECT count(*), coalesce(sum(length(raw)), 0) FROM objects "
        "WHERE gen = (SELECT gen FROM shapes WHERE id = ?)",
        (shape.id,),
    ).fetchone()
    (events,) = connection.execute(
        "SELECT count(*) FROM events WHERE shape_id = ?", (shape.id,)
    ).fetchone()

    def end(order: str) -> LogEntry | None:
        row = connection.execute(
            f"SELECT rv, at FROM events WHERE shape_id = ? ORDER BY seq {order} LIMIT 1",
            (shape.id,),
        ).fetchone()
        return LogEntry(rv=row[0], at=float(row[1])) if row else None

    return ShapeContents(
        shape=shape,
        objects=int(objects),
        object_bytes=int(object_bytes),
        events=int(events),
        oldest=end("ASC"),
        newest=end("DESC"),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class DatabaseFiles:
    schema_version: int
    page_size: int
    pages: int
    free_pages: int
    db_bytes: int
    wal_bytes: int
    """0 when there is no ``-wal`` file (a stopped warmwatch checkpoints and removes it)."""


def database_files(connection: sqlite3.Connection, path: Path) -> DatabaseFiles:
    def size(suffix: str) -> int:
        try:
            return os.path.getsize(f"{path}{suffix}")
        except OSError:
            return 0

    (version,) = connection.execute(
        "SELECT value FROM meta WHERE key = 'schema_version'"
    ).fetchone()
    return DatabaseFiles(
        schema_version=int(version),
        page_size=int(connection.execute("PRAGMA page_size").fetchone()[0]),
        pages=int(connection.execute("PRAGMA page_count").fetchone()[0]),
        free_pages=int(connection.execute("PRAGMA freelist_count").fetchone()[0]),
        db_bytes=size(""),
        wal_bytes=size("-wal"),
    )
