"""The reader's queries on an in-memory database: where a watch resumes in the log, and
reading the log after a position (no sockets, no event loop)."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from proxy.cache import appending, maintaining, reading, schema
from proxy.cache.reading import LogTrimmed, TooNew
from proxy.cache.records import Change, ChangeType
from proxy.kube.status import StatusError
from tests.unit.cache.conftest import cm, fill


def log(connection: sqlite3.Connection) -> list[tuple[int, str, str]]:
    return list(connection.execute("SELECT seq, type, rv FROM events ORDER BY seq"))


@pytest.fixture
def history(db: sqlite3.Connection) -> sqlite3.Connection:
    """Filled at 10; events at 11, 12; a relist at 20 (MODIFIED a@15, DELETED b@20);
    then 21 and a bookmark at 25."""
    fill(db, [cm("a", 1), cm("b", 2)], "10")
    appending.apply_changes(db, shape_id=1, changes=[cm("c", 11), cm("d", 12)])
    fill(db, [cm("a", 15), cm("c", 11), cm("d", 12)], "20")
    appending.apply_changes(
        db, shape_id=1, changes=[cm("e", 21), Change(type=ChangeType.BOOKMARK, rv="25")]
    )
    return db


def at(connection: sqlite3.Connection, rv: str) -> int:
    return reading.position(connection, shape_id=1, rv=rv)


def test_the_log_as_built(history: sqlite3.Connection) -> None:
    assert log(history) == [
        (1, "BOOKMARK", "10"),
        (2, "ADDED", "11"),
        (3, "ADDED", "12"),
        (4, "MODIFIED", "15"),
        (5, "DELETED", "20"),
        (6, "BOOKMARK", "20"),
        (7, "ADDED", "21"),
        (8, "BOOKMARK", "25"),
    ]


@pytest.mark.parametrize(
    ("rv", "after"),
    [
        ("10", 1),  # the list RV: everything after the fill
        ("11", 2),  # an event's RV: right after it
        ("13", 3),  # between events: after the last one at or below it
        ("15", 4),  # a relist's MODIFIED: right after it, like any event
        ("20", 4),  # the relist RV: its DELETEDs (stamped with it) again, then on: no gap
        ("21", 7),
        ("25", 8),  # a bookmark's RV is a position too
    ],
)
def test_where_a_watch_resumes(history: sqlite3.Connection, rv: str, after: int) -> None:
    assert at(history, rv) == after


def test_too_old_and_too_new(history: sqlite3.Connection) -> None:
    with pytest.raises(StatusError) as old:
        at(history, "9")
    assert old.value.code == 410
    with pytest.raises(TooNew):
        at(history, "26")


def test_resource_versions_that_are_not_integers_are_positions(db: sqlite3.Connection) -> None:
    fill(db, [], "x1")
    added = Change(type=ChangeType.ADDED, rv="x2", namespace="a", name="a", raw=b"{}")
    appending.apply_changes(db, shape_id=1, changes=[added])
    assert at(db, "x1") == 1 and at(db, "x2") == 2
    with pytest.raises(StatusError):
        at(db, "x0")


def test_events_after_and_a_trimmed_tail(history: sqlite3.Connection) -> None:
    records = reading.events_after(history, shape_id=1, after=5, limit=2, last_seq=8)
    assert [(r.seq, r.type.value) for r in records] == [(6, "BOOKMARK"), (7, "ADDED")]
    assert reading.events_after(history, shape_id=1, after=8, limit=5, last_seq=8) == []
    maintaining.trim(history, shape_id=1, max_events=1, max_age=3600, max_bytes=1 << 30)
    with pytest.raises(LogTrimmed):  # entries 3.. are gone: not "nothing new"
        reading.events_after(history, shape_id=1, after=2, limit=5, last_seq=8)


# ------------------------------------------------------------------------------ snapshots


def pages(
    connection: sqlite3.Connection, *, namespace: str | None, limit: int, heads: bool = False
) -> list[list[tuple[str, str]]]:
    """Every page of the shape's objects, as the store's Snapshot reads them."""
    read = reading.object_heads if heads else reading.object_rows
    found, after = [], None
    while True:
        page = read(connection, gen=1, namespace=namespace, after=after, limit=limit)
        if page:
            found.append([(row[0], row[1]) for row in page])
        if len(page) < limit:
            return found
        after = (page[-1][0], page[-1][1])


def test_a_snapshot_pages_by_key(db: sqlite3.Connection) -> None:
    assert reading.begin_snapshot(db, shape_id=1) is None  # not filled: nothing to read
    assert not db.in_transaction
    changes = [cm(f"o{i}", 10 + i, ns=ns) for i in range(3) for ns in ("b", "a", "c")]
    fill(db, changes, "50")
    head = reading.begin_snapshot(db, shape_id=1)
    assert head == reading.SnapshotHead(
        rv="50", last_seq=1, kind="ConfigMap", api_version="v1", gen=1
    )
    assert pages(db, namespace=None, limit=4) == [
        [("a", "o0"), ("a", "o1"), ("a", "o2"), ("b", "o0")],
        [("b", "o1"), ("b", "o2"), ("c", "o0"), ("c", "o1")],
        [("c", "o2")],
    ]
    assert pages(db, namespace="b", limit=3) == [[("b", "o0"), ("b", "o1"), ("b", "o2")]]
    assert pages(db, namespace="z", limit=3) == []
    reading.end_snapshot(db)
    assert not db.in_transaction


def test_a_namespaces_pages_are_each_one_seek(db: sqlite3.Connection) -> None:
    """Found with 500,000 objects: bounded by the row value as well as the namespace, each
    page of one namespace scanned and sorted every row before its bound (a filtered LIST took
    minutes). The page's plan must seek, not sort."""
    fill(db, [cm(f"o{i:03d}", 10 + i, ns=ns) for i in range(30) for ns in ("a", "b")], "99")
    assert [len(p) for p in pages(db, namespace="b", limit=7)] == [7, 7, 7, 7, 2]
    assert pages(db, namespace="b", limit=7)[1][0] == ("b", "o007")
    traced: list[str] = []  # the statement as run, its parameters filled in
    db.set_trace_callback(traced.append)
    reading.object_rows(db, gen=1, namespace="b", after=("b", "o010"), limit=7)
    db.set_trace_callback(None)
    plan = " ".join(str(row[-1]) for row in db.execute(f"EXPLAIN QUERY PLAN {traced[-1]}"))
    assert "TEMP B-TREE" not in plan and "name>?" in plan, plan


def test_heads_size_the_rows_they_stand_for(db: sqlite3.Connection) -> None:
    fill(db, [cm("x", 5, labels={"app": "y"}), cm("y", 6)], "10")
    rows = reading.object_rows(db, gen=1, namespace=None, after=None, limit=10)
    heads = reading.object_heads(db, gen=1, namespace=None, after=None, limit=10)
    assert [h[:3] for h in heads] == [r[:3] for r in rows]
    assert [(h[3], h[4]) for h in heads] == [
        (len(r[3]), bytes(r[3][: reading.HEAD_BYTES])) for r in rows
    ]


def test_a_snapshot_keeps_its_state_while_the_writer_commits(tmp_path: Path) -> None:
    """Pages read after a commit still show the snapshot's state (WAL: one read transaction)."""
    path = tmp_path / "cache.db"
    writer = sqlite3.connect(path)
    writer.execute("PRAGMA journal_mode=WAL")
    schema.migrate(writer)
    writer.execute(
        "INSERT INTO shapes (id, key, grp, version, resource, namespace, label_selector, "
        "field_selector, configured, created_at, used_at, gen) "
        "VALUES (1, 'v1/configmaps', '', 'v1', 'configmaps', '', '', '', 1, 0, 0, 1)"
    )
    writer.commit()
    fill(writer, [cm(f"o{i}", 10 + i) for i in range(4)], "20")
    reader = sqlite3.connect(path, isolation_level=None)
    head = reading.begin_snapshot(reader, shape_id=1)
    assert head is not None and head.rv == "20"
    first = reading.object_rows(reader, gen=1, namespace=None, after=None, limit=2)
    appending.apply_changes(
        writer,
        shape_id=1,
        changes=[cm("o3", 30), replace(cm("o1", 31), type=ChangeType.DELETED), cm("n", 32)],
    )
    rest = reading.object_rows(reader, gen=1, namespace=None, after=("a", "o1"), limit=10)
    assert [(r[1]) for r in first + rest] == ["o0", "o1", "o2", "o3"]
    reading.end_snapshot(reader)
    after = reading.object_rows(reader, gen=1, namespace=None, after=None, limit=10)
    assert [r[1] for r in after] == ["n", "o0", "o2", "o3"]


def test_single_reads(db: sqlite3.Connection) -> None:
    fill(db, [cm("x", 5), cm("y", 6, ns="b")], "10")
    raw = reading.get_object(db, shape_id=1, namespace="a", name="x")
    assert raw is not None and b'"resourceVersion":"5"' in raw
    assert reading.get_object(db, shape_id=1, namespace="a", name="y") is None
    keys = [("a", "x"), ("b", "y"), ("a", "nope")] + [("z", f"n{i}") for i in range(900)]
    assert reading.present(db, shape_id=1, keys=keys) == (("a", "x"), ("b", "y"))
    assert reading.object_counts(db) == {1: 2}
    assert reading.get_document(db, key="/apis?|") is None
    assert reading.document_sizes(db) == []


def test_objects_looked_up_by_key_are_each_one_seek(db: sqlite3.Connection) -> None:
    """Found relisting 500,000 objects into a cache of 1,000,000: looked up as ``(namespace,
    name) IN (VALUES ...)``, every chunk of keys scanned the whole generation (760 objects/s).
    The plan must seek each key by the primary key, and scan nothing but the keys."""
    fill(db, [cm(f"o{i}", 10 + i) for i in range(20)], "99")
    keys = [("a", "o3"), ("a", "o7"), ("a", "none")]
    traced: list[str] = []
    db.set_trace_callback(traced.append)
    rows = reading.rows_for_keys(db, columns=("name", "rv"), gen="?", param=1, keys=keys)
    db.set_trace_callback(None)
    assert sorted(rows) == [("o3", "13"), ("o7", "17")]
    plan = " ".join(str(row[-1]) for row in db.execute(f"EXPLAIN QUERY PLAN {traced[-1]}"))
    assert "SEARCH o USING" in plan and "(gen=? AND namespace=? AND name=?)" in plan, plan
    assert "SCAN o" not in plan, plan
