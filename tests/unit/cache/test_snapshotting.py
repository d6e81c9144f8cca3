"""Snapshots for peer seeding, on files: a copy passes its checks and installs; a truncated
file, a broken page, another cluster's identity, none, or a newer schema are rejected."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from proxy.cache import schema, snapshotting
from proxy.cache.store import keep_private
from tests.unit.cache.conftest import cm, fill

CLUSTER = "0f5e1c9a-kube-system"


def database(path: Path, *, objects: int = 300, cluster: str | None = CLUSTER) -> Path:
    """A warm database file: one filled shape, and the cluster's identity when given."""
    connection = sqlite3.connect(path)
    schema.configure(connection, synchronous="NORMAL", cache_kib=1024)
    schema.migrate(connection)
    connection.execute(
        "INSERT INTO shapes (id, key, grp, version, resource, namespace, label_selector, "
        "field_selector, configured, created_at, used_at, gen) "
        "VALUES (1, 'v1/configmaps', '', 'v1', 'configmaps', '', '', '', 1, 0, 0, 1)"
    )
    connection.commit()
    fill(connection, [cm(f"cm-{i}", i + 1) for i in range(objects)], str(objects + 1))
    if cluster is not None:
        snapshotting.record_cluster_identity(connection, uid=cluster)
    connection.close()
    return path


def snapshot_of(source: Path, target: Path) -> Path:
    """``copy_into`` on a reader connection (autocommit), as the store runs it."""
    keep_private(target)
    reader = sqlite3.connect(source, isolation_level=None)
    try:
        snapshotting.copy_into(reader, target=target)
    finally:
        reader.close()
    return target


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    return snapshot_of(database(tmp_path / "warm.db"), tmp_path / "snapshot.db")


def test_a_copy_passes_its_checks_and_says_what_it_holds(snapshot: Path) -> None:
    assert snapshotting.check_snapshot(snapshot, cluster_uid=CLUSTER) == snapshotting.Summary(
        shapes=1, objects=300
    )
    assert snapshot.stat().st_mode & 0o077 == 0  # private, like the database


def test_the_copy_is_consistent_while_the_writer_goes_on(tmp_path: Path) -> None:
    source = database(tmp_path / "warm.db")
    writer = sqlite3.connect(source)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("DELETE FROM objects")  # not committed: the copy does not see it
    copy = snapshot_of(source, tmp_path / "snapshot.db")
    writer.rollback()
    writer.close()
    assert snapshotting.check_snapshot(copy, cluster_uid=CLUSTER).objects == 300


def test_a_truncated_file_is_rejected(snapshot: Path) -> None:
    snapshot.write_bytes(snapshot.read_bytes()[: snapshot.stat().st_size // 2])
    with pytest.raises(snapshotting.SnapshotRejected, match="malformed"):
        snapshotting.check_snapshot(snapshot, cluster_uid=CLUSTER)


@pytest.mark.parametrize("offset", [0, 5], ids=["page-type", "free-space"])
def test_a_broken_page_is_rejected(snapshot: Path, offset: int) -> None:
    """A flipped byte of a page's header (a flipped byte of an object's content is no
    structural fault: the sender's SHA-256 catches that in transit)."""
    data = bytearray(snapshot.read_bytes())
    data[3 * schema.PAGE_SIZE + offset] ^= 0xFF
    snapshot.write_bytes(bytes(data))
    with pytest.raises(snapshotting.SnapshotRejected):
        snapshotting.check_snapshot(snapshot, cluster_uid=CLUSTER)


def test_another_clusters_snapshot_is_rejected(snapshot: Path) -> None:
    with pytest.raises(snapshotting.SnapshotRejected, match="another cluster"):
        snapshotting.check_snapshot(snapshot, cluster_uid="another-kube-system")


def test_a_snapshot_without_a_cluster_identity_is_rejected(tmp_path: Path) -> None:
    copy = snapshot_of(database(tmp_path / "warm.db", cluster=None), tmp_path / "s.db")
    with pytest.raises(snapshotting.SnapshotRejected, match="another cluster"):
        snapshotting.check_snapshot(copy, cluster_uid=CLUSTER)


def test_a_newer_schema_is_rejected(snapshot: Path) -> None:
    connection = sqlite3.connect(snapshot)
    with connection:
        connection.execute(
            "UPDATE meta SET value = ? WHERE key = 'schema_version'",
            (str(schema.SCHEMA_VERSION + 1),),
        )
    connection.close()
    with pytest.raises(snapshotting.SnapshotRejected, match="schema version"):
        snapshotting.check_snapshot(snapshot, cluster_uid=CLUSTER)


def test_something_else_is_rejected(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.write_bytes(b"<html>502 Bad Gateway</html>" * 100)
    with pytest.raises(snapshotting.SnapshotRejected):
        snapshotting.check_snapshot(other, cluster_uid=CLUSTER)


def test_install_replaces_a_new_database_and_its_leftovers(snapshot: Path, tmp_path: Path) -> None:
    target = tmp_path / "new.db"
    keep_private(target)  # what a start that never wrote leaves
    Path(f"{target}-shm").write_bytes(b"")
    assert snapshotting.is_new(target)
    snapshotting.install(snapshot, database=target)
    assert not snapshot.exists() and not Path(f"{target}-shm").exists()
    assert not snapshotting.is_new(target)
    assert snapshotting.check_snapshot(target, cluster_uid=CLUSTER).objects == 300


def test_only_a_new_database_is_new(tmp_path: Path) -> None:
    assert snapshotting.is_new(tmp_path / "absent.db")
    assert not snapshotting.is_new(database(tmp_path / "warm.db"))
    empty_with_wal = tmp_path / "w.db"
    empty_with_wal.write_bytes(b"")
    Path(f"{empty_with_wal}-wal").write_bytes(b"x" * 100)
    assert not snapshotting.is_new(empty_with_wal)


def test_the_cluster_identity_is_recorded_and_follows_the_cluster() -> None:
    connection = sqlite3.connect(":memory:")
    schema.migrate(connection)
    assert snapshotting.cluster_identity(connection) is None
    assert snapshotting.record_cluster_identity(connection, uid="a") is None
    assert snapshotting.record_cluster_identity(connection, uid="a") == "a"
    assert snapshotting.record_cluster_identity(connection, uid="b") == "a"
    assert snapshotting.cluster_identity(connection) == "b"
