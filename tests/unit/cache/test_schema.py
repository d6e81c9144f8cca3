"""The database's schema: foreign and unknown files refused, older versions migrated in
place."""

from __future__ import annotations

import sqlite3

import pytest

from proxy.cache import schema
from tests.unit.cache.conftest import cm, fill


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
