"""The reader's queries: plain synchronous functions over one ``sqlite3.Connection``.

The read side of ``writing``: each function is one consistent read (a read transaction where
it takes more than one statement), runs on a reader connection's thread (see
``store.Store``), and is unit-tested on an in-memory database. The rules of resuming a watch
live here (:func:`position`): where in a shape's log a watch from a resourceVersion starts.
"""

from __future__ import annotations

import sqlite3

from proxy.cache.records import ChangeType, EventRecord, rv_order
from proxy.kube import versions
from proxy.kube.status import StatusError


class TooNew(Exception):
    """The cache has not reached the requested RV (yet)."""

    def __init__(self, *, rv: str, current: str) -> None:
        super().__init__(f"resource version {rv} ahead of the cache at {current}")
        self.rv = rv
        self.current = current


class LogTrimmed(Exception):
    """A watcher's position fell out of the retained log while it lagged."""

    def __init__(self, after: int) -> None:
        super().__init__(f"log entries after seq {after} were trimmed")
        self.after = after


def position(connection: sqlite3.Connection, *, shape_id: int, rv: str) -> int:
    """The log position (a seq) a watch from ``rv`` starts after.

    - Well-formed RVs (KEP-5504) compare as integers: older than the log's start → 410
      Expired; ahead of the shape → :class:`TooNew` (the watch waits, as the apiserver's
      watch cache does); else after the last entry at or below ``rv``.
    - A client resuming from a relist RV is sent that revision's synthesized events again
      (docs/design.md §4): a gap would lose deletes, a replay is harmless to informers.
    - Other RVs must be positions in the log (an event's or a bookmark's RV, or the shape's).
    """
    connection.execute("BEGIN")
    try:
        current_rv, last_seq, start_rv = connection.execute(
            "SELECT rv, last_seq, log_start_rv FROM shapes WHERE id = ?", (shape_id,)
        ).fetchone()
        order = rv_order(rv)
        if order is not None and rv_order(start_rv) is not None:
            if versions.compare(rv, start_rv) == -1:
                raise StatusError.too_old_resource_version(requested=rv, oldest_resumable=start_rv)
            if versions.compare(rv, current_rv) == 1:
                raise TooNew(rv=rv, current=current_rv)
            (first,) = connection.execute(
                "SELECT min(seq) FROM events WHERE shape_id = ? AND (rv_order > ? OR "
                "(rv_order = ? AND batch = 1 AND EXISTS (SELECT 1 FROM events WHERE "
                "shape_id = ? AND rv_order = ? AND batch = 1 AND type = 'BOOKMARK')))",
                (shape_id, order, order, shape_id, order),
            ).fetchone()
            return int(first) - 1 if first is not None else int(last_seq)
        low, high, batch = connection.execute(
            "SELECT min(seq), max(seq), max(batch) FROM events WHERE shape_id = ? AND rv = ?",
            (shape_id, rv),
        ).fetchone()
        if low is None:
            if rv == current_rv:
                return int(last_seq)
            raise StatusError.too_old_resource_version(requested=rv, oldest_resumable=start_rv)
        return int(low) - 1 if batch else int(high)
    finally:
        connection.execute("COMMIT")


def events_after(
    connection: sqlite3.Connection,
    *,
    shape_id: int,
    after: int,
    limit: int,
    last_seq: int,
    max_bytes: int | None = None,
) -> list[EventRecord]:
    """Committed log entries after seq ``after``, at most ``limit``, and no more once their
    objects (old and new) reach ``max_bytes`` (but at least one). ``last_seq`` is the
    newest seq published: entries up to it that are no longer in the log were trimmed while
    the watcher lagged (:class:`LogTrimmed`; "no rows" then must not read as "nothing new",
    or the watcher would spin)."""
    cursor = connection.execute(
        "SELECT seq, type, rv, batch, namespace, name, labels, prev_labels, prev_raw, raw, at "
        "FROM events WHERE shape_id = ? AND seq > ? ORDER BY seq LIMIT ?",
        (shape_id, after, limit),
    )
    rows = []
    size = 0
    for row in cursor:
        rows.append(row)
        size += len(row[8] or b"") + len(row[9] or b"")
        if max_bytes is not None and size >= max_bytes:
            break
    cursor.close()
    if (rows and rows[0][0] != after + 1) or (not rows and after < last_seq):
        raise LogTrimmed(after)
    return [
        EventRecord(
            seq=r[0],
            type=ChangeType(r[1]),
            rv=r[2],
            batch=bool(r[3]),
            namespace=r[4],
            name=r[5],
            labels=r[6],
            prev_labels=r[7],
            prev_raw=r[8],
            raw=r[9],
            at=r[10],
        )
        for r in rows
    ]
