"""The writer's transactions: plain synchronous functions over one ``sqlite3.Connection``.

Each public function is one transaction and keeps the invariant of docs/design.md §3: a shape's
objects, its events and its RV change together or not at all, so after any crash the cache is a
consistent snapshot at an RV it had reached. They run on the single writer connection's thread
(see ``store.Store``); tests call them directly on an in-memory database.

Sequence numbers are assigned here, from the shape row, inside the transaction.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from proxy.cache.records import Change, ChangeType, EventRecord, rv_order, with_resource_version

_INSERT_EVENT = """
INSERT INTO events (shape_id, seq, type, rv, rv_order, batch, namespace, name,
                    labels, prev_labels, prev_raw, raw, at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
"""
_UPSERT_OBJECT = """
INSERT OR REPLACE INTO objects (shape_id, namespace, name, uid, rv, labels, raw)
VALUES (?, ?, ?, ?, ?, ?, ?)
"""
_DELETE_OBJECT = "DELETE FROM objects WHERE shape_id = ? AND namespace = ? AND name = ?"

CHUNK = 2000
"""Rows moved per executemany call: large enough to amortise, small enough to bound memory."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Committed:
    """What one transaction appended: the new RV and last seq, and the tail of its records
    (at most ``tail`` of them; watchers read older ones back from the log)."""

    rv: str
    last_seq: int
    count: int
    records: tuple[EventRecord, ...]


def _last_seq(connection: sqlite3.Connection, shape_id: int) -> int:
    row = connection.execute("SELECT last_seq FROM shapes WHERE id = ?", (shape_id,)).fetchone()
    if row is None:
        raise KeyError(f"shape {shape_id} does not exist")
    return int(row[0])


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


def apply_changes(
    connection: sqlite3.Connection,
    *,
    shape_id: int,
    changes: Sequence[Change],
    tail: int = CHUNK,
) -> Committed:
    """Apply upstream watch events (and bookmarks) to a shape in one transaction."""
    now = time.time()
    with connection:
        seq = _last_seq(connection, shape_id)
        previous: dict[tuple[str, str], tuple[bytes, bytes] | None] = {}
        records: list[EventRecord] = []
        upserts: list[tuple[object, ...]] = []
        for change in changes:
            seq += 1
            if change.type is ChangeType.BOOKMARK:
                records.append(_bookmark(seq, change.rv, at=now))
                continue
            key = (change.namespace, change.name)
            if key not in previous:
                row = connection.execute(
                    "SELECT labels, raw FROM objects WHERE shape_id = ? AND namespace = ? "
                    "AND name = ?",
                    (shape_id, *key),
                ).fetchone()
                previous[key] = (bytes(row[0]), bytes(row[1])) if row else None
            before = previous[key]
            prev_labels = before[0] if before else None
            labels_changed = before is not None and prev_labels != change.labels
            records.append(
                EventRecord(
                    seq=seq,
                    type=change.type,
                    rv=change.rv,
                    batch=False,
                    namespace=change.namespace,
                    name=change.name,
                    labels=change.labels,
                    prev_labels=prev_labels,
                    prev_raw=before[1] if labels_changed and before else None,
                    raw=change.raw,
                    at=now,
                )
            )
            if change.type is ChangeType.DELETED:
                previous[key] = None
                connection.executemany(_UPSERT_OBJECT, upserts)  # keep the order of changes
                upserts.clear()
                connection.execute(_DELETE_OBJECT, (shape_id, *key))
            else:
                previous[key] = (change.labels, change.raw)
                upserts.append(
                    (
                        shape_id,
                        change.namespace,
                        change.name,
                        change.uid,
                        change.rv,
                        change.labels,
                        change.raw,
                    )
                )
                if len(upserts) >= CHUNK:
                    connection.executemany(_UPSERT_OBJECT, upserts)
                    upserts.clear()
        connection.executemany(_UPSERT_OBJECT, upserts)
        connection.executemany(_INSERT_EVENT, (_event_row(shape_id, r, now) for r in records))
        rv = changes[-1].rv if changes else ""
        if changes:
            connection.execute(
                "UPDATE shapes SET rv = ?, last_seq = ? WHERE id = ?", (rv, seq, shape_id)
            )
    return Committed(rv=rv, last_seq=seq, count=len(records), records=tuple(records[-tail:]))


def _bookmark(seq: int, rv: str, *, at: float, batch: bool = False) -> EventRecord:
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


def _filled(connection: sqlite3.Connection, shape_id: int) -> bool:
    row = connection.execute("SELECT rv FROM shapes WHERE id = ?", (shape_id,)).fetchone()
    return row is not None and row[0] is not None


def stage(connection: sqlite3.Connection, *, shape_id: int, objects: Iterable[Change]) -> None:
    """Commit one batch of a list in progress; invisible to readers until ``finish_list``.

    A first fill writes straight into ``objects``: readers never look at a shape without an RV,
    so the rows are invisible until ``finish_list`` sets it, and the fill costs one copy of the
    data instead of two. A relist stages beside the state it will be diffed against, and an
    object the cache already holds at the same resourceVersion and uid is staged as its key
    only (empty labels and body): after a long outage most of a collection is unchanged, and
    ``finish_list`` needs of it only that it is still there. (Sound because nothing else writes
    the shape's objects while it relists: its watch is down until the relist is finished.)
    """
    with connection:
        if _filled(connection, shape_id):
            batch = list(objects)
            held = _held_versions(connection, shape_id, [(o.namespace, o.name) for o in batch])
            connection.executemany(
                "INSERT OR REPLACE INTO staging (shape_id, namespace, name, uid, rv, rv_order, "
                "labels, raw) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    (shape_id, o.namespace, o.name, o.uid, o.rv, o.rv_order, o.labels, o.raw)
                    if held.get((o.namespace, o.name)) != (o.rv, o.uid)
                    else (shape_id, o.namespace, o.name, o.uid, o.rv, o.rv_order, b"", b"")
                    for o in batch
                ),
            )
        else:
            connection.executemany(
                _UPSERT_OBJECT,
                ((shape_id, o.namespace, o.name, o.uid, o.rv, o.labels, o.raw) for o in objects),
            )


def _held_versions(
    connection: sqlite3.Connection, shape_id: int, keys: list[tuple[str, str]]
) -> dict[tuple[str, str], tuple[str, str]]:
    """(resourceVersion, uid) of those of ``keys`` the shape's objects hold."""
    held: dict[tuple[str, str], tuple[str, str]] = {}
    for start in range(0, len(keys), 400):  # SQLite's bound-parameter limit
        chunk = keys[start : start + 400]
        values = ",".join("(?, ?)" for _ in chunk)
        for namespace, name, rv, uid in connection.execute(
            f"SELECT namespace, name, rv, uid FROM objects WHERE shape_id = ? AND "
            f"(namespace, name) IN (VALUES {values})",
            (shape_id, *(part for key in chunk for part in key)),
        ):
            held[(namespace, name)] = (rv, uid)
    return held


def discard_staging(connection: sqlite3.Connection, *, shape_id: int) -> None:
    """Forget a list in progress (before starting one): staged rows, or an unfinished fill."""
    with connection:
        connection.execute("DELETE FROM staging WHERE shape_id = ?", (shape_id,))
        if not _filled(connection, shape_id):
            connection.execute("DELETE FROM objects WHERE shape_id = ?", (shape_id,))


def finish_list(
    connection: sqlite3.Connection,
    *,
    shape_id: int,
    rv: str,
    kind: str,
    api_version: str,
    tail: int = CHUNK,
) -> Committed:
    """Make a completed list visible in one transaction.

    First list of a shape: the staged objects become its state and its log starts at ``rv``.
    Relist (after 410): the difference from the cached state is appended to the log as ordinary
    events — ADDED/MODIFIED in object-RV order, then DELETED for what vanished, stamped with the
    relist RV — so watching clients lose nothing, deletes included (docs/design.md §4).
    """
    now = time.time()
    with connection:
        shape = connection.execute(
            "SELECT rv, last_seq FROM shapes WHERE id = ?", (shape_id,)
        ).fetchone()
        first_list = shape[0] is None
        seq = int(shape[1])
        records: list[EventRecord] = []  # appended, not inserted yet
        published: list[EventRecord] = []  # the newest inserted ones, at most ``tail``
        count = 0

        def flush() -> None:
            nonlocal records, published, count
            connection.executemany(_INSERT_EVENT, (_event_row(shape_id, r, now) for r in records))
            count += len(records)
            published = (published + records)[-tail:]
            records = []

        if not first_list:  # a first fill is already in place (see ``stage``)
            changed = connection.execute(
                "SELECT s.namespace, s.name, s.uid, s.rv, s.labels, s.raw, o.labels, o.raw "
                "FROM staging s LEFT JOIN objects o ON o.shape_id = s.shape_id "
                "AND o.namespace = s.namespace AND o.name = s.name "
                "WHERE s.shape_id = ? AND (o.rv IS NULL OR o.rv != s.rv OR o.uid != s.uid) "
                "ORDER BY s.rv_order, s.rv",
                (shape_id,),
            )
            upserts = []
            for namespace, name, uid, obj_rv, labels, raw, old_labels, old_raw in changed:
                seq += 1
                labels_changed = old_labels is not None and bytes(old_labels) != bytes(labels)
                records.append(
                    EventRecord(
                        seq=seq,
                        type=ChangeType.ADDED if old_labels is None else ChangeType.MODIFIED,
                        rv=obj_rv,
                        batch=True,
                        namespace=namespace,
                        name=name,
                        labels=bytes(labels),
                        prev_labels=bytes(old_labels) if old_labels is not None else None,
                        prev_raw=bytes(old_raw) if labels_changed else None,
                        raw=bytes(raw),
                        at=now,
                    )
                )
                upserts.append((shape_id, namespace, name, uid, obj_rv, labels, raw))
                if len(upserts) >= CHUNK:
                    flush()
                    connection.executemany(_UPSERT_OBJECT, upserts)
                    upserts.clear()
            connection.executemany(_UPSERT_OBJECT, upserts)
            # What vanished, read in chunks (never all at once: half a million objects may
            # have gone while warmwatch was down), then deleted by one statement.
            vanished = connection.execute(
                "SELECT o.namespace, o.name, o.labels, o.raw FROM objects o "
                "WHERE o.shape_id = ? AND NOT EXISTS (SELECT 1 FROM staging s WHERE "
                "s.shape_id = o.shape_id AND s.namespace = o.namespace AND s.name = o.name) "
                "ORDER BY o.namespace, o.name",
                (shape_id,),
            )
            while chunk := vanished.fetchmany(CHUNK):
                for namespace, name, labels, raw in chunk:
                    seq += 1
                    records.append(
                        EventRecord(
                            seq=seq,
                            type=ChangeType.DELETED,
                            rv=rv,
                            batch=True,
                            namespace=namespace,
                            name=name,
                            labels=bytes(labels),
                            prev_labels=bytes(labels),
                            prev_raw=None,
                            raw=with_resource_version(bytes(raw), rv),
                            at=now,
                        )
                    )
                flush()
            connection.execute(
                "DELETE FROM objects WHERE shape_id = ? AND NOT EXISTS (SELECT 1 FROM staging s "
                "WHERE s.shape_id = objects.shape_id AND s.namespace = objects.namespace "
                "AND s.name = objects.name)",
                (shape_id,),
            )
        # The list RV is a position in the log: a client holding it resumes right after it.
        seq += 1
        records.append(_bookmark(seq, rv, at=now, batch=not first_list))
        flush()
        connection.execute("DELETE FROM staging WHERE shape_id = ?", (shape_id,))
        connection.execute(
            "UPDATE shapes SET rv = ?, last_seq = ?, kind = ?, api_version = ?, listed_at = ?, "
            "log_start_rv = COALESCE(log_start_rv, ?) WHERE id = ?",
            (rv, seq, kind, api_version, now, rv, shape_id),
        )
    return Committed(rv=rv, last_seq=seq, count=count, records=tuple(published))


def trim(connection: sqlite3.Connection, *, shape_id: int, max_events: int, max_age: float) -> int:
    """Drop log entries beyond the retention limits; returns how many were dropped.

    The log then starts at the RV of the newest dropped entry. A cut never splits a relist
    batch (its records share one RV, and a client at that RV is sent all of them again).
    """
    with connection:
        last_seq = _last_seq(connection, shape_id)
        cutoff = last_seq - max_events
        # The newest aged entry, found by the time index in one step (commit times grow with
        # seq; a wall clock stepping back makes age retention approximate, never unsafe).
        aged = connection.execute(
            "SELECT seq FROM events WHERE shape_id = ? AND at < ? ORDER BY at DESC LIMIT 1",
            (shape_id, time.time() - max_age),
        ).fetchone()
        if aged is not None:
            cutoff = max(cutoff, int(aged[0]))
        if cutoff <= 0:
            return 0
        row = connection.execute(
            "SELECT rv, batch FROM events WHERE shape_id = ? AND seq <= ? "
            "ORDER BY seq DESC LIMIT 1",
            (shape_id, cutoff),
        ).fetchone()
        if row is None:
            return 0
        start_rv, batch = row
        if batch:
            cutoff = connection.execute(
                "SELECT max(seq) FROM events WHERE shape_id = ? AND rv = ? AND batch = 1",
                (shape_id, start_rv),
            ).fetchone()[0]
        dropped = connection.execute(
            "DELETE FROM events WHERE shape_id = ? AND seq <= ?", (shape_id, cutoff)
        ).rowcount
        connection.execute("UPDATE shapes SET log_start_rv = ? WHERE id = ?", (start_rv, shape_id))
    return int(dropped)
