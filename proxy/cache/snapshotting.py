"""A consistent copy of the cache for a peer, and its checks before it is installed
(docs/design.md §3, peer seeding).

- :func:`copy_into`: ``VACUUM INTO`` an empty file: one read transaction's state of every
  table, compacted (no free pages, no WAL), in one file (on a reader connection: writers go
  on meanwhile).
- :func:`check_snapshot`: what a received file must pass before it may become the database:
  SQLite's ``quick_check``, this build's schema version, and the cluster identity it was
  made in (:data:`CLUSTER_KEY`) equal to the apiserver's now. Raises
  :class:`SnapshotRejected` with the reason.
- :func:`cluster_identity` / :func:`record_cluster_identity`: the ``kube-system`` namespace
  UID in ``meta``, recorded at first contact with the apiserver; a database without one is
  never offered to a peer (it cannot be told apart from another cluster's).
- :func:`install`: the checked file becomes the database by one rename; nothing else is ever
  left where the database goes.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from proxy.cache import schema

CLUSTER_KEY: Final = "cluster_uid"
"""``meta`` key of the ``kube-system`` namespace's UID: a cluster's identity (it lives as long
as the cluster; another cluster, or a rebuilt one, has another)."""


class SnapshotRejected(Exception):
    """A received snapshot that must not be installed (the reason is the message)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Summary:
    """What a checked snapshot holds: its shapes, and the objects they serve."""

    shapes: int
    objects: int


def copy_into(connection: sqlite3.Connection, *, target: Path) -> None:
    """Write a consistent copy of the database to ``target``, which must not exist or be
    empty (create it empty first with the database's private mode). Outside a transaction
    (autocommit): ``VACUUM INTO`` reads in its own."""
    connection.execute("VACUUM INTO ?", (str(target),))


def cluster_identity(connection: sqlite3.Connection) -> str | None:
    row = connection.execute("SELECT value FROM meta WHERE key = ?", (CLUSTER_KEY,)).fetchone()
    return str(row[0]) if row else None


def record_cluster_identity(connection: sqlite3.Connection, *, uid: str) -> str | None:
    """Record ``uid`` as the cluster's identity; return the one recorded before (None when
    none was). A changed one is replaced: the database follows the cluster it is fed by."""
    before = cluster_identity(connection)
    if before != uid:
        with connection:
            connection.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (CLUSTER_KEY, uid)
            )
    return before


def check_snapshot(path: Path, *, cluster_uid: str) -> Summary:
    """Raise :class:`SnapshotRejected` unless the file at ``path`` is a sound database of this
    build's schema, made in the cluster whose identity is ``cluster_uid``; else what it holds.
    Opens it read-only (nothing is written to it or beside it)."""
    try:
        connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as error:
        raise SnapshotRejected(f"not a database: {error}") from error
    try:
        problem = schema.integrity_problem(connection)
        if problem is not None:
            raise SnapshotRejected(f"integrity check failed: {problem}")
        schema.check_version(connection)
        theirs = cluster_identity(connection)
        shapes, objects = connection.execute(
            "SELECT (SELECT count(*) FROM shapes WHERE rv IS NOT NULL), "
            "(SELECT count(*) FROM objects JOIN shapes ON objects.gen = shapes.gen)"
        ).fetchone()
    except (sqlite3.Error, schema.SchemaError) as error:
        raise SnapshotRejected(str(error)) from error
    finally:
        connection.close()
    if theirs != cluster_uid:
        raise SnapshotRejected(
            f"made in another cluster (kube-system uid {theirs}, this apiserver's {cluster_uid})"
        )
    return Summary(shapes=shapes, objects=objects)


def install(source: Path, *, database: Path) -> None:
    """Make the checked snapshot at ``source`` the database at ``database`` (same directory):
    a new database's leftovers (an empty file, a WAL or shared-memory file) go first, then
    one atomic rename."""
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{database}{suffix}")
    os.replace(source, database)


def is_new(database: Path) -> bool:
    """No database yet, or an empty file without a WAL of content (what a start that never
    wrote leaves): the only ones a snapshot may replace."""
    for suffix in ("", "-wal"):
        with contextlib.suppress(FileNotFoundError):
            if os.path.getsize(f"{database}{suffix}") > 0:
                return False
    return True
