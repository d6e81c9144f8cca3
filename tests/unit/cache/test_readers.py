"""The store's pool of reader connections (found measuring warm restarts: a SIGTERM right
after the port opened cancelled a task while it opened its reader, and that connection's
thread, never closed, kept the process from exiting)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path
from typing import Any

import aiosqlite
import pytest

from proxy.cache import schema
from proxy.cache.store import Store, StoreSettings


async def test_a_reader_cancelled_while_it_opens_is_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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
