"""The shape registry (a row per cached collection) and the stored discovery documents, one
transaction each (see ``writing`` for the invariant they keep)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from typing import Any

from proxy.cache.relisting import abandon_lists
from proxy.cache.shapes import ShapeKey
from proxy.cache.writing import discard, generations, new_generation

SHAPE_COLUMNS = (
    "id, grp, version, resource, namespace, label_selector, field_selector, encoding, "
    "configured, kind, api_version, rv, log_start_rv, last_seq, used_at, log_bytes, "
    "EXISTS (SELECT 1 FROM events WHERE events.shape_id = shapes.id "
    "AND events.seq > shapes.last_seq)"
)
"""The columns of a shape row as ``shapes.Shape.from_row`` reads them; the last says whether
an abandoned relist left log entries past ``last_seq`` (``relisting.drop_unpublished``)."""


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


def discard_shape(connection: sqlite3.Connection, *, shape_id: int) -> None:
    """Drop a shape: its log, its row; its generations become garbage."""
    with connection:
        gens = generations(connection, shape_id)
        discard(connection, gens.gen, "objects")
        if gens.next_gen is not None:
            discard(connection, gens.next_gen, "objects")
            discard(connection, gens.next_gen, "staging")
        connection.execute("DELETE FROM events WHERE shape_id = ?", (shape_id,))
        connection.execute("DELETE FROM shapes WHERE id = ?", (shape_id,))


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
