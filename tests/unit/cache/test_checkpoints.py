"""WAL checkpoints (schema.AUTOCHECKPOINT_PAGES, Store.keep_checkpointed): never inside a small
watch commit on the event loop (found by the fan-out benchmark, where SQLite's default
checkpoint every 1,000 pages made one watch commit in ~100 take 17 ms instead of under 1),
and inside the writer thread's bulk transactions as by default (found by the million-object
benchmark: checkpointed only beside continuous writes, a fill's WAL never restarted and grew
to 1 GB)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from proxy.cache.records import ChangeType, change_from_object
from proxy.cache.shapes import ShapeKey
from proxy.cache.store import Store, StoreSettings
from proxy.kube.resources import GroupVersionResource

CM = GroupVersionResource.parse("v1/configmaps")


def _configmap(i: int, rv: int) -> dict[str, object]:
    return {
        "kind": "ConfigMap",
        "apiVersion": "v1",
        "metadata": {"name": f"cm-{i:04d}", "namespace": "a", "resourceVersion": str(rv)},
        "data": {"k": "v" * 4000},
    }


def _sizes(path: Path) -> tuple[int, int]:
    """Database and WAL file sizes: pages reach the database only by a checkpoint."""
    return path.stat().st_size, Path(f"{path}-wal").stat().st_size


async def _store_with_a_shape(path: Path) -> tuple[Store, object]:
    store = await Store.open(StoreSettings(path=path))
    shape = await store.ensure_shape(ShapeKey.of(CM), configured=True)
    await store.stage(shape, [])
    await store.finish_list(shape, rv="1", kind="ConfigMap", api_version="v1")
    return store, shape


async def test_commits_never_checkpoint_by_themselves(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    store, shape = await _store_with_a_shape(path)
    try:
        for rv in range(2, 1502):  # ~1,500 pages of 16 KiB: past SQLite's default of 1,000
            change = change_from_object(ChangeType.ADDED, _configmap(rv, rv))
            await store.apply(shape, [change])  # type: ignore[arg-type]
        database, wal = _sizes(path)
        assert wal > 16_000_000 and database < 1_000_000, (database, wal)
    finally:
        await store.close()


async def test_the_checkpointer_copies_what_was_committed(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    store, shape = await _store_with_a_shape(path)
    checkpoints = asyncio.create_task(store.keep_checkpointed(interval=0.01))
    try:
        for rv in range(2, 200):
            change = change_from_object(ChangeType.ADDED, _configmap(rv, rv))
            await store.apply(shape, [change])  # type: ignore[arg-type]
        await asyncio.sleep(0.2)
        database, wal = _sizes(path)
        assert database > 800_000, (database, wal)  # ~200 objects of 4 KB copied in
    finally:
        checkpoints.cancel()
        await asyncio.gather(checkpoints, return_exceptions=True)
        await store.close()


async def test_bulk_writes_on_the_writers_thread_keep_the_wal_bounded(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    store = await Store.open(StoreSettings(path=path))
    shape = await store.ensure_shape(ShapeKey.of(CM), configured=True)
    try:
        await store.begin_list(shape)
        for batch in range(20):  # 20 batches of 500 objects of 4 KB: ~40 MB of pages
            objects = [_configmap(batch * 500 + i, batch * 500 + i + 1) for i in range(500)]
            await store.stage(shape, [change_from_object(ChangeType.ADDED, o) for o in objects])
        await store.finish_list(shape, rv="20000", kind="ConfigMap", api_version="v1")
        database, wal = _sizes(path)
        assert database > 30_000_000 and wal < 32_000_000, (database, wal)
    finally:
        await store.close()
