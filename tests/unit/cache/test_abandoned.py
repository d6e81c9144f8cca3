"""A relist that a crash interrupted: the next start gives it up without deleting what it
appended to the log (O(shapes), not O(objects)), and the shape's next append deletes that
first, so no reader ever sees it and no seq is used twice."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from proxy.cache import reading, relisting
from proxy.cache.records import ChangeType, change_from_object
from proxy.cache.shapes import ShapeKey
from proxy.cache.store import Store, StoreSettings
from proxy.kube.resources import GroupVersionResource

KEY = ShapeKey.of(GroupVersionResource.parse("v1/configmaps"))


def config_map(name: str, rv: int) -> dict[str, object]:
    return {"metadata": {"namespace": "a", "name": name, "resourceVersion": str(rv)}}


async def crashed_during_a_relist(path: Path) -> int:
    """A store filled at RV 10 whose relist at RV 20 appended its log entries, then stopped
    before publishing them; returns the published last_seq."""
    store = await Store.open(StoreSettings(path=path))
    shape = await store.ensure_shape(KEY, configured=True)
    await store.finish_list(shape, rv="10", kind="ConfigMap", api_version="v1")
    await store.close()
    connection = sqlite3.connect(path)
    relisting.begin_list(connection, shape_id=shape.id)
    changes = [change_from_object(ChangeType.ADDED, config_map(f"n{i}", 20)) for i in range(5)]
    relisting.stage(connection, shape_id=shape.id, objects=changes)
    relist = relisting.Relist(
        shape_id=shape.id, rv="20", kind="ConfigMap", api_version="v1", limit=2
    )
    relist.step(connection)
    relist.step(connection)
    published = connection.execute("SELECT last_seq FROM shapes").fetchone()[0]
    assert connection.execute("SELECT max(seq) FROM events").fetchone()[0] > published
    connection.close()
    return int(published)


async def test_the_next_watch_commit_deletes_what_an_abandoned_relist_appended(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.db"
    published = await crashed_during_a_relist(path)
    store = await Store.open(StoreSettings(path=path))
    try:
        shape = store.shapes[KEY]
        assert shape.unpublished and shape.log.last_seq == published
        left = await store._readers.read(
            lambda c: c.execute(
                "SELECT count(*) FROM events WHERE seq > ?", (published,)
            ).fetchone()[0]
        )
        assert left > 0  # the start did not delete them
        await store.apply(shape, [change_from_object(ChangeType.ADDED, config_map("w", 11))])
        assert not shape.unpublished
        records = await store._readers.read(
            reading.events_after, shape_id=shape.id, after=0, limit=100, last_seq=published + 1
        )
        assert [(r.seq, r.type, r.name) for r in records][-1] == (published + 1, "ADDED", "w")
        assert len(records) == published + 1  # nothing of the relist among them
    finally:
        await store.close()


async def test_a_new_list_deletes_them_first(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    published = await crashed_during_a_relist(path)
    store = await Store.open(StoreSettings(path=path))
    try:
        shape = store.shapes[KEY]
        await store.begin_list(shape)
        changes = [change_from_object(ChangeType.ADDED, config_map("v", 30))]
        await store.stage(shape, changes)
        await store.finish_list(shape, rv="30", kind="ConfigMap", api_version="v1")
        records = await store._readers.read(
            reading.events_after,
            shape_id=shape.id,
            after=published,
            limit=100,
            last_seq=shape.log.last_seq,
        )
        assert {r.rv for r in records} == {"30"}  # the abandoned relist's RV 20 is gone
    finally:
        await store.close()
