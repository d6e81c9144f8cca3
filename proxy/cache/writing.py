"""What the writer's transactions are built from: plain synchronous functions over one
``sqlite3.Connection``, each run inside its caller's transaction.

The transactions themselves live one module per job — ``appending`` (watch events into the
log), ``relisting`` (first fills and relists), ``maintaining`` (retention, garbage collection,
checkpoints) and ``registering`` (the shape registry and discovery documents) — and each
public function there is one transaction that keeps the invariant of docs/design.md §3: a
shape's objects, its events and its RV change together or not at all, so after any crash the
cache is a consistent snapshot at an RV it had reached. They run on the single writer
connection's thread (see ``store.Store``); tests call them directly on an in-memory database.
``reading`` is the read side.

Sequence numbers are assigned inside the transaction, from the shape row. A shape's objects
are one *generation* of rows (``shapes.gen``, ``next_gen`` while a relist builds the next one:
see ``relisting``); a generation given up is recorded as garbage (:func:`discard`) and its rows
deleted in slices afterwards (``maintaining.collect_garbage``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.cache.records import ChangeType, EventRecord, rv_order

_INSERT_EVENT = """
INSERT INTO events (shape_id, seq, type, rv, rv_order, batch, namespace, name,
                    labels, prev_labels, prev_raw, raw, at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
"""
UPSERT_OBJECT = """
INSERT OR REPLACE INTO objects (gen, namespace, name, uid, rv, labels, raw)
VALUES (?, ?, ?, ?, ?, ?, ?)
"""

CHUNK = 2000
"""Rows moved per executemany call: large enough to amortise, small enough to bound memory."""


class ShapeGone(KeyError):
    """The shape's row is gone: it was dropped (unused, refused, revoked) after the caller
    took it, e.g. while a maintenance pass went through the shapes."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Committed:
    """What one transaction appended: the new RV and last seq, and the tail of its records
    (at most ``tail`` of them; watchers read older ones back from the log)."""

    rv: str
    last_seq: int
    count: int
    records: tuple[EventRecord, ...]
    log_bytes: int
    """The shape's ``log_bytes`` after the transaction."""


def last_seq_of(connection: sqlite3.Connection, shape_id: int) -> int:
    row = connection.execute("SELECT last_seq FROM shapes WHERE id = ?", (shape_id,)).fetchone()
    if row is None:
        raise ShapeGone(f"shape {shape_id} does not exist")
    return int(row[0])


def max_seq_of(connection: sqlite3.Connection, shape_id: int) -> int:
    """The newest log entry, published or not (a relist appends past ``last_seq``)."""
    (seq,) = connection.execute(
        "SELECT max(seq) FROM events WHERE shape_id = ?", (shape_id,)
    ).fetchone()
    return int(seq or 0)


def event_bytes(record: EventRecord) -> int:
    """``schema.EVENT_BYTES`` of a record: what it counts against retention by bytes."""
    return (
        len(record.raw or b"")
        + len(record.prev_raw or b"")
        + len(record.labels or b"")
        + len(record.prev_labels or b"")
    )


def add_log_bytes(connection: sqlite3.Connection, shape_id: int, added: int) -> int:
    """``shapes.log_bytes`` plus ``added`` (negative: entries deleted); the new value."""
    row = connection.execute(
        "UPDATE shapes SET log_bytes = log_bytes + ? WHERE id = ? RETURNING log_bytes",
        (added, shape_id),
    ).fetchone()
    if row is None:
        raise ShapeGone(f"shape {shape_id} does not exist")
    return int(row[0])


def append(
    connection: sqlite3.Connection, shape_id: int, records: Sequence[EventRecord], *, now: float
) -> int:
    """Insert log entries committed at ``now`` (inside the caller's transaction) and count
    their bytes into ``shapes.log_bytes``; the new value."""
    connection.executemany(_INSERT_EVENT, (_event_row(shape_id, r, now) for r in records))
    return add_log_bytes(connection, shape_id, sum(event_bytes(r) for r in records))


def _event_row(shape_id: int, record: EventRecord, now: float) -> tuple[object, ...]:
    return (
        shape_id,
        record.seq,
        record.type.value,
        record.rv,
        rv_order(record.rv),
        int(record.batch),
        record.namespace,
        record.name,
        record.labels,
        record.prev_labels,
        record.prev_raw,
        record.raw,
        now,
    )


def bookmark_record(seq: int, rv: str, *, at: float, batch: bool = False) -> EventRecord:
    return EventRecord(
        seq=seq,
        type=ChangeType.BOOKMARK,
        rv=rv,
        batch=batch,
        namespace="",
        name="",
        labels=None,
        prev_labels=None,
        prev_raw=None,
        raw=None,
        at=at,
    )


@dataclass(frozen=True, slots=True)
class Gens:
    gen: int
    next_gen: int | None
    filled: bool


def generations(connection: sqlite3.Connection, shape_id: int) -> Gens:
    row = connection.execute(
        "SELECT gen, next_gen, rv FROM shapes WHERE id = ?", (shape_id,)
    ).fetchone()
    if row is None:
        raise ShapeGone(f"shape {shape_id} does not exist")
    return Gens(gen=int(row[0]), next_gen=row[1], filled=row[2] is not None)


def new_generation(connection: sqlite3.Connection) -> int:
    """A generation number no rows carry: above every live, building or garbage one (a
    collected generation has no rows left, so a number may come back only once unused)."""
    (top,) = connection.execute(
        "SELECT max(g) FROM (SELECT max(max(gen), coalesce(max(next_gen), 0)) AS g FROM shapes "
        "UNION ALL SELECT max(gen) FROM garbage)"
    ).fetchone()
    return int(top or 0) + 1


def discard(connection: sqlite3.Connection, gen: int, table: str) -> None:
    connection.execute("INSERT OR IGNORE INTO garbage (gen, tbl) VALUES (?, ?)", (gen, table))
