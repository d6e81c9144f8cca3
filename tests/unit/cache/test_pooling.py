"""The pool of reader connections (``pooling.Readers``), through the store that owns it."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path
from typing import Any

import aiosqlite
import pytest

from proxy.cache import reading as reading_module
from proxy.cache import schema
from proxy.cache.records import ChangeType, change_from_object
from proxy.cache.shapes import ShapeKey
from proxy.cache.store import Store, StoreSettings
from proxy.kube.resources import GroupVersionResource


async def test_a_reader_cancelled_while_it_opens_is_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found measuring warm restarts: a SIGTERM right after the port opened cancelled a task
    while it opened its reader, and that connection's thread, never closed, kept the process
    from exiting."""
    store = await Store.open(StoreSettings(path=tmp_path / "c.db"))
    opened: list[aiosqlite.Connection] = []
    connect = aiosqlite.connect

    def recorded_connect(*args: Any, **kwargs: Any) -> aiosqlite.Connection:
        opened.append(connect(*args, **kwargs))
        return opened[-1]

    loop = asyncio.get_running_loop()
    entered, release = asyncio.Event(), threading.Event()
    configure = schema.configure

    def held_configure(connection: sqlite3.Connection, **kwargs: Any) -> None:
        loop.call_soon_threadsafe(entered.set)
        release.wait(10)
        configure(connection, **kwargs)

    monkeypatch.setattr(aiosqlite, "connect", recorded_connect)
    monkeypatch.setattr(schema, "configure", held_configure)
    threads = set(threading.enumerate())
    reading = asyncio.create_task(store.object_counts())
    await entered.wait()
    reading.cancel()
    release.set()
    try:
        with pytest.raises(asyncio.CancelledError):
            await reading
        assert await store.object_counts() == {}  # the slot was not lost
        await store.close()
        started = set(threading.enumerate()) - threads
        assert len(opened) == 2  # the cancelled reader, and the next one
        for thread in started:
            thread.join(5)
        assert not [thread for thread in started if thread.is_alive()]
    finally:
        for db in opened:  # a leaked connection would keep the test process from exiting
            await db.close()


async def test_watchers_resuming_together_share_each_database_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the hostile-clients test: 300 watchers resuming behind the ring each read
    the same batches on their own, and LISTs waited seconds for a reader."""
    store = await Store.open(StoreSettings(path=tmp_path / "c.db"))
    try:
        shape = await store.ensure_shape(
            ShapeKey.of(GroupVersionResource.parse("v1/configmaps")), configured=True
        )
        await store.finish_list(shape, rv="10", kind="ConfigMap", api_version="v1")
        for rv in range(11, 21):
            config_map = {
                "metadata": {"namespace": "a", "name": f"n{rv}", "resourceVersion": str(rv)}
            }
            await store.apply(shape, [change_from_object(ChangeType.ADDED, config_map)])
        shape.log._ring.clear()  # as after a restart: nothing in memory
        reads = []
        events_after = reading_module.events_after

        def counted(connection: sqlite3.Connection, **kwargs: Any) -> Any:
            reads.append(kwargs["after"])
            return events_after(connection, **kwargs)

        monkeypatch.setattr(reading_module, "events_after", counted)
        first = shape.log.last_seq - 10
        crowd = [
            asyncio.create_task(store.read_events(shape, after=first, limit=4)) for _ in range(50)
        ]
        crowd[0].cancel()  # one client leaves: the others' read goes on
        results = await asyncio.gather(*crowd[1:])
        assert reads == [first]
        assert all(len(result) == 4 and result[0].seq == first + 1 for result in results)
        assert len(await store.read_events(shape, after=first + 4, limit=4)) == 4
        assert reads == [first, first + 4]  # a read done is not kept
        assert not store._readers._event_reads
    finally:
        await store.close()
