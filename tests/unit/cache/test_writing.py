"""The writer's transactions on an in-memory database: no sockets, no event loop."""

from __future__ import annotations

import sqlite3
from dataclasses import replace

import orjson
import pytest

from proxy.cache import reading, schema, writing
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
    writing.begin_list(db, shape_id=shape_id)
    writing.stage(db, shape_id=shape_id, objects=changes)
    return finish(db, rv, shape_id=shape_id, limit=limit)


def finish(
    db: sqlite3.Connection, rv: str, *, shape_id: int = 1, limit: int = 0
) -> writing.Committed:
    filled = db.execute("SELECT rv FROM shapes WHERE id = ?", (shape_id,)).fetchone()[0]
    if filled is None:
        return writing.finish_fill(db, shape_id=shape_id, rv=rv, kind="ConfigMap", api_version="v1")
    relist = writing.Relist(
        shape_id=shape_id, rv=rv, kind="ConfigMap", api_version="v1", limit=limit or writing.CHUNK
    )
    while (committed := relist.step(db)) is None:
        pass
    return committed


def garbage(db: sqlite3.Connection) -> list[tuple[int, str]]:
    return list(db.execute("SELECT gen, tbl FROM garbage ORDER BY gen, tbl"))


def collect(db: sqlite3.Connection) -> None:
    while writing.collect_garbage(db, limit=2):
        pass


def test_first_list_becomes_state_and_starts_the_log(db: sqlite3.Connection) -> None:
    committed = fill(db, [cm("x", 5), cm("y", 7)], "10")
    assert objects(db) == {"x": "5", "y": "7"}
    assert events(db) == [(1, "BOOKMARK", "10", "", 0)]
    assert shape(db) == ("10", 1, "10")
    assert committed.count == 1
    assert db.execute("SELECT count(*) FROM staging").fetchone()[0] == 0


def test_a_first_fill_is_invisible_until_finished(db: sqlite3.Connection) -> None:
    writing.begin_list(db, shape_id=1)
    writing.stage(db, shape_id=1, objects=[cm("x", 5)])
    assert shape(db)[0] is None  # readers serve nothing without an RV
    writing.begin_list(db, shape_id=1)  # a retried fill starts from nothing
    assert objects(db) == {}
    assert garbage(db) == [(1, "objects")]
    collect(db)
    assert db.execute("SELECT count(*) FROM objects").fetchone()[0] == 0
    assert garbage(db) == []


def test_relist_rows_are_invisible_until_published(db: sqlite3.Connection) -> None:
    fill(db, [cm("x", 5), cm("y", 6)], "10")
    writing.begin_list(db, shape_id=1)
    writing.stage(db, shape_id=1, objects=[cm("y", 12), cm("z", 13)])
    relist = writing.Relist(shape_id=1, rv="20", kind="ConfigMap", api_version="v1", limit=1)
    assert relist.step(db) is None  # one change: its event past last_seq, its row in next_gen
    assert objects(db) == {"x": "5", "y": "6"}
    assert shape(db) == ("10", 1, "10")
    assert reading.events_after(db, shape_id=1, after=1, limit=10, last_seq=1) == []
    while writing.drop_unpublished(db, shape_id=1):  # a retry: its log entries go first,
        pass
    writing.begin_list(db, shape_id=1)  # then it is given up: nothing of it stays
    assert [e[0] for e in events(db)] == [1]
    assert objects(db) == {"x": "5", "y": "6"}
    collect(db)
    assert db.execute("SELECT count(*) FROM staging").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM objects").fetchone()[0] == 2


def test_a_relist_is_published_at_once_after_bounded_steps(db: sqlite3.Connection) -> None:
    """Readers see the old state until the last step, then the new one; every step but the
    last leaves the published shape untouched."""
    fill(db, [cm(f"o{i}", 1 + i) for i in range(7)], "10")
    writing.begin_list(db, shape_id=1)
    listed = [cm(f"o{i}", 1 + i) for i in range(0, 7, 2)] + [cm("o1", 30), cm("n", 31)]
    writing.stage(db, shape_id=1, objects=listed)
    relist = writing.Relist(shape_id=1, rv="40", kind="ConfigMap", api_version="v1", limit=2)
    steps = 0
    while (committed := relist.step(db)) is None:
        steps += 1
        assert objects(db) == {f"o{i}": str(1 + i) for i in range(7)}
        assert shape(db) == ("10", 1, "10")
    assert steps == 2 + 4  # changes: a full page, an empty one; the rest: 7 old rows / 2
    assert objects(db) == {"o0": "1", "o1": "30", "o2": "3", "o4": "5", "o6": "7", "n": "31"}
    assert [e[1:4] for e in events(db)][1:] == [
        ("MODIFIED", "30", "o1"),
        ("ADDED", "31", "n"),
        ("DELETED", "40", "o3"),
        ("DELETED", "40", "o5"),
        ("BOOKMARK", "40", ""),
    ]
    assert committed.count == 5 and committed.last_seq == 6
    assert [r.seq for r in committed.records] == [2, 3, 4, 5, 6]
    assert garbage(db) == [(1, "objects"), (2, "staging")]
    collect(db)
    assert db.execute("SELECT count(*) FROM objects").fetchone()[0] == 6
    assert db.execute("SELECT count(*) FROM staging").fetchone()[0] == 0


def test_a_dropped_shape_leaves_garbage_only(db: sqlite3.Connection) -> None:
    fill(db, [cm("x", 5)], "10")
    writing.begin_list(db, shape_id=1)
    writing.stage(db, shape_id=1, objects=[cm("y", 6)])
    writing.discard_shape(db, shape_id=1)
    assert garbage(db) == [(1, "objects"), (2, "objects"), (2, "staging")]
    collect(db)
    for table in ("objects", "staging", "events", "shapes"):
        assert db.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0


def test_lists_left_unfinished_by_a_crash_are_given_up_at_start(db: sqlite3.Connection) -> None:
    fill(db, [cm("x", 5)], "10")
    writing.begin_list(db, shape_id=1)
    writing.stage(db, shape_id=1, objects=[cm("y", 6)])
    writing.Relist(shape_id=1, rv="20", kind="ConfigMap", api_version="v1").step(db)
    writing.abandon_lists(db)
    assert db.execute("SELECT gen, next_gen FROM shapes").fetchall() == [(1, None)]
    assert garbage(db) == [(2, "objects"), (2, "staging")]
    assert writing.new_generation(db) == 3  # never a number rows still carry
    # The relist's log entries are left past last_seq, where no reader looks, and the shape
    # says so; they are deleted before its next append.
    assert [e[0] for e in events(db)] == [1, 2]
    assert reading.events_after(db, shape_id=1, after=0, limit=10, last_seq=1)[-1].seq == 1
    (row,) = writing.open_shapes(db)
    assert row[-1] == 1
    assert writing.drop_unpublished(db, shape_id=1, limit=1)  # a full slice: maybe more
    assert not writing.drop_unpublished(db, shape_id=1, limit=1)
    assert [e[0] for e in events(db)] == [1]
    (row,) = writing.open_shapes(db)
    assert row[-1] == 0


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
    trimmed = writing.trim(db, shape_id=1, max_events=4, max_age=3600, max_bytes=1 << 30)
    assert (trimmed.dropped, trimmed.reason, trimmed.log_start_rv) == (7, "count", "16")
    assert shape(db)[2] == "16"  # the log holds every change after RV 16
    assert [e[2] for e in events(db)] == ["17", "18", "19", "20"]


def test_trim_never_splits_a_relist_batch(db: sqlite3.Connection) -> None:
    fill(db, [cm("a", 1), cm("b", 2), cm("c", 3)], "10")
    fill(db, [], "50")  # three DELETED at 50 plus the bookmark at 50
    writing.apply_changes(db, shape_id=1, changes=[cm("d", 51)])
    writing.trim(db, shape_id=1, max_events=3, max_age=3600, max_bytes=1 << 30)
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
    writing.begin_list(db, shape_id=1)
    writing.stage(db, shape_id=1, objects=[cm("same", 5), cm("changed", 20), recreated])
    staged = {
        name: len(raw) for name, raw in db.execute("SELECT name, raw FROM staging ORDER BY name")
    }
    assert staged["same"] == 0 and staged["changed"] > 0 and staged["recreated"] > 0
    finish(db, "40")
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


def version_3(connection: sqlite3.Connection) -> None:
    """Turn a new database back into schema version 3 (no ``log_bytes``)."""
    connection.execute("ALTER TABLE shapes DROP COLUMN log_bytes")
    connection.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")


def version_2(connection: sqlite3.Connection) -> None:
    """Turn a new database back into schema version 2 (no generations)."""
    version_3(connection)
    connection.execute("ALTER TABLE shapes DROP COLUMN gen")
    connection.execute("ALTER TABLE shapes DROP COLUMN next_gen")
    connection.execute("ALTER TABLE objects RENAME COLUMN gen TO shape_id")
    connection.execute("ALTER TABLE staging RENAME COLUMN gen TO shape_id")
    connection.execute("DROP TABLE garbage")
    connection.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")


def test_a_version_1_database_is_migrated_in_place() -> None:
    connection = sqlite3.connect(":memory:")
    schema.migrate(connection)
    version_2(connection)
    connection.execute("ALTER TABLE shapes DROP COLUMN encoding")
    connection.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    connection.execute(
        "INSERT INTO shapes (id, key, grp, version, resource, namespace, label_selector, "
        "field_selector, configured, created_at, used_at) "
        "VALUES (1, 'v1/configmaps', '', 'v1', 'configmaps', '', '', '', 1, 0, 0)"
    )
    connection.commit()
    schema.migrate(connection)
    assert connection.execute("SELECT encoding, gen FROM shapes").fetchall() == [("json", 1)]
    assert connection.execute("SELECT value FROM meta").fetchone() == ("4",)


def test_a_version_2_database_keeps_its_objects_as_their_first_generation() -> None:
    connection = sqlite3.connect(":memory:")
    schema.migrate(connection)
    connection.execute(
        "INSERT INTO shapes (id, key, grp, version, resource, namespace, label_selector, "
        "field_selector, configured, created_at, used_at, gen) "
        "VALUES (7, 'v1/configmaps', '', 'v1', 'configmaps', '', '', '', 1, 0, 0, 7)"
    )
    connection.commit()
    fill(connection, [cm("x", 5)], "10", shape_id=7)
    version_2(connection)
    connection.execute(
        "INSERT INTO staging VALUES (7, 'a', 'left-over', 'u', '9', 9, x'7b7d', x'7b7d')"
    )
    connection.commit()
    schema.migrate(connection)
    assert connection.execute("SELECT gen, next_gen FROM shapes").fetchall() == [(7, None)]
    assert connection.execute("SELECT gen, name FROM objects").fetchall() == [(7, "x")]
    assert connection.execute("SELECT count(*) FROM staging").fetchone() == (0,)
    assert connection.execute("SELECT value FROM meta").fetchone() == ("4",)


def test_maintenance_queries_use_an_index(db: sqlite3.Connection) -> None:
    """Found by review: retention by age and the per-shape object count scanned every row
    (bodies included) every minute. The plans of the statements they really run."""
    fill(db, [], "10")
    statements: list[str] = []
    db.set_trace_callback(statements.append)
    writing.trim(db, shape_id=1, max_events=1000, max_age=60, max_bytes=1 << 30)
    db.set_trace_callback(None)
    aged = next(s for s in statements if "at <" in s)
    plans = {
        "events_by_time": aged,
        "objects_by_shape": "SELECT count(*) FROM objects WHERE gen = 1",
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


def test_a_relist_copies_each_page_of_unchanged_objects_by_its_keys(
    db: sqlite3.Connection,
) -> None:
    """Found measuring a relist of 1,000,000 objects: the copy of a page's unchanged rows
    was driven from staging bounded by the namespace alone, so in one namespace every page
    walked the whole staged collection (minutes at 100 % CPU)."""
    fill(db, [cm("a", 1), cm("b", 2)], "10")
    statements: list[str] = []
    db.set_trace_callback(statements.append)
    fill(db, [cm("a", 1), cm("c", 12)], "20")
    db.set_trace_callback(None)
    copy = next(s for s in statements if s.startswith("INSERT INTO objects") and "JOIN" in s)
    plan = [row[-1] for row in db.execute(f"EXPLAIN QUERY PLAN {copy}")]
    assert plan[0].startswith("SEARCH o USING PRIMARY KEY"), plan
    assert "(namespace,name)>(?,?) AND (namespace,name)<(?,?)" in plan[0], plan
    assert [row[0] for row in db.execute("SELECT name FROM objects WHERE gen = 2")] == ["a", "c"]
