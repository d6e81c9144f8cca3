"""The in-memory database the cache's transaction tests share."""

from __future__ import annotations

import sqlite3

import pytest

from proxy.cache import schema


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
