"""Lists into the cache: a shape's first fill and its relists (after 410), in bounded
transactions (see ``writing`` for the invariant they keep).

A first fill writes its generation directly (readers serve nothing before the shape has an
RV). A relist builds the next generation beside the visible one in bounded transactions
(:class:`Relist`) — its log entries appended past ``shapes.last_seq``, where no reader looks —
and publishes it in one small transaction that switches ``gen`` and ``last_seq``: readers see
the old state or the new one, never a mix, and the writer is never held for longer than one
slice. Replaced and abandoned generations are deleted in slices afterwards
(``maintaining.collect_garbage``).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass

from proxy.cache import reading, schema
from proxy.cache.records import Change, ChangeType, EventRecord, with_resource_version
from proxy.cache.writing import (
    CHUNK,
    UPSERT_OBJECT,
    Committed,
    Gens,
    add_log_bytes,
    append,
    bookmark_record,
    discard,
    generations,
    last_seq_of,
    max_seq_of,
    new_generation,
)


def begin_list(connection: sqlite3.Connection, *, shape_id: int) -> None:
    """Start a list of the shape, before its first page is staged: whatever an unfinished
    list left behind is given up, and this one gets a fresh generation to build.

    - First fill (the shape has no RV): its rows go straight into ``gen``; a generation that
      holds rows of an abandoned fill becomes garbage and a fresh one takes its place.
    - Relist: ``next_gen`` is a fresh generation; what an abandoned relist staged and built
      becomes garbage, and the log entries it appended past ``last_seq`` are dropped.
    """
    with connection:
        gens = generations(connection, shape_id)
        _abandon(connection, shape_id, gens)
        fresh = new_generation(connection)
        if gens.filled:
            connection.execute("UPDATE shapes SET next_gen = ? WHERE id = ?", (fresh, shape_id))
        elif connection.execute(
            "SELECT 1 FROM objects WHERE gen = ? LIMIT 1", (gens.gen,)
        ).fetchone():
            discard(connection, gens.gen, "objects")
            connection.execute("UPDATE shapes SET gen = ? WHERE id = ?", (fresh, shape_id))


def stage(connection: sqlite3.Connection, *, shape_id: int, objects: Iterable[Change]) -> None:
    """Commit one batch of a list in progress (after :func:`begin_list`); invisible to readers
    until the list is finished.

    A first fill writes straight into the shape's generation: readers never look at a shape
    without an RV, so the rows are invisible until :func:`finish_fill` sets it, and the fill
    costs one copy of the data instead of two. A relist stages what it lists for the
    generation it builds; an object the cache already holds at the same resourceVersion and
    uid is staged as its key only (empty labels and body): after a long outage most of a
    collection is unchanged, and :class:`Relist` copies those rows inside SQLite. (Sound
    because nothing else writes the shape's objects while it relists: its watch is down until
    the relist is published.)
    """
    with connection:
        gens = generations(connection, shape_id)
        if not gens.filled:
            connection.executemany(
                UPSERT_OBJECT,
                ((gens.gen, o.namespace, o.name, o.uid, o.rv, o.labels, o.raw) for o in objects),
            )
            return
        if gens.next_gen is None:
            raise RuntimeError(f"shape {shape_id}: a relist is staged without begin_list")
        batch = list(objects)
        held = _held_versions(connection, gens.gen, [(o.namespace, o.name) for o in batch])
        connection.executemany(
            "INSERT OR REPLACE INTO staging (gen, namespace, name, uid, rv, rv_order, labels, "
            "raw) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                (
                    gens.next_gen,
                    o.namespace,
                    o.name,
                    o.uid,
                    o.rv,
                    -1 if o.rv_order is None else o.rv_order,
                    *(
                        (b"", b"")
                        if held.get((o.namespace, o.name)) == (o.rv, o.uid)
                        else (o.labels, o.raw)
                    ),
                )
                for o in batch
            ),
        )


def _held_versions(
    connection: sqlite3.Connection, gen: int, keys: list[tuple[str, str]]
) -> dict[tuple[str, str], tuple[str, str]]:
    """(resourceVersion, uid) of those of ``keys`` the generation holds."""
    rows = reading.rows_for_keys(
        connection, columns=("namespace", "name", "rv", "uid"), gen="?", param=gen, keys=keys
    )
    return {(namespace, name): (rv, uid) for namespace, name, rv, uid in rows}


def finish_fill(
    connection: sqlite3.Connection,
    *,
    shape_id: int,
    rv: str,
    kind: str,
    api_version: str,
) -> Committed:
    """Make a shape's first list visible: its staged generation becomes its state and its
    log starts at ``rv``."""
    now = time.time()
    with connection:
        if generations(connection, shape_id).filled:
            raise RuntimeError(f"shape {shape_id} is filled already; a relist is a Relist")
        seq = last_seq_of(connection, shape_id) + 1
        bookmark = bookmark_record(seq, rv, at=now)
        log_bytes = append(connection, shape_id, (bookmark,), now=now)
        connection.execute(
            "UPDATE shapes SET rv = ?, last_seq = ?, kind = ?, api_version = ?, listed_at = ?, "
            "log_start_rv = COALESCE(log_start_rv, ?) WHERE id = ?",
            (rv, seq, kind, api_version, now, rv, shape_id),
        )
    return Committed(rv=rv, last_seq=seq, count=1, records=(bookmark,), log_bytes=log_bytes)


@dataclass(kw_only=True)
class Relist:
    """Finishing a relist (after 410) in bounded transactions: call :meth:`step` until it
    returns what was published.

    The difference from the cached state is appended to the log as ordinary events, so
    watching clients lose nothing, deletes included (docs/design.md §4): ADDED/MODIFIED in
    object-RV order (paged on ``staging_by_rv``), then DELETED for what vanished, stamped with
    the relist RV, then a bookmark at the relist RV (a position: a client holding it resumes
    right after it). Steps, each one transaction of at most ``limit`` rows:

    1. changes: the next page of changed objects: their events, their rows in the new
       generation;
    2. the rest: the next page of the old generation by key: DELETED events for what
       vanished, unchanged rows copied into the new generation;
    3. publish: the bookmark, ``gen`` and ``last_seq`` switched, the old generation and the
       staging rows given to the garbage collector.
    """

    shape_id: int
    rv: str
    kind: str
    api_version: str
    limit: int = CHUNK
    tail: int = CHUNK
    _phase: str = "changes"
    _after: tuple[object, ...] | None = None

    def step(self, connection: sqlite3.Connection) -> Committed | None:
        with connection:
            gens = generations(connection, self.shape_id)
            if gens.next_gen is None:
                raise RuntimeError(f"shape {self.shape_id}: no relist in progress")
            if self._phase == "changes":
                if self._changes(connection, gens.gen, gens.next_gen):
                    self._phase, self._after = "rest", None
                return None
            if self._phase == "rest":
                if self._rest(connection, gens.gen, gens.next_gen):
                    self._phase = "publish"
                return None
            return self._publish(connection, gens.gen, gens.next_gen)

    def _changes(self, connection: sqlite3.Connection, gen: int, next_gen: int) -> bool:
        keyset = (
            "AND (s.rv_order, s.rv, s.namespace, s.name) > (?, ?, ?, ?) " if self._after else ""
        )
        rows = connection.execute(
            "SELECT s.namespace, s.name, s.uid, s.rv, s.rv_order, s.labels, s.raw, o.labels, "
            "o.raw FROM staging s LEFT JOIN objects o ON o.gen = ? "
            "AND o.namespace = s.namespace AND o.name = s.name "
            f"WHERE s.gen = ? AND length(s.raw) > 0 {keyset}"
            "ORDER BY s.rv_order, s.rv, s.namespace, s.name LIMIT ?",
            (gen, next_gen, *(self._after or ()), self.limit),
        ).fetchall()
        now, seq = time.time(), max_seq_of(connection, self.shape_id)
        records, upserts = [], []
        for namespace, name, uid, obj_rv, _, labels, raw, old_labels, old_raw in rows:
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
            upserts.append((next_gen, namespace, name, uid, obj_rv, labels, raw))
        append(connection, self.shape_id, records, now=now)
        connection.executemany(UPSERT_OBJECT, upserts)
        if rows:
            last = rows[-1]
            self._after = (last[4], last[3], last[0], last[1])
        return len(rows) < self.limit

    def _rest(self, connection: sqlite3.Connection, gen: int, next_gen: int) -> bool:
        keyset = "AND (o.namespace, o.name) > (?, ?) " if self._after else ""
        rows = connection.execute(
            "SELECT o.namespace, o.name, s.gen IS NULL, "
            "CASE WHEN s.gen IS NULL THEN o.labels END, CASE WHEN s.gen IS NULL THEN o.raw END "
            "FROM objects o LEFT JOIN staging s ON s.gen = ? AND s.namespace = o.namespace "
            f"AND s.name = o.name WHERE o.gen = ? {keyset}"
            "ORDER BY o.namespace, o.name LIMIT ?",
            (next_gen, gen, *(self._after or ()), self.limit),
        ).fetchall()
        if not rows:
            return True
        now, seq = time.time(), max_seq_of(connection, self.shape_id)
        records = []
        for namespace, name, vanished, labels, raw in rows:
            if not vanished:
                continue
            seq += 1
            records.append(
                EventRecord(
                    seq=seq,
                    type=ChangeType.DELETED,
                    rv=self.rv,
                    batch=True,
                    namespace=namespace,
                    name=name,
                    labels=bytes(labels),
                    prev_labels=bytes(labels),
                    prev_raw=None,
                    raw=with_resource_version(bytes(raw), self.rv),
                    at=now,
                )
            )
        append(connection, self.shape_id, records, now=now)
        # The unchanged rows of this page, copied inside SQLite (their bodies never leave it).
        # CROSS JOIN keeps the page's key range on the outer loop: left to choose, SQLite
        # drove the copy from staging bounded by the namespace alone, and in one namespace
        # every page walked the whole staged collection.
        first = self._after or ("", "")
        last = (rows[-1][0], rows[-1][1])
        connection.execute(
            "INSERT INTO objects (gen, namespace, name, uid, rv, labels, raw) "
            "SELECT ?, o.namespace, o.name, o.uid, o.rv, o.labels, o.raw FROM objects o "
            "CROSS JOIN staging s ON s.gen = ? AND s.namespace = o.namespace AND s.name = o.name "
            "AND length(s.raw) = 0 WHERE o.gen = ? AND (o.namespace, o.name) > (?, ?) "
            "AND (o.namespace, o.name) <= (?, ?)",
            (next_gen, next_gen, gen, *first, *last),
        )
        self._after = last
        return len(rows) < self.limit

    def _publish(self, connection: sqlite3.Connection, gen: int, next_gen: int) -> Committed:
        now = time.time()
        published = last_seq_of(connection, self.shape_id)
        seq = max_seq_of(connection, self.shape_id) + 1
        log_bytes = append(
            connection, self.shape_id, (bookmark_record(seq, self.rv, at=now, batch=True),), now=now
        )
        connection.execute(
            "UPDATE shapes SET gen = ?, next_gen = NULL, rv = ?, last_seq = ?, kind = ?, "
            "api_version = ?, listed_at = ? WHERE id = ?",
            (next_gen, self.rv, seq, self.kind, self.api_version, now, self.shape_id),
        )
        discard(connection, gen, "objects")
        discard(connection, next_gen, "staging")
        after = max(published, seq - self.tail)
        records = reading.events_after(
            connection, shape_id=self.shape_id, after=after, limit=seq - after, last_seq=seq
        )
        return Committed(
            rv=self.rv,
            last_seq=seq,
            count=seq - published,
            records=tuple(records),
            log_bytes=log_bytes,
        )


def abandon_lists(connection: sqlite3.Connection) -> None:
    """At start: every list a stopped warmwatch left unfinished is given up (listed again).

    O(shapes), whatever the lists had written: their generations become garbage, and the log
    entries a relist appended past ``last_seq`` (unseen by readers) stay until the shape's
    next append deletes them in slices (:func:`drop_unpublished`). Deleting them here made a
    warm start after a crash during a relist of 1,000,000 objects take 3.3 s to open its
    port."""
    with connection:
        for (shape_id,) in connection.execute(
            "SELECT id FROM shapes WHERE next_gen IS NOT NULL OR rv IS NULL"
        ).fetchall():
            gens = generations(connection, shape_id)
            _abandon(connection, shape_id, gens)
            if not gens.filled:
                discard(connection, gens.gen, "objects")
                connection.execute(
                    "UPDATE shapes SET gen = ? WHERE id = ?",
                    (new_generation(connection), shape_id),
                )


def _abandon(connection: sqlite3.Connection, shape_id: int, gens: Gens) -> None:
    """Give up a relist in progress (inside the caller's transaction). The log entries it
    appended are left for :func:`drop_unpublished`."""
    if gens.next_gen is not None:
        discard(connection, gens.next_gen, "objects")
        discard(connection, gens.next_gen, "staging")
        connection.execute("UPDATE shapes SET next_gen = NULL WHERE id = ?", (shape_id,))


def drop_unpublished(connection: sqlite3.Connection, *, shape_id: int, limit: int = CHUNK) -> bool:
    """Delete up to ``limit`` log entries past the shape's ``last_seq`` (an abandoned relist
    appended them; no reader looks there); True while some are left. Before the shape's next
    append (a watch commit, a list), every one must be gone: a commit would reuse their seqs,
    and a relist, which appends past them, would publish them."""
    with connection:
        sizes = connection.execute(
            "DELETE FROM events WHERE shape_id = ? AND seq IN (SELECT seq FROM events "
            "WHERE shape_id = ? AND seq > (SELECT last_seq FROM shapes WHERE id = ?) LIMIT ?) "
            f"RETURNING {schema.EVENT_BYTES}",
            (shape_id, shape_id, shape_id, limit),
        ).fetchall()
        add_log_bytes(connection, shape_id, -sum(size for (size,) in sizes))
    return len(sizes) == limit
