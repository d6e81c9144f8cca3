"""The shape registry and discovery documents: their transactions on an in-memory database,
and the store's learning of new shapes."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from proxy.cache import reading, registering, schema
from proxy.cache.shapes import Encoding, Shape, ShapeKey
from proxy.cache.store import Store, StoreSettings
from proxy.kube.resources import GroupVersionResource

PODS = ShapeKey.of(GroupVersionResource.parse("v1/pods"), namespace="a", encoding=Encoding.PROTOBUF)


@pytest.fixture
def empty() -> sqlite3.Connection:
    connection = sqlite3.connect(":memory:")
    schema.migrate(connection)
    return connection


def test_a_new_shape_reads_back_as_its_key(empty: sqlite3.Connection) -> None:
    (row,) = registering.insert_shapes(empty, shapes={PODS: False})
    shape = Shape.from_row(row, ring_size=8)
    assert shape.key == PODS
    assert (shape.configured, shape.rv, shape.log_start_rv, shape.log.last_seq) == (
        False,
        None,
        None,
        0,
    )
    assert [Shape.from_row(r, ring_size=8).key for r in registering.open_shapes(empty)] == [PODS]


def test_shapes_inserted_together_get_their_own_generations(empty: sqlite3.Connection) -> None:
    everywhere = ShapeKey.of(PODS.gvr)
    rows = registering.insert_shapes(empty, shapes={PODS: False, everywhere: True})
    shapes = [Shape.from_row(row, ring_size=8) for row in rows]
    assert [(shape.key, shape.configured) for shape in shapes] == [
        (PODS, False),
        (everywhere, True),
    ]
    gens = [gen for (gen,) in empty.execute("SELECT gen FROM shapes ORDER BY id")]
    assert len(set(gens)) == 2


def test_configured_and_usage_are_saved(empty: sqlite3.Connection) -> None:
    shape_id = registering.insert_shapes(empty, shapes={PODS: False})[0][0]
    registering.set_configured(empty, shape_id=shape_id)
    registering.save_usage(empty, used={shape_id: 1234.5})
    (row,) = registering.open_shapes(empty)
    shape = Shape.from_row(row, ring_size=8)
    assert (shape.configured, shape.used_at) == (True, 1234.5)


def test_a_discovery_document_is_replaced_whole(empty: sqlite3.Connection) -> None:
    registering.put_document(empty, key="/api", status=200, headers=b"[]", body=b"{}", etag="")
    registering.put_document(empty, key="/api", status=200, headers=b"[1]", body=b"{1}", etag="e")
    assert reading.get_document(empty, key="/api") == (200, b"[1]", b"{1}", "e")
    assert reading.get_document(empty, key="/apis") is None
    assert reading.document_sizes(empty) == [("/api", 3)]


def test_evicted_documents_go_in_the_same_transaction(empty: sqlite3.Connection) -> None:
    for key, body in (("/a", b"1"), ("/b", b"22"), ("/c", b"333")):
        registering.put_document(empty, key=key, status=200, headers=b"[]", body=body, etag="")
    assert [key for key, _ in reading.document_sizes(empty)] == ["/a", "/b", "/c"]  # oldest first
    registering.put_document(
        empty, key="/d", status=200, headers=b"[]", body=b"4444", etag="", evict=["/a", "/b"]
    )
    assert reading.document_sizes(empty) == [("/c", 3), ("/d", 4)]
    registering.drop_documents(empty, keys=["/c", "/never-stored"])
    assert reading.document_sizes(empty) == [("/d", 4)]


async def test_shapes_asked_for_while_the_writer_is_busy_are_inserted_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found with kube-controller-manager on a fresh warmwatch: its ~60 new shapes were
    inserted one after another, each behind a large fill's commits, and took 4 s to learn."""
    store = await Store.open(StoreSettings(path=tmp_path / "c.db"))
    inserts: list[int] = []
    insert_shapes = registering.insert_shapes

    def counted(connection: sqlite3.Connection, **kwargs: Any) -> Any:
        inserts.append(len(kwargs["shapes"]))
        return insert_shapes(connection, **kwargs)

    monkeypatch.setattr(registering, "insert_shapes", counted)
    keys = [ShapeKey.of(PODS.gvr, namespace=f"n{i}") for i in range(20)]
    try:
        async with store._write_lock:  # a fill's commit under way
            asking = [
                asyncio.create_task(store.ensure_shape(key, configured=False))
                for key in keys + keys[:5]
            ]
            await asyncio.sleep(0.01)  # all are waiting for the insert
            asking[0].cancel()  # one client leaves: the others' insert goes on
            await asyncio.sleep(0.01)
        shapes = await asyncio.gather(*asking[1:])
        assert inserts == [20]
        assert [shape.key for shape in shapes] == keys[1:] + keys[:5]
        assert shapes[-4:] == shapes[:4]  # asked for twice: the same shape
        assert len({shape.id for shape in shapes}) == 20
        again = await store.ensure_shape(keys[0], configured=True)
        assert again.configured and inserts == [20]
    finally:
        await store.close()
    reopened = await Store.open(StoreSettings(path=tmp_path / "c.db"))
    try:
        assert set(reopened.shapes) == set(keys)
        assert [key for key, shape in reopened.shapes.items() if shape.configured] == keys[:1]
    finally:
        await reopened.close()


async def test_each_shape_is_logged_once_with_its_id_and_cut_selectors(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Metrics name a shape by its id alone: one INFO line per shape and process says what
    the id stands for, with selectors cut to a readable length."""
    huge = ",".join(f"k{i}=v{i}" for i in range(2000))  # ~20 KiB
    key = ShapeKey(
        group="", version="v1", resource="configmaps", namespace="a", label_selector=huge
    )
    caplog.set_level("INFO", logger="proxy.cache.store")
    store = await Store.open(StoreSettings(path=tmp_path / "c.db"))
    try:
        shape = await store.ensure_shape(key, configured=False)
        await store.ensure_shape(key, configured=False)  # the same: not logged again
    finally:
        await store.close()
    store = await Store.open(StoreSettings(path=tmp_path / "c.db"))  # a restart: resumed
    await store.close()
    lines = [r for r in caplog.records if r.getMessage().startswith(f"shape {shape.id} ")]
    assert [line.getMessage().split(":")[0] for line in lines] == [
        f"shape {shape.id} (new, learned)",
        f"shape {shape.id} (resumed, learned)",
    ]
    for line in lines:
        message = line.getMessage()
        assert "v1/configmaps namespace=a labelSelector=" in message
        assert len(message) < 400 and f"({len(huge):,} characters)" in message
        assert line.__dict__["shape"] == shape.id
        assert line.__dict__["labelSelector"].startswith("k0=v0,k1=v1")


async def test_a_shape_asked_for_again_while_it_is_being_inserted_is_inserted_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found with a typed and a metadata informer starting at once: the second request for a
    new shape came while the first's insert was on the writer's thread, so the shape was not
    known yet; a second insert of the same key then failed (UNIQUE constraint), and the
    storage error took the whole cache out of service."""
    store = await Store.open(StoreSettings(path=tmp_path / "c.db"))
    inserting = asyncio.Event()
    resume = threading.Event()
    insert_shapes = registering.insert_shapes

    def slow(connection: sqlite3.Connection, **kwargs: Any) -> Any:
        inserting.set()
        resume.wait(5)
        return insert_shapes(connection, **kwargs)

    monkeypatch.setattr(registering, "insert_shapes", slow)
    key = ShapeKey.of(PODS.gvr, namespace="n")
    try:
        first = asyncio.create_task(store.ensure_shape(key, configured=False))
        await inserting.wait()  # the first insert is on the writer's thread
        second = asyncio.create_task(store.ensure_shape(key, configured=False))
        await asyncio.sleep(0.01)
        resume.set()
        shapes = await asyncio.gather(first, second)
        assert shapes[0] is shapes[1]
        assert store.storage_error is None
    finally:
        resume.set()
        await store.close()
