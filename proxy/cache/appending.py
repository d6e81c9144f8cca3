"""The event log's appends: upstream watch events (and bookmarks) applied to a shape, one
transaction each (see ``writing`` for the invariant they keep)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence

from proxy.cache.records import Change, ChangeType, EventRecord
from proxy.cache.writing import (
    CHUNK,
    UPSERT_OBJECT,
    Committed,
    append,
    bookmark_record,
    generations,
    last_seq_of,
)

_DELETE_OBJECT = "DELETE FROM objects WHERE gen = ? AND namespace = ? AND name = ?"


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
        seq = last_seq_of(connection, shape_id)
        gen = generations(connection, shape_id).gen
        previous: dict[tuple[str, str], tuple[bytes, bytes] | None] = {}
        records: list[EventRecord] = []
        upserts: list[tuple[object, ...]] = []
        for change in changes:
            seq += 1
            if change.type is ChangeType.BOOKMARK:
                records.append(bookmark_record(seq, change.rv, at=now))
                continue
            key = (change.namespace, change.name)
            if key not in previous:
                row = connection.execute(
                    "SELECT labels, raw FROM objects WHERE gen = ? AND namespace = ? AND name = ?",
                    (gen, *key),
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
                connection.executemany(UPSERT_OBJECT, upserts)  # keep the order of changes
                upserts.clear()
                connection.execute(_DELETE_OBJECT, (gen, *key))
            else:
                previous[key] = (change.labels, change.raw)
                upserts.append(
                    (
                        gen,
                        change.namespace,
                        change.name,
                        change.uid,
                        change.rv,
                        change.labels,
                        change.raw,
                    )
                )
                if len(upserts) >= CHUNK:
                    connection.executemany(UPSERT_OBJECT, upserts)
                    upserts.clear()
        connection.executemany(UPSERT_OBJECT, upserts)
        log_bytes = append(connection, shape_id, records, now=now)
        rv = changes[-1].rv if changes else ""
        if changes:
            connection.execute(
                "UPDATE shapes SET rv = ?, last_seq = ? WHERE id = ?", (rv, seq, shape_id)
            )
    return Committed(
        rv=rv,
        last_seq=seq,
        count=len(records),
        records=tuple(records[-tail:]),
        log_bytes=log_bytes,
    )
