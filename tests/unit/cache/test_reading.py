"""The reader's queries on an in-memory database: where a watch resumes in the log, and
reading the log after a position (no sockets, no event loop)."""

from __future__ import annotations

import sqlite3

import pytest

from proxy.cache import reading, writing
from proxy.cache.reading import LogTrimmed, TooNew
from proxy.cache.records import Change, ChangeType
from proxy.kube.status import StatusError
from tests.unit.cache.test_writing import cm, fill


def log(connection: sqlite3.Connection) -> list[tuple[int, str, str]]:
    return list(connection.execute("SELECT seq, type, rv FROM events ORDER BY seq"))


@pytest.fixture
def history(db: sqlite3.Connection) -> sqlite3.Connection:
    """Filled at 10; events at 11, 12; a relist at 20 (MODIFIED a@15, DELETED b@20);
    then 21 and a bookmark at 25."""
    fill(db, [cm("a", 1), cm("b", 2)], "10")
    writing.apply_changes(db, shape_id=1, changes=[cm("c", 11), cm("d", 12)])
    fill(db, [cm("a", 15), cm("c", 11), cm("d", 12)], "20")
    writing.apply_changes(
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
    writing.apply_changes(db, shape_id=1, changes=[added])
    assert at(db, "x1") == 1 and at(db, "x2") == 2
    with pytest.raises(StatusError):
        at(db, "x0")


def test_events_after_and_a_trimmed_tail(history: sqlite3.Connection) -> None:
    records = reading.events_after(history, shape_id=1, after=5, limit=2, last_seq=8)
    assert [(r.seq, r.type.value) for r in records] == [(6, "BOOKMARK"), (7, "ADDED")]
    assert reading.events_after(history, shape_id=1, after=8, limit=5, last_seq=8) == []
    writing.trim(history, shape_id=1, max_events=1, max_age=3600)
    with pytest.raises(LogTrimmed):  # entries 3.. are gone: not "nothing new"
        reading.events_after(history, shape_id=1, after=2, limit=5, last_seq=8)
