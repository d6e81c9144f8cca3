"""The writer's transactions on an in-memory database: no sockets, no event loop."""

from __future__ import annotations

import sqlite3
from dataclasses import replace

import orjson
import pytest

from proxy.cache import schema, writing
from proxy.cache.records import Change, ChangeType, change_from_object


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


def objects(db: sqlite3.Connection) -> dict[str, str]:
    return dict(db.execute("SELECT name, rv FROM objects WHERE shape_id = 1"))


def events(db: sqlite3.Connection) -> list[tuple[int, str, str, str, int]]:
    return list(db.execute("SELECT seq, type, rv, name, batch FROM events ORDER BY seq"))


def shape(db: sqlite3.Connection) -> tuple[str, int, str]:
    return db.execute("SELECT rv, last_seq, log_start_rv FROM shapes WHERE id = 1").fetchone()


def fill(db: sqlite3.Connection, changes: list[Change], rv: str) -> writing.Committed:
    writing.stage(db, shape_id=1, objects=changes)
    return writing.finish_list(db, shape_id=1, rv=rv, kind="ConfigMap", api_version="v1")


def test_first_list_becomes_state_and_starts_the_log(db: sqlite3.Connection) -> None:
    committed = fill(db, [cm("x", 5), cm("y", 7)], "10")
    assert objects(db) == {"x": "5", "y": "7"}
    assert events(db) == [(1, "BOOKMARK", "10", "", 0)]
    assert shape(db) == ("10", 1, "10")
    assert committed.count == 1
    assert db.execute("SELECT count(*) FROM staging").fetchone()[0] == 0


def test_a_first_fill_is_invisible_until_finished(db: sqlite3.Connection) -> None:
    writing.stage(db, shape_id=1, objects=[cm("x", 5)])
    assert shape(db)[0] is None  # readers serve nothing without an RV
    writing.discard_staging(db, shape_id=1)  # a retried fill starts from nothing
    assert objects(db) == {}


def test_relist_rows_are_invisible_until_finished(db: sqlite3.Connection) -> None:
    fill(db, [cm("x", 5)], "10")
    writing.stage(db, shape_id=1, objects=[cm("y", 12)])
    assert objects(db) == {"x": "5"}
    writing.discard_staging(db, shape_id=1)
    assert objects(db) == {"x": "5"}
    assert db.execute("SELECT count(*) FROM staging").fetchone()[0] == 0


def test_changes_update_objects_events_and_rv_together(db: sqlite3.Connection) -> None:
    fill(db, [cm("x", 5)], "10")
    moved = Change(**{**_fields(cm("x", 11, labels={"app": "b"})), "type": ChangeType.MODIFIED})
    gone = Change(**{**_fields(cm("x", 12, labels={"app": "b"})), "type": ChangeType.DELETED})
    committed = writing.apply_changes(db, shape_id=1, changes=[cm("y", 11), moved, gone])
    assert objects(db) == {"y": "11"}
    assert [e[1:4] for e in events(db)][1:] == [
        ("ADDED", "11", "y"),
        ("MODIFIED", "11", "x"),
        ("DELETED", "12", "x"),
    ]
    assert shape(db) == ("12", 4, "10")
    modified = committed.records[1]
    assert modified.prev_labels == b"{}" and modified.labels == b'{"app":"b"}'
    assert modified.prev_raw is not None  # labels changed: the previous object is kept
    assert committed.records[2].prev_labels == b'{"app":"b"}'  # previous in the same batch


def _fields(change: Change) -> dict[str, object]:
    return {f: getattr(change, f) for f in Change.__dataclass_fields__}


def test_relist_appends_the_difference(db: sqlite3.Connection) -> None:
    fill(db, [cm("keep", 5), cm("change", 6), cm("vanish", 7)], "10")
    committed = fill(db, [cm("keep", 5), cm("new", 30), cm("change", 20)], "40")
    assert objects(db) == {"keep": "5", "change": "20", "new": "30"}
    assert [e[1:] for e in events(db)][1:] == [
        ("MODIFIED", "20", "change", 1),
        ("ADDED", "30", "new", 1),
        ("DELETED", "40", "vanish", 1),
        ("BOOKMARK", "40", "", 1),
    ]
    deleted = db.execute("SELECT raw FROM events WHERE type = 'DELETED'").fetchone()[0]
    assert orjson.loads(deleted)["metadata"]["resourceVersion"] == "40"
    assert shape(db) == ("40", 5, "10")
    assert committed.count == 4


def test_trim_keeps_the_newest_and_moves_the_log_start(db: sqlite3.Connection) -> None:
    fill(db, [], "10")
    writing.apply_changes(db, shape_id=1, changes=[cm(f"o{i}", 11 + i) for i in range(10)])
    dropped = writing.trim(db, shape_id=1, max_events=4, max_age=3600)
    assert dropped == 7
    assert shape(db)[2] == "16"  # the log holds every change after RV 16
    assert [e[2] for e in events(db)] == ["17", "18", "19", "20"]


def test_trim_never_splits_a_relist_batch(db: sqlite3.Connection) -> None:
    fill(db, [cm("a", 1), cm("b", 2), cm("c", 3)], "10")
    fill(db, [], "50")  # three DELETED at 50 plus the bookmark at 50
    writing.apply_changes(db, shape_id=1, changes=[cm("d", 51)])
    writing.trim(db, shape_id=1, max_events=3, max_age=3600)
    assert [e[1:3] for e in events(db)] == [("ADDED", "51")]
    assert shape(db)[2] == "50"


def test_unknown_schema_version_is_refused() -> None:
    connection = sqlite3.connect(":memory:")
    schema.migrate(connection)
    connection.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    connection.commit()
    with pytest.raises(schema.SchemaError, match="schema version 99"):
        schema.migrate(connection)


def test_foreign_database_is_refused() -> None:
    connection = sqlite3.connect(":memory:")
    connection.execute("CREATE TABLE users (id INTEGER)")
    with pytest.raises(schema.SchemaError, match="not a warmwatch database"):
        schema.migrate(connection)


def test_a_relist_stages_unchanged_objects_as_keys_only(db: sqlite3.Connection) -> None:
    fill(db, [cm("same", 5), cm("changed", 6), cm("recreated", 7)], "10")
    recreated = replace(cm("recreated", 7), uid="uid-new")  # same RV, another object
    writing.stage(db, shape_id=1, objects=[cm("same", 5), cm("changed", 20), recreated])
    staged = {
        name: len(raw) for name, raw in db.execute("SELECT name, raw FROM staging ORDER BY name")
    }
    assert staged["same"] == 0 and staged["changed"] > 0 and staged["recreated"] > 0
    writing.finish_list(db, shape_id=1, rv="40", kind="ConfigMap", api_version="v1")
    assert objects(db) == {"same": "5", "changed": "20", "recreated": "7"}
    same = db.execute("SELECT raw FROM objects WHERE name = 'same'").fetchone()[0]
    assert orjson.loads(same)["metadata"]["name"] == "same"  # the held body, untouched
    assert [e[1:4] for e in events(db)][1:] == [
        ("MODIFIED", "7", "recreated"),
        ("MODIFIED", "20", "changed"),
        ("BOOKMARK", "40", ""),
    ]


def test_a_relist_larger_than_a_chunk_is_appended_once(db: sqlite3.Connection) -> None:
    fill(db, [cm("old", 1)], "10")
    many = [cm(f"o{i:05d}", 11 + i) for i in range(2 * writing.CHUNK + 500)]
    committed = fill(db, many, "9000")
    (count,) = db.execute("SELECT count(*) FROM events WHERE batch = 1").fetchone()
    assert count == len(many) + 2  # every object once, the DELETED of "old", the bookmark
    assert committed.count == count
    seqs = [r.seq for r in committed.records]
    assert seqs == list(range(seqs[0], committed.last_seq + 1))  # the newest, contiguous
    assert len(seqs) == writing.CHUNK


def test_a_protobuf_relist_stamps_deletes_in_protobuf(db: sqlite3.Connection) -> None:
    """A protobuf shape's objects are their own messages: the DELETED of a relist diff carries
    the relist RV inside its ObjectMeta, still as protobuf."""
    from proxy.cache.records import change_from_protobuf
    from proxy.kube import protobuf
    from tests.unit.kube.test_protobuf import configmap

    fill(db, [change_from_protobuf(ChangeType.ADDED, configmap("gone", "a", "3"))], "10")
    fill(db, [], "20")
    (raw,) = db.execute("SELECT raw FROM events WHERE type = 'DELETED'").fetchone()
    assert not bytes(raw).startswith(b"{")
    meta = protobuf.object_meta(bytes(raw))
    assert (meta.name, meta.resource_version) == ("gone", "20")


def test_a_version_1_database_is_migrated_in_place() -> None:
    connection = sqlite3.connect(":memory:")
    schema.migrate(connection)
    connection.execute("ALTER TABLE shapes DROP COLUMN encoding")
    connection.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    connection.execute(
        "INSERT INTO shapes (id, key, grp, version, resource, namespace, label_selector, "
        "field_selector, configured, created_at, used_at) "
        "VALUES (1, 'v1/configmaps', '', 'v1', 'configmaps', '', '', '', 1, 0, 0)"
    )
    connection.commit()
    schema.migrate(connection)
    assert connection.execute("SELECT encoding FROM shapes").fetchall() == [("json",)]
    assert connection.execute("SELECT value FROM meta").fetchone() == ("2",)


def test_maintenance_queries_use_an_index(db: sqlite3.Connection) -> None:
    """Found by review: retention by age and the per-shape object count scanned every row
    (bodies included) every minute. The plans of the statements they really run."""
    statements: list[str] = []
    db.set_trace_callback(statements.append)
    writing.trim(db, shape_id=1, max_events=1000, max_age=60)
    db.set_trace_callback(None)
    aged = next(s for s in statements if "at <" in s)
    plans = {
        "events_by_time": aged,
        "objects_by_shape": "SELECT shape_id, count(*) FROM objects GROUP BY shape_id",
    }
    for index, query in plans.items():
        plan = " ".join(row[-1] for row in db.execute(f"EXPLAIN QUERY PLAN {query}"))
        assert index in plan, (query, plan)


def test_a_relist_reads_in_order_from_an_index(db: sqlite3.Connection) -> None:
    """Found by review: a relist sorted every changed row, bodies included, in memory
    (``ORDER BY rv_order`` without an index, ``temp_store=MEMORY``)."""
    fill(db, [cm("a", 1), cm("b", 2)], "10")
    statements: list[str] = []
    db.set_trace_callback(statements.append)
    fill(db, [cm("a", 11), cm("c", 12)], "20")
    db.set_trace_callback(None)
    changed = next(s for s in statements if "FROM staging s LEFT JOIN" in s)
    plan = " ".join(row[-1] for row in db.execute(f"EXPLAIN QUERY PLAN {changed}"))
    assert "TEMP B-TREE" not in plan and "staging_by_rv" in plan, plan
    assert [e[1:4] for e in events(db)][-4:] == [
        ("MODIFIED", "11", "a"),
        ("ADDED", "12", "c"),
        ("DELETED", "20", "b"),
        ("BOOKMARK", "20", ""),
    ]
