"""Integrity checks do not make a warm start O(size) (found by review: ``quick_check`` ran
on every start, before anything was served). A file broken inside is found by the background
check, reported, and moved aside at the next start."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from proxy.cache.records import ChangeType, change_from_object
from proxy.cache.schema import PAGE_SIZE
from proxy.cache.shapes import ShapeKey
from proxy.cache.store import Store, StoreSettings
from proxy.kube.resources import GroupVersionResource

CM = GroupVersionResource.parse("v1/configmaps")


async def filled(path: Path) -> None:
    store = await Store.open(StoreSettings(path=path))
    shape = await store.ensure_shape(ShapeKey.of(CM), configured=True)
    objects = [
        {
            "kind": "ConfigMap",
            "apiVersion": "v1",
            "metadata": {"name": f"cm-{i:04d}", "namespace": "a", "resourceVersion": str(i + 1)},
            "data": {"k": "v" * 2000},
        }
        for i in range(500)
    ]
    await store.stage(shape, [change_from_object(ChangeType.ADDED, o) for o in objects])
    await store.finish_list(shape, rv="600", kind="ConfigMap", api_version="v1")
    await store.close()


def break_a_page_inside(path: Path) -> None:
    with sqlite3.connect(path) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(path.read_bytes())
    middle = (len(data) // PAGE_SIZE // 2) * PAGE_SIZE  # a page well past the schema's
    data[middle + 100 : middle + 4000] = b"\xff" * 3900
    path.write_bytes(bytes(data))


async def test_a_sound_file_passes_in_the_background(tmp_path: Path) -> None:
    await filled(tmp_path / "c.db")
    store = await Store.open(StoreSettings(path=tmp_path / "c.db"))
    try:
        assert await store.check_integrity()
        assert store.integrity_error is None
    finally:
        await store.close()


async def test_a_file_broken_inside_opens_is_found_and_is_moved_aside_next_time(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.db"
    await filled(path)
    break_a_page_inside(path)
    store = await Store.open(StoreSettings(path=path))  # opens: nothing reads every page
    try:
        assert len(store.shapes) == 1
        assert not await store.check_integrity()
        assert (
            store.integrity_error is not None
            and "rebuilt at the next start" in store.integrity_error
        )
    finally:
        await store.close()
    reopened = await Store.open(StoreSettings(path=path))
    try:
        assert reopened.shapes == {}  # a fresh file: rebuilt from upstream
        assert await reopened.check_integrity()
        assert [p.name for p in tmp_path.iterdir() if ".broken-" in p.name]
        assert not (tmp_path / "c.db.corrupt").exists()
    finally:
        await reopened.close()
