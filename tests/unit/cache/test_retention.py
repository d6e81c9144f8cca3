"""Retention of the event log by bytes (``shapes.log_bytes``, ``maintaining.trim``, the store's
trim after a commit), and the maintenance pass beside shapes being dropped.

Found by a probe against the real apiserver: 150 updates of an 878 KiB ConfigMap grew the
database by 141 MiB, retention being by count and age only.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from proxy.cache import appending, maintaining, reading, registering, relisting, schema, writing
from proxy.cache.records import Change, ChangeType
from proxy.cache.shapes import Shape, ShapeKey
from proxy.cache.store import Store, StoreSettings
from proxy.kube.resources import GroupVersionResource
from proxy.kube.status import StatusError
from proxy.metrics import Metrics
from tests.unit.cache.conftest import cm, fill

CM = GroupVersionResource.parse("v1/configmaps")
KIB = 1024


def big(name: str, rv: int, *, size: int = 100 * KIB, labels: bytes = b"{}") -> Change:
    """A change whose log entry counts ``size`` bytes when the object is cached already with
    no labels: its object, its labels and the previous labels (``{}`` each)."""
    return Change(
        type=ChangeType.MODIFIED,
        rv=str(rv),
        namespace="a",
        name=name,
        uid=f"uid-{name}",
        labels=labels,
        raw=b"{" + b"x" * (size - 6) + b"}",
    )


def summed(db: sqlite3.Connection, shape_id: int = 1) -> int:
    """What the log really holds, summed row by row (``shapes.log_bytes`` must equal it)."""
    (total,) = db.execute(
        f"SELECT coalesce(sum({schema.EVENT_BYTES}), 0) FROM events WHERE shape_id = ?",
        (shape_id,),
    ).fetchone()
    return int(total)


def log_bytes(db: sqlite3.Connection, shape_id: int = 1) -> int:
    (value,) = db.execute("SELECT log_bytes FROM shapes WHERE id = ?", (shape_id,)).fetchone()
    return int(value)


# -- shapes.log_bytes ------------------------------------------------------------------------


def test_the_log_bytes_follow_every_append_and_delete(db: sqlite3.Connection) -> None:
    """Appends (watch commits, a relist's steps and its bookmark), an abandoned relist's
    entries deleted, a trim: the column is the sum of its rows after each."""
    fill(db, [cm("a", 1), cm("b", 2)], "10")
    assert log_bytes(db) == summed(db) == 0  # a bookmark holds no object
    committed = appending.apply_changes(
        db, shape_id=1, changes=[big("a", 11), big("a", 12, labels=b'{"k":"v"}')]
    )
    assert committed.log_bytes == log_bytes(db) == summed(db) > 200 * KIB
    fill(db, [cm("a", 15), cm("c", 16)], "20")  # MODIFIED a, ADDED c, DELETED b: a relist
    assert log_bytes(db) == summed(db)
    relisting.begin_list(db, shape_id=1)  # a relist that is abandoned after one step
    relisting.stage(db, shape_id=1, objects=[big("d", 30)])
    relisting.Relist(shape_id=1, rv="30", kind="ConfigMap", api_version="v1").step(db)
    assert log_bytes(db) == summed(db) > committed.log_bytes  # counted, unpublished
    while relisting.drop_unpublished(db, shape_id=1, limit=1):
        pass
    assert log_bytes(db) == summed(db)
    maintaining.trim(db, shape_id=1, max_events=2, max_age=3600, max_bytes=1 << 30)
    assert log_bytes(db) == summed(db)


def test_a_version_3_database_gets_the_log_bytes_of_its_logs(db: sqlite3.Connection) -> None:
    fill(db, [], "10")
    appending.apply_changes(db, shape_id=1, changes=[big("a", 11), big("b", 12)])
    expected = summed(db)
    db.execute("ALTER TABLE shapes DROP COLUMN log_bytes")
    db.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    db.commit()
    schema.migrate(db)
    assert log_bytes(db) == expected > 199 * KIB
    assert db.execute("SELECT value FROM meta").fetchone() == (str(schema.SCHEMA_VERSION),)


# -- maintaining.trim by bytes -------------------------------------------------------------------


def test_a_log_over_its_bytes_is_cut_oldest_first(db: sqlite3.Connection) -> None:
    fill(db, [cm("a", 1)], "10")
    appending.apply_changes(db, shape_id=1, changes=[big("a", rv) for rv in range(11, 31)])
    assert summed(db) == 20 * 100 * KIB
    kept = maintaining.trim(db, shape_id=1, max_events=1000, max_age=3600, max_bytes=2000 * KIB)
    assert (kept.dropped, kept.reason) == (0, None)  # at the bound, not over it
    trimmed = maintaining.trim(db, shape_id=1, max_events=1000, max_age=3600, max_bytes=1000 * KIB)
    assert (trimmed.dropped, trimmed.reason, trimmed.log_start_rv) == (11, "bytes", "20")
    assert trimmed.log_bytes == log_bytes(db) == summed(db) == 10 * 100 * KIB
    assert [rv for (rv,) in db.execute("SELECT rv FROM events ORDER BY seq")] == [
        str(rv) for rv in range(21, 31)
    ]
    with pytest.raises(StatusError) as expired:  # a client resuming before the cut
        reading.position(db, shape_id=1, rv="19")
    assert expired.value.code == 410
    assert reading.position(db, shape_id=1, rv="20") == 11  # the log's start resumes


def test_the_deepest_cut_names_the_reason(db: sqlite3.Connection) -> None:
    fill(db, [cm("a", 1)], "10")
    appending.apply_changes(db, shape_id=1, changes=[big("a", rv) for rv in range(11, 21)])
    by_count = maintaining.trim(db, shape_id=1, max_events=9, max_age=3600, max_bytes=1000 * KIB)
    assert (by_count.dropped, by_count.reason) == (2, "count")  # the bookmark and rv 11
    by_bytes = maintaining.trim(db, shape_id=1, max_events=8, max_age=3600, max_bytes=700 * KIB)
    assert (by_bytes.dropped, by_bytes.reason) == (2, "bytes")  # the count would drop one
    by_age = maintaining.trim(db, shape_id=1, max_events=8, max_age=-1, max_bytes=700 * KIB)
    assert (by_age.dropped, by_age.reason, log_bytes(db)) == (7, "age", 0)


def test_a_long_cut_goes_in_slices_that_never_split_a_relist_batch(
    db: sqlite3.Connection,
) -> None:
    """The writer is held for one slice of rows at a time, as for a relist step (cut to 7/8
    of the default bound, 32,500 entries of 1 KiB held it 0.24 s in one transaction; 38 ms
    at most in slices of 2,000); a slice ends before a relist batch, which then starts the
    log and goes whole with the next."""
    fill(db, [cm("a", 1), cm("b", 2), cm("c", 3)], "10")  # seq 1: the bookmark at 10
    appending.apply_changes(db, shape_id=1, changes=[cm(f"n{rv}", rv) for rv in range(11, 16)])
    fill(db, [], "50")  # seq 7-15: eight DELETED and the bookmark at 50, one batch
    appending.apply_changes(db, shape_id=1, changes=[cm(f"m{rv}", rv) for rv in range(51, 54)])
    slices = []
    while True:
        trimmed = maintaining.trim(
            db, shape_id=1, max_events=1, max_age=3600, max_bytes=1 << 30, limit=4
        )
        slices.append((trimmed.dropped, trimmed.log_start_rv, trimmed.more))
        if not trimmed.more:
            break
    assert slices == [(4, "13", True), (2, "15", True), (9, "50", True), (2, "52", False)]
    assert [rv for (rv,) in db.execute("SELECT rv FROM events")] == ["53"]
    assert log_bytes(db) == summed(db)


def test_one_object_larger_than_the_bound_leaves_an_empty_log(db: sqlite3.Connection) -> None:
    """The newest entry goes too: the log then starts at the shape's RV, which resumes."""
    fill(db, [cm("a", 1)], "10")
    appending.apply_changes(db, shape_id=1, changes=[big("a", 11, size=300 * KIB)])
    trimmed = maintaining.trim(db, shape_id=1, max_events=1000, max_age=3600, max_bytes=100 * KIB)
    assert (trimmed.dropped, trimmed.log_start_rv, trimmed.log_bytes) == (2, "11", 0)
    assert reading.position(db, shape_id=1, rv="11") == 2  # the shape's RV: after seq 2


def test_a_cut_by_bytes_never_reaches_into_a_relist_in_progress(db: sqlite3.Connection) -> None:
    """A relist's steps append past ``last_seq`` (counted in ``log_bytes``, unpublished): a
    trim between its steps stops at the published end."""
    fill(db, [cm("a", 1)], "10")
    appending.apply_changes(db, shape_id=1, changes=[big("a", 11)])
    relisting.begin_list(db, shape_id=1)
    relisting.stage(db, shape_id=1, objects=[big("a", 20, size=500 * KIB)])
    relist = relisting.Relist(shape_id=1, rv="20", kind="ConfigMap", api_version="v1")
    assert relist.step(db) is None
    trimmed = maintaining.trim(db, shape_id=1, max_events=1000, max_age=3600, max_bytes=200 * KIB)
    assert trimmed.dropped == 2  # everything published (the bookmark, a@11), nothing past it
    while (published := relist.step(db)) is None:
        pass
    assert [(t, rv) for t, rv in db.execute("SELECT type, rv FROM events ORDER BY seq")] == [
        ("MODIFIED", "20"),
        ("BOOKMARK", "20"),
    ]
    assert published.log_bytes == summed(db) == 500 * KIB


def test_a_dropped_shape_is_told_apart(db: sqlite3.Connection) -> None:
    registering.discard_shape(db, shape_id=1)
    with pytest.raises(writing.ShapeGone):
        maintaining.trim(db, shape_id=1, max_events=1, max_age=1, max_bytes=1)
    with pytest.raises(KeyError):  # what callers caught before ShapeGone had a name
        maintaining.trim(db, shape_id=1, max_events=1, max_age=1, max_bytes=1)


# -- the store -------------------------------------------------------------------------------


async def filled_shape(store: Store, namespace: str = "") -> Shape:
    shape = await store.ensure_shape(ShapeKey.of(CM, namespace=namespace), configured=True)
    await store.begin_list(shape)
    await store.finish_list(shape, rv="10", kind="ConfigMap", api_version="v1")
    return shape


async def test_a_commit_that_takes_the_log_past_its_bytes_trims_it_at_once(
    tmp_path: Path,
) -> None:
    """Not at the next maintenance pass (a minute later): 150 updates of an 878 KiB object
    grew the database by 141 MiB before this bound. The file grows by about the bound."""
    path = tmp_path / "c.db"
    metrics = Metrics()
    metrics.resources.hold("v1/configmaps")  # as its reflector does once listed
    bound = 2 * 1024 * KIB
    store = await Store.open(StoreSettings(path=path, retention_bytes=bound), metrics=metrics)
    checkpoints = asyncio.create_task(store.keep_checkpointed(interval=0.01))  # as app.App
    try:
        shape = await filled_shape(store)
        start = path.stat().st_size
        for rv in range(11, 11 + 150):
            await store.apply(shape, [big("huge", rv, size=200 * KIB)])
            assert shape.log_bytes <= bound
            await asyncio.sleep(0.005)
        # The log, the object, a commit's pages (the WAL is bounded apart from this, by
        # ``schema.JOURNAL_SIZE_LIMIT``). 150 * 200 KiB = 29 MiB before.
        grown = path.stat().st_size - start
        assert grown < bound + 1024 * KIB, grown
        assert shape.log_start_rv is not None and int(shape.log_start_rv) > 140
        trimmed = {"resource": "v1/configmaps", "reason": "bytes"}
        kept = 151 - (metrics.value("warmwatch_events_trimmed_total", trimmed) or 0)
        assert 8 <= kept <= 10  # 7/8 of the bound to the bound, in entries of 200 KiB
        with pytest.raises(StatusError) as expired:
            await store.position(shape, "100")
        assert expired.value.code == 410
    finally:
        checkpoints.cancel()
        await store.close()


async def test_a_maintenance_pass_passes_over_a_shape_dropped_meanwhile(tmp_path: Path) -> None:
    """Found by review: ``trim`` goes through a copy of the shapes and waits for the writer
    at each; a shape dropped in between (unused, revoked) failed the whole pass with
    ``KeyError: 'shape N does not exist'``, and with it the rest of the maintenance."""
    store = await Store.open(StoreSettings(path=tmp_path / "c.db"))
    try:
        first, second = await filled_shape(store, "a"), await filled_shape(store, "b")
        async with store._write_lock:  # a commit under way: the pass waits for the writer
            trimming = asyncio.create_task(store.trim())
            await asyncio.sleep(0.01)  # the pass took its copy and waits to trim ``first``
            dropping = asyncio.create_task(store.drop_shape(second))  # queued behind it
            await asyncio.sleep(0.01)
        assert await trimming == 0
        await dropping
        assert set(store.shapes.values()) == {first}
        await store.drop_shape(second)  # dropped twice (two paths at once): no error either
    finally:
        await store.close()
