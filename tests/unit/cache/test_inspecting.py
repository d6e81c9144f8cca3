"""Reading a database without changing it: the shapes, their contents and the files."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from proxy.cache import schema
from proxy.cache.appending import apply_changes
from proxy.cache.inspecting import (
    InspectError,
    database_files,
    open_read_only,
    shape_contents,
    stored_shapes,
)
from proxy.cache.records import Change, ChangeType
from proxy.cache.shapes import Encoding


def test_contents_of_a_shape(db: sqlite3.Connection) -> None:
    db.execute("UPDATE shapes SET rv = '10', log_start_rv = '10', listed_at = 100.0")
    db.commit()
    apply_changes(
        db,
        shape_id=1,
        changes=[
            Change(type=ChangeType.ADDED, rv="11", namespace="ns", name="a", raw=b'{"a":1}'),
            Change(type=ChangeType.ADDED, rv="12", namespace="ns", name="b", raw=b'{"b":22}'),
            Change(type=ChangeType.BOOKMARK, rv="13"),
        ],
    )
    (shape,) = stored_shapes(db)
    assert shape.key.identity == "v1/configmaps" and shape.key.encoding is Encoding.JSON
    contents = shape_contents(db, shape)
    assert contents.objects == 2
    assert contents.object_bytes == len(b'{"a":1}') + len(b'{"b":22}')
    assert contents.events == 3
    assert contents.oldest is not None and contents.oldest.rv == "11"
    assert contents.newest is not None and contents.newest.rv == "13"
    assert contents.last_commit is not None and contents.last_commit > 100.0


def test_an_empty_unfilled_shape(db: sqlite3.Connection) -> None:
    (shape,) = stored_shapes(db)
    contents = shape_contents(db, shape)
    assert shape.rv is None
    assert (contents.objects, contents.events, contents.oldest, contents.last_commit) == (
        0,
        0,
        None,
        None,
    )


def test_open_read_only_never_writes(tmp_path: Path) -> None:
    path = tmp_path / "cache.db"
    writer = sqlite3.connect(path)
    schema.configure(writer, synchronous="NORMAL", cache_kib=1024)
    schema.migrate(writer)
    writer.close()
    reader = open_read_only(path)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        reader.execute("DELETE FROM meta")
    files = database_files(reader, path)
    assert files.schema_version == schema.SCHEMA_VERSION
    assert files.db_bytes == path.stat().st_size and files.page_size == schema.PAGE_SIZE


def test_files_that_are_not_readable_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InspectError, match="no such"):
        open_read_only(tmp_path / "absent.db")
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(InspectError, match="not a warmwatch database"):
        open_read_only(other)
    newer = tmp_path / "newer.db"
    connection = sqlite3.connect(newer)
    schema.migrate(connection)
    connection.execute("UPDATE meta SET value = '99'")
    connection.commit()
    connection.close()
    with pytest.raises(InspectError, match="schema version 99"):
        open_read_only(newer)
