"""Maintenance of the cache file: retention of each shape's event log (:func:`trim`),
garbage collection of given-up generations and WAL checkpoints, one bounded transaction each
(see ``writing`` for the invariant they keep)."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass

from proxy.cache import schema
from proxy.cache.writing import CHUNK, ShapeGone, add_log_bytes


@dataclass(frozen=True, kw_only=True, slots=True)
class Trimmed:
    """What one :func:`trim` transaction left of a shape's log."""

    dropped: int
    reason: str | None
    """The bound that cut deepest: ``count``, ``age`` or ``bytes`` (None: nothing dropped)."""
    log_start_rv: str | None
    log_bytes: int
    more: bool = False
    """The cut stopped at its ``limit`` of rows: call again for the rest."""


def trim(
    connection: sqlite3.Connection,
    *,
    shape_id: int,
    max_events: int,
    max_age: float,
    max_bytes: int,
    limit: int = CHUNK,
) -> Trimmed:
    """Drop the oldest log entries until at most ``max_events`` are left, none older than
    ``max_age`` seconds, and they hold at most ``max_bytes`` (``shapes.log_bytes``) — at
    most ``limit`` rows in this transaction (:attr:`Trimmed.more`: call again), so the
    writer is held no longer than for a relist step, however much is due.

    The log then starts at the RV of the newest dropped entry: a client resuming from an
    older RV gets 410 and relists (from the cache). A cut never splits a relist batch (its
    records share one RV, and a client at that RV is sent all of them again): a slice ends
    before one, and a batch that starts the log goes whole. It never reaches past
    ``last_seq`` (a relist in progress appends there, unpublished).
    """
    with connection:
        row = connection.execute(
            "SELECT last_seq, log_bytes, log_start_rv, (SELECT min(seq) FROM events "
            "WHERE shape_id = shapes.id) FROM shapes WHERE id = ?",
            (shape_id,),
        ).fetchone()
        if row is None:
            raise ShapeGone(f"shape {shape_id} does not exist")
        last_seq, log_bytes, log_start_rv, first = int(row[0]), int(row[1]), row[2], row[3]
        kept = Trimmed(dropped=0, reason=None, log_start_rv=log_start_rv, log_bytes=log_bytes)
        if first is None:
            return kept
        cutoffs = {
            "count": last_seq - max_events,
            "age": _aged(connection, shape_id, max_age=max_age),
            "bytes": _over_bytes(
                connection,
                shape_id,
                seqs=(first, min(last_seq, first + limit - 1)),
                excess=log_bytes - max_bytes,
            ),
        }
        reason, cutoff = max(cutoffs.items(), key=lambda item: item[1])
        if min(cutoff, last_seq) < first:
            return kept
        more = min(cutoff, last_seq) >= first + limit
        cutoff, start_rv = _cut(
            connection,
            shape_id,
            first=first,
            cutoff=min(cutoff, last_seq, first + limit - 1),
            sliced=more,
        )
        sizes = connection.execute(
            f"DELETE FROM events WHERE shape_id = ? AND seq <= ? RETURNING {schema.EVENT_BYTES}",
            (shape_id, cutoff),
        ).fetchall()
        connection.execute("UPDATE shapes SET log_start_rv = ? WHERE id = ?", (start_rv, shape_id))
        log_bytes = add_log_bytes(connection, shape_id, -sum(size for (size,) in sizes))
    return Trimmed(
        dropped=len(sizes), reason=reason, log_start_rv=start_rv, log_bytes=log_bytes, more=more
    )


def _cut(
    connection: sqlite3.Connection, shape_id: int, *, first: int, cutoff: int, sliced: bool
) -> tuple[int, str]:
    """Where a cut at ``cutoff`` (``first`` <= it) really ends, and the RV the log then
    starts at. A relist batch is never split: the cut takes all of a batch it reaches into,
    except that a slice (``sliced``: the row limit, not a bound, put ``cutoff`` there) ends
    before it unless the batch starts the log."""
    while True:
        rv, batch = connection.execute(
            "SELECT rv, batch FROM events WHERE shape_id = ? AND seq <= ? "
            "ORDER BY seq DESC LIMIT 1",
            (shape_id, cutoff),
        ).fetchone()
        if not batch:
            return cutoff, str(rv)
        low, high = connection.execute(
            "SELECT min(seq), max(seq) FROM events WHERE shape_id = ? AND rv = ? AND batch = 1",
            (shape_id, rv),
        ).fetchone()
        if high == cutoff or not sliced or low <= first:
            return int(high), str(rv)
        cutoff = int(low) - 1


def _aged(connection: sqlite3.Connection, shape_id: int, *, max_age: float) -> int:
    """The newest entry older than ``max_age`` (0: none), found by the time index in one step
    (commit times grow with seq; a wall clock stepping back makes age retention
    approximate, never unsafe)."""
    row = connection.execute(
        "SELECT seq FROM events WHERE shape_id = ? AND at < ? ORDER BY at DESC LIMIT 1",
        (shape_id, time.time() - max_age),
    ).fetchone()
    return 0 if row is None else int(row[0])


def _over_bytes(
    connection: sqlite3.Connection, shape_id: int, *, seqs: tuple[int, int], excess: int
) -> int:
    """The newest entry that must go for the oldest ones to free ``excess`` bytes (0: none),
    looked for among ``seqs`` (first, last) only: past ``last``, ``last + 1`` says the cut
    goes on beyond this slice. Reads the sizes of those entries (their row headers: the
    bodies of large objects are not read)."""
    if excess <= 0:
        return 0
    first, last = seqs
    cursor = connection.execute(
        f"SELECT seq, {schema.EVENT_BYTES} FROM events WHERE shape_id = ? AND seq BETWEEN ? AND ? "
        "ORDER BY seq",
        (shape_id, first, last),
    )
    try:
        for seq, size in cursor:
            excess -= size
            if excess <= 0:
                return int(seq)
    finally:
        cursor.close()
    return last + 1


def collect_garbage(connection: sqlite3.Connection, *, limit: int = CHUNK) -> bool:
    """Delete up to ``limit`` rows of one garbage generation; True while garbage is left."""
    with connection:
        row = connection.execute("SELECT gen, tbl FROM garbage LIMIT 1").fetchone()
        if row is None:
            return False
        gen, table = int(row[0]), str(row[1])
        if table not in ("objects", "staging"):
            raise ValueError(f"garbage of unknown table {table!r}")
        deleted = connection.execute(
            f"DELETE FROM {table} WHERE gen = ? AND (namespace, name) IN "
            f"(SELECT namespace, name FROM {table} WHERE gen = ? LIMIT ?)",
            (gen, gen, limit),
        ).rowcount
        if deleted < limit:
            connection.execute("DELETE FROM garbage WHERE gen = ? AND tbl = ?", (gen, table))
        return connection.execute("SELECT 1 FROM garbage LIMIT 1").fetchone() is not None


def checkpoint(connection: sqlite3.Connection, *, mode: str) -> None:
    """TRUNCATE at start (nobody reads yet); PASSIVE otherwise: it copies what it can and
    never waits for readers, whose snapshots (a long LIST) would hold the writer up."""
    connection.execute(f"PRAGMA wal_checkpoint({mode})")
