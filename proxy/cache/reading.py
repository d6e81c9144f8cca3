"""The reader's queries: plain synchronous functions over one ``sqlite3.Connection``.

The read side of ``writing``: each function is one consistent read (a read transaction where
it takes more than one statement), runs on a reader connection's thread (see
``store.Store``), and is unit-tested on an in-memory database. The rules of resuming a watch
live here (:func:`position`): where in a shape's log a watch from a resourceVersion starts.

A snapshot (a LIST, a watch's initial state) is the one read that spans calls:
:func:`begin_snapshot` opens a read transaction and reads the shape's head, then
:func:`object_rows` pages through its objects by key within that transaction, and
:func:`end_snapshot` closes it. The pages see one state however long the response takes, and
no statement stays open between pages.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.cache.records import ChangeType, EventRecord, rv_order
from proxy.kube import versions
from proxy.kube.status import StatusError

Row = tuple[str, str, bytes, bytes]
"""(namespace, name, labels JSON, raw object)."""

Head = tuple[str, str, bytes, int, bytes]
"""(namespace, name, labels JSON, length of raw, the first bytes of raw): what sizing a
protobuf list needs before it is streamed."""

HEAD_BYTES = 11
"""A tag byte and a varint of up to ten: the start of ObjectMeta's field."""


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
                "SELECT min(seq) FROM events WHERE shape_id = ? AND seq <= ? AND (rv_order > ? "
                "OR (rv_order = ? AND batch = 1 AND EXISTS (SELECT 1 FROM events WHERE "
                "shape_id = ? AND rv_order = ? AND batch = 1 AND type = 'BOOKMARK' "
                "AND seq <= ?)))",
                (shape_id, last_seq, order, order, shape_id, order, last_seq),
            ).fetchone()
            return int(first) - 1 if first is not None else int(last_seq)
        low, high, batch = connection.execute(
            "SELECT min(seq), max(seq), max(batch) FROM events WHERE shape_id = ? AND rv = ? "
            "AND seq <= ?",
            (shape_id, rv, last_seq),
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
    newest seq published (a relist in progress appends past it, unseen): entries up to it
    that are no longer in the log were trimmed while
    the watcher lagged (:class:`LogTrimmed`; "no rows" then must not read as "nothing new",
    or the watcher would spin)."""
    cursor = connection.execute(
        "SELECT seq, type, rv, batch, namespace, name, labels, prev_labels, prev_raw, raw, at "
        "FROM events WHERE shape_id = ? AND seq > ? AND seq <= ? ORDER BY seq LIMIT ?",
        (shape_id, after, last_seq, limit),
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


# ------------------------------------------------------------------------------ snapshots


@dataclass(frozen=True, kw_only=True, slots=True)
class SnapshotHead:
    """What a snapshot holds besides its objects: the shape's RV, the log position of that
    state, and the kind of its objects."""

    rv: str
    last_seq: int
    kind: str
    api_version: str
    gen: int
    """The generation of objects this state is (``writing``)."""


def begin_snapshot(connection: sqlite3.Connection, *, shape_id: int) -> SnapshotHead | None:
    """Open a read transaction and read the shape's head; None (and no transaction) while
    the shape is not filled. Close it with :func:`end_snapshot`."""
    connection.execute("BEGIN")
    row = connection.execute(
        "SELECT rv, last_seq, kind, api_version, gen FROM shapes WHERE id = ?", (shape_id,)
    ).fetchone()
    if row is None or row[0] is None:
        connection.execute("COMMIT")
        return None
    return SnapshotHead(
        rv=row[0], last_seq=int(row[1]), kind=row[2], api_version=row[3], gen=int(row[4])
    )


def end_snapshot(connection: sqlite3.Connection) -> None:
    if connection.in_transaction:
        connection.execute("COMMIT")


def object_rows(
    connection: sqlite3.Connection,
    *,
    gen: int,
    namespace: str | None,
    after: tuple[str, str] | None,
    limit: int,
    max_bytes: int | None = None,
) -> list[Row]:
    """The next page of a snapshot's objects (``SnapshotHead.gen``; of one namespace, or
    all) in key order, after the key ``after`` (exclusive; None: from the start): at most
    ``limit`` rows, and no more once their bodies reach ``max_bytes`` (but at least one)."""
    columns = "namespace, name, labels, raw"
    return _page(connection, columns, gen, namespace, after, limit, max_bytes)


def object_heads(
    connection: sqlite3.Connection,
    *,
    gen: int,
    namespace: str | None,
    after: tuple[str, str] | None,
    limit: int,
    max_bytes: int | None = None,
) -> list[Head]:
    """:func:`object_rows` without the bodies: their lengths and first ``HEAD_BYTES``."""
    columns = f"namespace, name, labels, length(raw), substr(raw, 1, {HEAD_BYTES})"
    return _page(connection, columns, gen, namespace, after, limit, max_bytes)


def _page(
    connection: sqlite3.Connection,
    columns: str,
    gen: int,
    namespace: str | None,
    after: tuple[str, str] | None,
    limit: int,
    max_bytes: int | None,
) -> list[Any]:
    # Keyset paging on the key (gen, namespace, name): each page is one index seek, however
    # deep into the collection it starts. Within one namespace the bound is on the name
    # alone: with both ``namespace = ?`` and the row value, SQLite's planner scanned and
    # sorted the namespace's rows up to the bound for each page (quadratic: a filtered LIST
    # of 500,000 objects took minutes).
    where: list[str] = ["gen = ?"]
    params: list[object] = [gen]
    if namespace is not None:
        where.append("namespace = ?")
        params.append(namespace)
        if after is not None:
            where.append("name > ?")
            params.append(after[1])
    elif after is not None:
        where.append("(namespace, name) > (?, ?)")
        params += after
    cursor = connection.execute(
        f"SELECT {columns} FROM objects WHERE {' AND '.join(where)} "
        "ORDER BY namespace, name LIMIT ?",
        (*params, limit),
    )
    if max_bytes is None:
        return cursor.fetchall()
    rows, size = [], 0
    for row in cursor:
        rows.append(row)
        size += len(row[-1])
        if size >= max_bytes:
            break
    cursor.close()
    return rows


# ------------------------------------------------------------------------- single reads

_GEN = "(SELECT gen FROM shapes WHERE id = ?)"
"""The generation of objects a shape shows now."""


def get_object(
    connection: sqlite3.Connection, *, shape_id: int, namespace: str, name: str
) -> bytes | None:
    """One cached object's raw bytes, or None."""
    row = connection.execute(
        f"SELECT raw FROM objects WHERE gen = {_GEN} AND namespace = ? AND name = ?",
        (shape_id, namespace, name),
    ).fetchone()
    return bytes(row[0]) if row is not None else None


def present(
    connection: sqlite3.Connection, *, shape_id: int, keys: Sequence[tuple[str, str]]
) -> tuple[tuple[str, str], ...]:
    """Which of ``keys`` (namespace, name) the shape's objects hold now (one read)."""
    connection.execute("BEGIN")
    try:
        rows = rows_for_keys(
            connection, columns=("namespace", "name"), gen=_GEN, param=shape_id, keys=keys
        )
        return tuple((str(ns), str(name)) for ns, name in rows)
    finally:
        connection.execute("COMMIT")


def rows_for_keys(
    connection: sqlite3.Connection,
    *,
    columns: Sequence[str],
    gen: str,
    param: int,
    keys: Sequence[tuple[str, str]],
) -> list[Any]:
    """``columns`` of the objects of generation ``gen`` (an SQL expression of the one
    parameter ``param``) whose (namespace, name) is among ``keys``, asked in chunks that
    stay under SQLite's bound-parameter limit.

    The keys are joined to the table, one primary-key seek each. Asked as ``(namespace, name)
    IN (VALUES ...)``, SQLite scanned the whole generation for every chunk and tested each
    row against the list: a relist of 500,000 objects into a cache of 1,000,000 staged 760
    objects/s."""
    selected = ", ".join(f"o.{column}" for column in columns)
    found: list[Any] = []
    for start in range(0, len(keys), 400):
        chunk = keys[start : start + 400]
        values = ",".join("(?, ?)" for _ in chunk)
        found += connection.execute(
            f"SELECT {selected} FROM (VALUES {values}) AS k JOIN objects AS o "
            f"ON o.gen = {gen} AND o.namespace = k.column1 AND o.name = k.column2",
            (*(part for key in chunk for part in key), param),
        ).fetchall()
    return found


def object_counts(connection: sqlite3.Connection) -> dict[int, int]:
    """Objects cached per shape id (from the small ``objects_by_shape`` index)."""
    return {
        int(shape_id): int(count)
        for shape_id, count in connection.execute(
            "SELECT s.id, (SELECT count(*) FROM objects o WHERE o.gen = s.gen) FROM shapes s"
        )
    }


def get_document(
    connection: sqlite3.Connection, *, key: str
) -> tuple[int, bytes, bytes, str] | None:
    """A stored discovery document: status, headers (JSON), body, ETag ("" when none)."""
    row = connection.execute(
        "SELECT status, headers, body, etag FROM discovery WHERE key = ?", (key,)
    ).fetchone()
    return (int(row[0]), bytes(row[1]), bytes(row[2]), str(row[3])) if row else None


def document_sizes(connection: sqlite3.Connection) -> list[tuple[str, int]]:
    """Every stored discovery document's key and body size in bytes, the oldest stored
    first."""
    return [
        (str(key), int(size))
        for key, size in connection.execute(
            "SELECT key, length(body) FROM discovery ORDER BY stored_at, key"
        )
    ]
