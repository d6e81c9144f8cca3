"""Watch events applied to a shape (``appending``) on an in-memory database: no sockets,
no event loop."""

from __future__ import annotations

import sqlite3

from proxy.cache import appending
from proxy.cache.records import Change, ChangeType
from tests.unit.cache.conftest import cm, events, fill, objects, shape


def test_changes_update_objects_events_and_rv_together(db: sqlite3.Connection) -> None:
    fill(db, [cm("x", 5)], "10")
    moved = Change(**{**_fields(cm("x", 11, labels={"app": "b"})), "type": ChangeType.MODIFIED})
    gone = Change(**{**_fields(cm("x", 12, labels={"app": "b"})), "type": ChangeType.DELETED})
    committed = appending.apply_changes(db, shape_id=1, changes=[cm("y", 11), moved, gone])
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
