"""The SQLite schema, its version, and the pragmas every connection uses.

One database file holds every shape. Tables:

- ``shapes``: one row per upstream collection watch: identity, the RV reached, the RV the event
  log starts at (a client can resume from any RV >= it), what kind of objects it holds, and
  how many bytes its log holds (``log_bytes``: :data:`EVENT_BYTES` of each of its rows, kept
  in the transactions that append or delete them, so retention by bytes never sums a log).
- ``objects``: the state of each shape, keyed (generation, namespace, name); ``raw`` is the
  object exactly as it is served: JSON (``kind`` and ``apiVersion`` included) for a ``json``
  shape, the object's own protobuf message (no envelope) for a ``protobuf`` shape. A shape's
  objects are the rows of its generation ``shapes.gen``; a relist builds the next generation
  (``shapes.next_gen``) beside it in slices and publishes it by switching ``gen``
  (``relisting.Relist``).
- ``events``: the append-only log per shape, ordered by ``seq``. ``rv_order`` is the RV as an
  integer where it is well-formed (KEP-5504), for resume look-ups. BOOKMARK rows are positions
  only (never sent as events). ``prev_labels`` / ``prev_raw`` describe the previous state where
  label-selector filtering needs it (``prev_raw`` only when the labels changed).
- ``staging``: what a relist in progress listed, by the generation it builds: changed objects
  whole, unchanged ones as keys only.
- ``garbage``: generations whose ``objects`` or ``staging`` rows are deleted in slices in
  the background (a replaced generation, an abandoned list, a dropped shape).
- ``discovery``: discovery documents for an offline start.
- ``meta``: the schema version (an unknown version is refused, never guessed at), and the
  cluster's identity (``snapshotting.CLUSTER_KEY``).
"""

from __future__ import annotations

import sqlite3
from typing import Final

SCHEMA_VERSION: Final = 4
"""2: ``shapes.encoding`` (1 had JSON shapes only). 3: generations of objects
(``shapes.gen``, ``shapes.next_gen``, ``objects.gen``, ``staging.gen``, ``garbage``).
4: ``shapes.log_bytes``. Each migrated in place, without rewriting rows."""

EVENT_BYTES: Final = (
    "coalesce(length(raw), 0) + coalesce(length(prev_raw), 0) "
    "+ coalesce(length(labels), 0) + coalesce(length(prev_labels), 0)"
)
"""What a log entry counts against retention by bytes (``writing.event_bytes`` in Python):
its objects and labels, new and old. ``length`` of a BLOB reads the row's header, not the
overflow pages of a large object."""

PAGE_SIZE: Final = 16384
"""Rows are ~2-5 KB: 16 KiB pages keep several per page and overflow chains rare."""

BUSY_TIMEOUT_MS: Final = 10_000
"""Readers and the writer share the file; a checkpoint may hold a lock briefly."""

JOURNAL_SIZE_LIMIT: Final = 64 * 1024 * 1024
"""A WAL file that a long list kept from being checkpointed is truncated back to this."""

AUTOCHECKPOINT_PAGES: Final = 1000
"""SQLite's default: a commit that takes the WAL past this many pages checkpoints inside the
commit. The writer keeps it for transactions on its own thread (fills, relist steps, bursts),
where nobody waits for one commit, and a checkpointer beside continuous writes could never
let the WAL restart (it restarts only between a complete checkpoint and the next write;
measured, a 500,000-object fill left a 1 GB WAL). Small watch commits on the event loop run
with 0 (``store.INLINE_COMMIT``): there the checkpoint made one commit in ~100 take 17 ms
instead of under 1, and every watcher waited for it; ``Store.keep_checkpointed`` checkpoints
beside them."""

DDL: Final = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS shapes (
    id            INTEGER PRIMARY KEY,
    key           TEXT NOT NULL UNIQUE,
    grp           TEXT NOT NULL,
    version       TEXT NOT NULL,
    resource      TEXT NOT NULL,
    namespace     TEXT NOT NULL,            -- '' = all namespaces / cluster-scoped
    label_selector TEXT NOT NULL,
    field_selector TEXT NOT NULL,
    encoding      TEXT NOT NULL DEFAULT 'json', -- how objects are stored and served
    configured    INTEGER NOT NULL,         -- 1 = from --resource, never dropped for disuse
    kind          TEXT NOT NULL DEFAULT '',
    api_version   TEXT NOT NULL DEFAULT '',
    rv            TEXT,                     -- NULL until the first list completed
    log_start_rv  TEXT,                     -- the log holds every change after this RV
    last_seq      INTEGER NOT NULL DEFAULT 0,
    created_at    REAL NOT NULL,
    used_at       REAL NOT NULL,
    listed_at     REAL,
    gen           INTEGER,                  -- the generation of objects readers see
    next_gen      INTEGER,                  -- the generation a relist in progress builds
    log_bytes     INTEGER NOT NULL DEFAULT 0 -- EVENT_BYTES of all its events rows
);

CREATE TABLE IF NOT EXISTS objects (
    gen       INTEGER NOT NULL,             -- shapes.gen of the shape it belongs to
    namespace TEXT NOT NULL,
    name      TEXT NOT NULL,
    uid       TEXT NOT NULL,
    rv        TEXT NOT NULL,
    labels    BLOB NOT NULL,                -- JSON object
    raw       BLOB NOT NULL,
    PRIMARY KEY (gen, namespace, name)
) WITHOUT ROWID;
-- Counting objects per shape (a metric, every minute) reads this small index, not the rows
-- with their bodies.
CREATE INDEX IF NOT EXISTS objects_by_shape ON objects (gen);

CREATE TABLE IF NOT EXISTS events (
    shape_id    INTEGER NOT NULL,
    seq         INTEGER NOT NULL,
    type        TEXT NOT NULL,              -- ADDED MODIFIED DELETED BOOKMARK
    rv          TEXT NOT NULL,
    rv_order    INTEGER,                    -- int(rv) when well-formed, else NULL
    batch       INTEGER NOT NULL,           -- 1 = part of a relist diff (shares RVs)
    namespace   TEXT NOT NULL,
    name        TEXT NOT NULL,
    labels      BLOB,
    prev_labels BLOB,
    prev_raw    BLOB,
    raw         BLOB,
    at          REAL NOT NULL,
    PRIMARY KEY (shape_id, seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS events_by_rv ON events (shape_id, rv_order);
-- Log retention by age reads only the aged entries, not the whole log.
CREATE INDEX IF NOT EXISTS events_by_time ON events (shape_id, at);

CREATE TABLE IF NOT EXISTS staging (
    gen       INTEGER NOT NULL,             -- the generation the relist builds
    namespace TEXT NOT NULL,
    name      TEXT NOT NULL,
    uid       TEXT NOT NULL,
    rv        TEXT NOT NULL,
    rv_order  INTEGER,                      -- int(rv), -1 when ill-formed (never NULL: paged on)
    labels    BLOB NOT NULL,                -- empty with raw: unchanged, the key only
    raw       BLOB NOT NULL,
    PRIMARY KEY (gen, namespace, name)
) WITHOUT ROWID;
-- A relist's changes are appended in object-RV order: paged in that order on this index,
-- not sorted in memory with their bodies.
CREATE INDEX IF NOT EXISTS staging_by_rv ON staging (gen, rv_order, rv);

CREATE TABLE IF NOT EXISTS garbage (
    gen       INTEGER NOT NULL,
    tbl       TEXT NOT NULL,                -- objects | staging
    PRIMARY KEY (gen, tbl)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS discovery (
    key       TEXT PRIMARY KEY,
    status    INTEGER NOT NULL,
    headers   BLOB NOT NULL,
    body      BLOB NOT NULL,
    etag      TEXT NOT NULL,
    stored_at REAL NOT NULL
) WITHOUT ROWID;
"""


class SchemaError(Exception):
    """The file is not a warmwatch database of a version this build understands."""


WRITER_CACHE_KIB = 8192
"""SQLite page cache of the writer: its working set is the B-tree interior plus recent pages."""

READER_CACHE_KIB = 2048
"""Readers mostly scan once (a LIST streams every row); the OS page cache serves repeats, so a
small cache per reader keeps memory flat however many objects are cached."""


def configure(connection: sqlite3.Connection, *, synchronous: str, cache_kib: int) -> None:
    """Pragmas for every connection (the page size only takes effect on a new file)."""
    connection.execute(f"PRAGMA page_size = {PAGE_SIZE}")
    connection.execute("PRAGMA journal_mode = WAL")
    connection.execute(f"PRAGMA synchronous = {synchronous}")
    connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    connection.execute(f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}")
    connection.execute(f"PRAGMA wal_autocheckpoint = {AUTOCHECKPOINT_PAGES}")
    connection.execute("PRAGMA temp_store = MEMORY")
    connection.execute(f"PRAGMA cache_size = -{cache_kib}")


def migrate(connection: sqlite3.Connection) -> None:
    """Create the schema in a new file, or check the version of an existing one."""
    tables = {
        row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")
    }
    if tables and "meta" not in tables:
        raise SchemaError(f"not a warmwatch database (tables: {sorted(tables)})")
    if "meta" in tables:
        row = connection.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is not None and row[0] == "1":
            with connection:  # 1 -> 2: every existing shape is a JSON shape
                connection.execute(
                    "ALTER TABLE shapes ADD COLUMN encoding TEXT NOT NULL DEFAULT 'json'"
                )
                connection.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
            row = ("2",)
        if row is not None and row[0] == "2":
            _migrate_2_to_3(connection)
            row = ("3",)
        if row is not None and row[0] == "3":
            _migrate_3_to_4(connection)
            row = ("4",)
        if row is None or row[0] != str(SCHEMA_VERSION):
            found = row[0] if row else "none"
            raise SchemaError(f"schema version {found}; this build reads {SCHEMA_VERSION}")
    with connection:
        connection.executescript(DDL)
        connection.execute(
            "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)",
            (str(SCHEMA_VERSION),),
        )


def _migrate_2_to_3(connection: sqlite3.Connection) -> None:
    """Each shape's objects become its first generation (its id, as before); renaming a
    column and adding nullable ones rewrite no rows. What a version-2 relist left staged was
    unfinished (it is listed again) and is dropped."""
    with connection:
        connection.execute("ALTER TABLE shapes ADD COLUMN gen INTEGER")
        connection.execute("ALTER TABLE shapes ADD COLUMN next_gen INTEGER")
        connection.execute("UPDATE shapes SET gen = id")
        connection.execute("ALTER TABLE objects RENAME COLUMN shape_id TO gen")
        connection.execute("DELETE FROM staging")
        connection.execute("ALTER TABLE staging RENAME COLUMN shape_id TO gen")
        connection.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")


def _migrate_3_to_4(connection: sqlite3.Connection) -> None:
    """Each shape's ``log_bytes``, summed once. It reads the logs' row headers (a large
    object's overflow pages are not read), once, at the first start of this version."""
    with connection:
        connection.execute("ALTER TABLE shapes ADD COLUMN log_bytes INTEGER NOT NULL DEFAULT 0")
        connection.execute(
            f"UPDATE shapes SET log_bytes = (SELECT coalesce(sum({EVENT_BYTES}), 0) "
            "FROM events WHERE events.shape_id = shapes.id)"
        )
        connection.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")


def check_version(connection: sqlite3.Connection) -> None:
    """Refuse a file this build cannot read, without changing it (read-only tools: ``warmwatch
    inspect`` and ``verify``; :func:`migrate` is the writer's way, and migrates version 1)."""
    tables = {
        row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")
    }
    if "meta" not in tables:
        raise SchemaError(f"not a warmwatch database (tables: {sorted(tables)})")
    row = connection.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if row is None or row[0] != str(SCHEMA_VERSION):
        found = row[0] if row else "none"
        raise SchemaError(
            f"schema version {found}; this build reads {SCHEMA_VERSION} "
            "(a warmwatch of this build migrates older files when it starts)"
        )


def integrity_problem(connection: sqlite3.Connection) -> str | None:
    """``PRAGMA quick_check``: None when the file is sound, else what is wrong.

    It reads every page, so it is O(size): it runs in the background after start, never
    before a warm start serves (see ``store.Store.check_integrity``).
    """
    result = connection.execute("PRAGMA quick_check").fetchone()[0]
    return None if result == "ok" else str(result)
