"""The writer's transactions: plain synchronous functions over one ``sqlite3.Connection``.

Each public function is one transaction and keeps the invariant of docs/design.md §3: a shape's
objects, its events and its RV change together or not at all, so after any crash the cache is a
consistent snapshot at an RV it had reached. They run on the single writer connection's thread
(see ``store.Store``); tests call them directly on an in-memory database.

Sequence numbers are assigned here, from the shape row, inside the transaction.

A shape's objects are one *generation* of rows (``shapes.gen``). A first fill writes its
generation directly (readers serve nothing before the shape has an RV). A relist builds the
next generation beside the visible one in bounded transactions (:class:`Relist`) — its log
entries appended past ``shapes.last_seq``, where no reader looks — and publishes it in one small
transaction that switches ``gen`` and ``last_seq``: readers see the old state or the new one,
never a mix, and the writer is never held for longer than one slice. Replaced and abandoned
generations are deleted in slices afterwards (:func:`collect_garbage`).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.cache import reading, schema
from proxy.cache.records import Change, ChangeType, EventRecord, rv_order, with_resource_version
from proxy.cache.shapes import ShapeKey

_INSERT_EVENT = """
INSERT INTO events (shape_id, seq, type, rv, rv_order, batch, namespace, name,
                    labels, prev_labels, prev_raw, raw, at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
"""
_UPSERT_OBJECT = """
INSERT OR REPLACE INTO objects (gen, namespace, name, uid, rv, labels, raw)
VALUES (?, ?, ?, ?, ?, ?, ?)
"""
_DELETE_OBJECT = "DELETE FROM objects WHERE gen = ? AND namespace = ? AND name = ?"

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


def _last_seq(connection: sqlite3.Connection, shape_id: int) -> int:
    row = connection.execute("SELECT last_seq FROM shapes WHERE id = ?", (shape_id,)).fetchone()
    if row is None:
        raise ShapeGone(f"shape {shape_id} does not exist")
    return int(row[0])


def event_bytes(record: EventRecord) -> int:
    """``schema.EVENT_BYTES`` of a record: what it counts against retention by bytes."""
    return (
        len(record.raw or b"")
        + len(record.prev_raw or b"")
        + len(record.labels or b"")
        + len(record.prev_labels or b"")
    )


def _add_log_bytes(connection: sqlite3.Connection, shape_id: int, added: int) -> int:
    """``shapes.log_bytes`` plus ``added`` (negative: entries deleted); the new value."""
    row = connection.execute(
        "UPDATE shapes SET log_bytes = log_bytes + ? WHERE id = ? RETURNING log_bytes",
        (added, shape_id),
    ).fetchone()
    if row is None:
        raise ShapeGone(f"shape {shape_id} does not exist")
    return int(row[0])


def _append(
    connection: sqlite3.Connection, shape_id: int, records: Sequence[EventRecord], *, now: float
) -> int:
    """Insert log entries committed at ``now`` (inside the caller's transaction) and count
    their bytes into ``shapes.log_bytes``; the new value."""
    connection.executemany(_INSERT_EVENT, (_event_row(shape_id, r, now) for r in records))
    return _add_log_bytes(connection, shape_id, sum(event_bytes(r) for r in records))


@dataclass(frozen=True, slots=True)
class _Gens:
    gen: int
    next_gen: int | None
    filled: bool


def _gens(connection: sqlite3.Connection, shape_id: int) -> _Gens:
    row = connection.execute(
        "SELECT gen, next_gen, rv FROM shapes WHERE id = ?", (shape_id,)
    ).fetchone()
    if row is None:
        raise ShapeGone(f"shape {shape_id} does not exist")
    return _Gens(gen=int(row[0]), next_gen=row[1], filled=row[2] is not None)


def new_generation(connection: sqlite3.Connection) -> int:
    """A generation number no rows carry: above every live, building or garbage one (a
    collected generation has no rows left, so a number may come back only once unused)."""
    (top,) = connection.execute(
        "SELECT max(g) FROM (SELECT max(max(gen), coalesce(max(next_gen), 0)) AS g FROM shapes "
        "UNION ALL SELECT max(gen) FROM garbage)"
    ).fetchone()
    return int(top or 0) + 1


def _max_seq(connection: sqlite3.Connection, shape_id: int) -> int:
    """The newest log entry, published or not (a relist appends past ``last_seq``)."""
    (seq,) = connection.execute(
        "SELECT max(seq) FROM events WHERE shape_id = ?", (shape_id,)
    ).fetchone()
    return int(seq or 0)


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
        gen = _gens(connection, shape_id).gen
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
                connection.executemany(_UPSERT_OBJECT, upserts)  # keep the order of changes
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
                    connection.executemany(_UPSERT_OBJECT, upserts)
                    upserts.clear()
        connection.executemany(_UPSERT_OBJECT, upserts)
        log_bytes = _append(connection, shape_id, records, now=now)
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


def begin_list(connection: sqlite3.Connection, *, shape_id: int) -> None:
    """Start a list of the shape, before its first page is staged: whatever an unfinished
    list left behind is given up, and this one gets a fresh generation to build.

    - First fill (the shape has no RV): its rows go straight into ``gen``; a generation that
      holds rows of an abandoned fill becomes garbage and a fresh one takes its place.
    - Relist: ``next_gen`` is a fresh generation; what an abandoned relist staged and built
      becomes garbage, and the log entries it appended past ``last_seq`` are dropped.
    """
    with connection:
        gens = _gens(connection, shape_id)
        _abandon(connection, shape_id, gens)
        fresh = new_generation(connection)
        if gens.filled:
            connection.execute("UPDATE shapes SET next_gen = ? WHERE id = ?", (fresh, shape_id))
        elif connection.execute(
            "SELECT 1 FROM objects WHERE gen = ? LIMIT 1", (gens.gen,)
        ).fetchone():
            _discard(connection, gens.gen, "objects")
            connection.execute("UPDATE shapes SET gen = ? WHERE id = ?", (fresh, shape_id))


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
            gens = _gens(connection, shape_id)
            _abandon(connection, shape_id, gens)
            if not gens.filled:
                _discard(connection, gens.gen, "objects")
                connection.execute(
                    "UPDATE shapes SET gen = ? WHERE id = ?",
                    (new_generation(connection), shape_id),
                )


def _abandon(connection: sqlite3.Connection, shape_id: int, gens: _Gens) -> None:
    """Give up a relist in progress (inside the caller's transaction). The log entries it
    appended are left for :func:`drop_unpublished`."""
    if gens.next_gen is not None:
        _discard(connection, gens.next_gen, "objects")
        _discard(connection, gens.next_gen, "staging")
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
        _add_log_bytes(connection, shape_id, -sum(size for (size,) in sizes))
    return len(sizes) == limit


def _discard(connection: sqlite3.Connection, gen: int, table: str) -> None:
    connection.execute("INSERT OR IGNORE INTO garbage (gen, tbl) VALUES (?, ?)", (gen, table))


def discard_shape(connection: sqlite3.Connection, *, shape_id: int) -> None:
    """Drop a shape: its log, its row; its generations become garbage."""
    with connection:
        gens = _gens(connection, shape_id)
        _discard(connection, gens.gen, "objects")
        if gens.next_gen is not None:
            _discard(connection, gens.next_gen, "objects")
            _discard(connection, gens.next_gen, "staging")
        connection.execute("DELETE FROM events WHERE shape_id = ?", (shape_id,))
        connection.execute("DELETE FROM shapes WHERE id = ?", (shape_id,))


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
        gens = _gens(connection, shape_id)
        if not gens.filled:
            connection.executemany(
                _UPSERT_OBJECT,
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
        if _gens(connection, shape_id).filled:
            raise RuntimeError(f"shape {shape_id} is filled already; a relist is a Relist")
        seq = _last_seq(connection, shape_id) + 1
        bookmark = _bookmark(seq, rv, at=now)
        log_bytes = _append(connection, shape_id, (bookmark,), now=now)
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
            gens = _gens(connection, self.shape_id)
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
        now, seq = time.time(), _max_seq(connection, self.shape_id)
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
        _append(connection, self.shape_id, records, now=now)
        connection.executemany(_UPSERT_OBJECT, upserts)
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
        now, seq = time.time(), _max_seq(connection, self.shape_id)
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
        _append(connection, self.shape_id, records, now=now)
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
        published = _last_seq(connection, self.shape_id)
        seq = _max_seq(connection, self.shape_id) + 1
        log_bytes = _append(
            connection, self.shape_id, (_bookmark(seq, self.rv, at=now, batch=True),), now=now
        )
        connection.execute(
            "UPDATE shapes SET gen = ?, next_gen = NULL, rv = ?, last_seq = ?, kind = ?, "
            "api_version = ?, listed_at = ? WHERE id = ?",
            (next_gen, self.rv, seq, self.kind, self.api_version, now, self.shape_id),
        )
        _discard(connection, gen, "objects")
        _discard(connection, next_gen, "staging")
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
        log_bytes = _add_log_bytes(connection, shape_id, -sum(size for (size,) in sizes))
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


# -- the shape registry and discovery documents ---------------------------------------------

SHAPE_COLUMNS = (
    "id, grp, version, resource, namespace, label_selector, field_selector, encoding, "
    "configured, kind, api_version, rv, log_start_rv, last_seq, used_at, log_bytes, "
    "EXISTS (SELECT 1 FROM events WHERE events.shape_id = shapes.id "
    "AND events.seq > shapes.last_seq)"
)
"""The columns of a shape row as ``shapes.Shape.from_row`` reads them; the last says whether
an abandoned relist left log entries past ``last_seq`` (:func:`drop_unpublished`)."""


def open_shapes(connection: sqlite3.Connection) -> list[tuple[Any, ...]]:
    """Every shape's row, at start. A list interrupted by a crash starts over: what it wrote
    is abandoned here and collected in slices by the first maintenance pass (so a warm start
    does not wait for it)."""
    abandon_lists(connection)
    return connection.execute(f"SELECT {SHAPE_COLUMNS} FROM shapes ORDER BY id").fetchall()


def insert_shapes(
    connection: sqlite3.Connection, *, shapes: dict[ShapeKey, bool]
) -> list[tuple[Any, ...]]:
    """New shapes (each with whether it is configured), each with an empty generation, in one
    transaction; returns their rows."""
    now = time.time()
    rows: list[tuple[Any, ...]] = []
    with connection:
        for key, configured in shapes.items():
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
                    new_generation(connection),
                ),
            )
            rows.append(
                connection.execute(
                    f"SELECT {SHAPE_COLUMNS} FROM shapes WHERE key = ?", (key.identity,)
                ).fetchone()
            )
    return rows


def set_configured(connection: sqlite3.Connection, *, shape_id: int) -> None:
    """A learned shape became a configured one (``--resource``): never dropped as unused."""
    with connection:
        connection.execute("UPDATE shapes SET configured = 1 WHERE id = ?", (shape_id,))


def save_usage(connection: sqlite3.Connection, *, used: dict[int, float]) -> None:
    """When each shape was last used (kept in memory, saved now and then)."""
    with connection:
        connection.executemany(
            "UPDATE shapes SET used_at = ? WHERE id = ?",
            ((at, shape_id) for shape_id, at in used.items()),
        )


def put_document(
    connection: sqlite3.Connection,
    *,
    key: str,
    status: int,
    headers: bytes,
    body: bytes,
    etag: str,
    evict: Sequence[str] = (),
) -> None:
    """Store (or replace) a discovery document, for answering it while upstream is away, and
    delete the ``evict`` ones in the same transaction (the bounds hold at every commit)."""
    with connection:
        _delete_documents(connection, evict)
        connection.execute(
            "INSERT OR REPLACE INTO discovery (key, status, headers, body, etag, stored_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (key, status, headers, body, etag, time.time()),
        )


def drop_documents(connection: sqlite3.Connection, *, keys: Sequence[str]) -> None:
    """Delete discovery documents (gone upstream, or past the bounds)."""
    with connection:
        _delete_documents(connection, keys)


def _delete_documents(connection: sqlite3.Connection, keys: Sequence[str]) -> None:
    connection.executemany("DELETE FROM discovery WHERE key = ?", ((key,) for key in keys))


def checkpoint(connection: sqlite3.Connection, *, mode: str) -> None:
    """TRUNCATE at start (nobody reads yet); PASSIVE otherwise: it copies what it can and
    never waits for readers, whose snapshots (a long LIST) would hold the writer up."""
    connection.execute(f"PRAGMA wal_checkpoint({mode})")
