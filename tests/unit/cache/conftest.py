"""The in-memory database the cache's transaction tests share, and their helpers: objects
to write, lists run as the store runs them, and what the tables then hold."""

from __future__ import annotations

import sqlite3

import pytest

from proxy.cache import maintaining, relisting, schema, writing
from proxy.cache.records import Change, ChangeType, change_from_object


@pytest.fixture
def db() -> sqlite3.Connection:
    connection = sqlite3.connect(":memory:")
    schema.migrate(connection)
    connection.execute(
        "INSERT INTO shapes (id, key, grp, version, resource, namespace, label_selector, "
        "field_selector, configured, created_at, used_at, gen) "
        "VALUES (1, 'v1/configmaps', '', 'v1', 'configmaps', '', '', '', 1, 0, 0, 1)"
    )
    connection.commit()
    return connection


def cm(name: str, rv: int, *, labels: dict[str, str] | None = None, ns: str = "a") -> Change:
    obj = {
        "kind": "ConfigMap",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{name}",
            "resourceVersion": str(rv),
            "labels": labels or {},
        },
    }
    return change_from_object(ChangeType.ADDED, obj)


def objects(db: sqlite3.Connection, shape_id: int = 1) -> dict[str, str]:
    """The objects readers see: the shape's current generation."""
    return dict(
        db.execute(
            "SELECT name, rv FROM objects WHERE gen = (SELECT gen FROM shapes WHERE id = ?)",
            (shape_id,),
        )
    )


def events(db: sqlite3.Connection) -> list[tuple[int, str, str, str, int]]:
    return list(db.execute("SELECT seq, type, rv, name, batch FROM events ORDER BY seq"))


def shape(db: sqlite3.Connection) -> tuple[str, int, str]:
    return db.execute("SELECT rv, last_seq, log_start_rv FROM shapes WHERE id = 1").fetchone()


def fill(
    db: sqlite3.Connection, changes: list[Change], rv: str, *, shape_id: int = 1, limit: int = 0
) -> writing.Committed:
    """A whole list, as the store runs it: begin, stage, then finish (a first fill at once, a
    relist step by step, ``limit`` rows a step)."""
    relisting.begin_list(db, shape_id=shape_id)
    relisting.stage(db, shape_id=shape_id, objects=changes)
    return finish(db, rv, shape_id=shape_id, limit=limit)


def finish(
    db: sqlite3.Connection, rv: str, *, shape_id: int = 1, limit: int = 0
) -> writing.Committed:
    filled = db.execute("SELECT rv FROM shapes WHERE id = ?", (shape_id,)).fetchone()[0]
    if filled is None:
        return relisting.finish_fill(
            db, shape_id=shape_id, rv=rv, kind="ConfigMap", api_version="v1"
        )
    relist = relisting.Relist(
        shape_id=shape_id, rv=rv, kind="ConfigMap", api_version="v1", limit=limit or writing.CHUNK
    )
    while (committed := relist.step(db)) is None:
        pass
    return committed


def garbage(db: sqlite3.Connection) -> list[tuple[int, str]]:
    return list(db.execute("SELECT gen, tbl FROM garbage ORDER BY gen, tbl"))


def collect(db: sqlite3.Connection) -> None:
    while maintaining.collect_garbage(db, limit=2):
        pass
