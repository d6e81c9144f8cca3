"""Retention by count and age, garbage collection (``maintaining``) on an in-memory
database; retention by bytes is ``test_retention``."""

from __future__ import annotations

import sqlite3

from proxy.cache import appending, maintaining, registering, relisting
from tests.unit.cache.conftest import cm, collect, events, fill, garbage, shape


def test_trim_keeps_the_newest_and_moves_the_log_start(db: sqlite3.Connection) -> None:
    fill(db, [], "10")
    appending.apply_changes(db, shape_id=1, changes=[cm(f"o{i}", 11 + i) for i in range(10)])
    trimmed = maintaining.trim(db, shape_id=1, max_events=4, max_age=3600, max_bytes=1 << 30)
    assert (trimmed.dropped, trimmed.reason, trimmed.log_start_rv) == (7, "count", "16")
    assert shape(db)[2] == "16"  # the log holds every change after RV 16
    assert [e[2] for e in events(db)] == ["17", "18", "19", "20"]


def test_trim_never_splits_a_relist_batch(db: sqlite3.Connection) -> None:
    fill(db, [cm("a", 1), cm("b", 2), cm("c", 3)], "10")
    fill(db, [], "50")  # three DELETED at 50 plus the bookmark at 50
    appending.apply_changes(db, shape_id=1, changes=[cm("d", 51)])
    maintaining.trim(db, shape_id=1, max_events=3, max_age=3600, max_bytes=1 << 30)
    assert [e[1:3] for e in events(db)] == [("ADDED", "51")]
    assert shape(db)[2] == "50"


def test_a_dropped_shape_leaves_garbage_only(db: sqlite3.Connection) -> None:
    fill(db, [cm("x", 5)], "10")
    relisting.begin_list(db, shape_id=1)
    relisting.stage(db, shape_id=1, objects=[cm("y", 6)])
    registering.discard_shape(db, shape_id=1)
    assert garbage(db) == [(1, "objects"), (2, "objects"), (2, "staging")]
    collect(db)
    for table in ("objects", "staging", "events", "shapes"):
        assert db.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0


def test_maintenance_queries_use_an_index(db: sqlite3.Connection) -> None:
    """Found by review: retention by age and the per-shape object count scanned every row
    (bodies included) every minute. The plans of the statements they really run."""
    fill(db, [], "10")
    statements: list[str] = []
    db.set_trace_callback(statements.append)
    maintaining.trim(db, shape_id=1, max_events=1000, max_age=60, max_bytes=1 << 30)
    db.set_trace_callback(None)
    aged = next(s for s in statements if "at <" in s)
    plans = {
        "events_by_time": aged,
        "objects_by_shape": "SELECT count(*) FROM objects WHERE gen = 1",
    }
    for index, query in plans.items():
        plan = " ".join(row[-1] for row in db.execute(f"EXPLAIN QUERY PLAN {query}"))
        assert index in plan, (query, plan)
