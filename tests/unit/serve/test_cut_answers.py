"""Answers that fail after they began (docs/design.md §5): a client that leaves in the middle
of a LIST is no error (no traceback, no second response written into the stream), one that
stops reading is cut after the write deadline and gives its cache reader back, and the server
goes on serving. Found by review; a real aiohttp server on loopback, a real store."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from proxy.cache.records import ChangeType, change_from_object
from proxy.cache.shapes import ShapeKey
from proxy.cache.store import Store, StoreSettings
from proxy.kube.resources import GroupVersionResource
from proxy.serve.context import ServeSettings
from proxy.serve.limiting import Limits
from tests.unit.serve.conftest import serving

CM = GroupVersionResource.parse("v1/configmaps")
LIST_TIMEOUT = 3.0
DEADLINES = ServeSettings(slow_write_timeout=0.5, list_timeout=LIST_TIMEOUT)
PATIENT = ServeSettings(slow_write_timeout=10, list_timeout=LIST_TIMEOUT, list_min_rate=10e6)
"""For readers too slow for a list (under 10 MB/s after its first 3 s), never for a write:
socket buffers that a slow reader drains open up in steps, so a write may wait longer than
the 0.5 s of ``DEADLINES``."""


@pytest.fixture
async def server(tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    limits, settings = getattr(request, "param", (Limits(), DEADLINES))
    # One reader only: a LIST that held it for good would block every other read.
    store = await Store.open(StoreSettings(path=tmp_path / "c.db", readers=1))
    shape = await store.ensure_shape(ShapeKey.of(CM), configured=True)
    payload = "x" * 4000
    objects = [
        {
            "kind": "ConfigMap",
            "apiVersion": "v1",
            "metadata": {"name": f"cm-{i:05d}", "namespace": "a", "resourceVersion": str(i + 1)},
            "data": {"k": payload},
        }
        for i in range(3000)  # 12 MB: far more than socket buffers hold
    ]
    await store.stage(shape, [change_from_object(ChangeType.ADDED, o) for o in objects])
    await store.finish_list(shape, rv="5000", kind="ConfigMap", api_version="v1")

    async with serving(store, settings=settings, limits=limits) as port:
        yield port
    await store.close()


async def fetch(port: int, path: str, *, read: int | None = None) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    data = await (reader.read(read) if read else reader.read())
    writer.close()
    return data


async def test_a_client_leaving_mid_list_is_not_an_error(
    server: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for _ in range(5):
        head = await fetch(server, "/api/v1/configmaps", read=2000)
        assert head.startswith(b"HTTP/1.1 200")
    await asyncio.sleep(0.3)  # the server notices on its next writes
    whole = await fetch(server, "/api/v1/configmaps?limit=1")
    body = whole.partition(b"\r\n\r\n")[2]
    assert b'"resourceVersion":"5000"' in body[:200]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [
        r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR
    ]
    assert "the client left" in caplog.text


async def test_a_client_that_stops_reading_a_list_is_cut_and_frees_its_reader(
    server: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    reader, writer = await asyncio.open_connection("127.0.0.1", server)
    writer.write(b"GET /api/v1/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    await writer.drain()
    assert (await reader.read(2000)).startswith(b"HTTP/1.1 200")
    try:
        # It reads no more. The store has one reader, held by that LIST until it is cut.
        whole = await asyncio.wait_for(fetch(server, "/api/v1/configmaps?limit=1"), 10)
        assert whole.startswith(b"HTTP/1.1 200") and whole.endswith(b"]}\n\r\n0\r\n\r\n")
        assert "stopped reading" in caplog.text
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    finally:
        writer.close()


async def head_of(port: int, path: str) -> tuple[bytes, asyncio.StreamWriter]:
    """Send a GET and read its status line and headers; the connection stays open."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5), writer


@pytest.mark.parametrize(
    "server", [(Limits(max_watches=2, max_client_watches=2), DEADLINES)], indirect=True
)
async def test_watches_over_the_limit_get_the_apiservers_429(server: int) -> None:
    watch = "/api/v1/configmaps?watch=1&resourceVersion=5000"
    held = [await head_of(server, watch) for _ in range(2)]
    assert all(head.startswith(b"HTTP/1.1 200") for head, _ in held)
    refused = await fetch(server, watch)
    assert refused.startswith(b"HTTP/1.1 429")
    assert b"Retry-After: 1\r\n" in refused
    assert refused.endswith(b"Too many requests, please try again later.\n")
    held[0][1].close()
    await asyncio.sleep(5.5)  # an idle watch notices its client left within idle_check (5 s)
    head, writer = await head_of(server, watch)
    assert head.startswith(b"HTTP/1.1 200")
    writer.close()
    held[1][1].close()


@pytest.mark.parametrize(
    "server", [(Limits(max_list_streams=1, list_stream_wait=0.1), DEADLINES)], indirect=True
)
async def test_list_streams_over_the_limit_get_429_until_the_stalled_one_is_cut(
    server: int,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server)
    writer.write(b"GET /api/v1/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert (await reader.read(2000)).startswith(b"HTTP/1.1 200")  # then it stops reading
    try:
        refused = await fetch(server, "/api/v1/configmaps")
        assert refused.startswith(b"HTTP/1.1 429")
        refused = await fetch(server, "/api/v1/configmaps?watch=1")  # initial state: a stream
        assert refused.startswith(b"HTTP/1.1 429")
        await asyncio.sleep(1.5)  # cut after the write deadline (0.5 s)
        whole = await asyncio.wait_for(fetch(server, "/api/v1/configmaps"), 10)
        assert whole.startswith(b"HTTP/1.1 200") and whole.endswith(b"]}\n\r\n0\r\n\r\n")
    finally:
        writer.close()


@pytest.mark.parametrize(
    "server", [(Limits(max_list_streams=1, list_stream_wait=5), DEADLINES)], indirect=True
)
async def test_a_list_waits_for_a_slot_a_stalled_stream_gives_back(server: int) -> None:
    """Within ``list_stream_wait`` a LIST queues for a slot instead of a 429: here the slot
    comes free when the stalled client is cut at its write deadline (0.5 s)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server)
    writer.write(b"GET /api/v1/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert (await reader.read(2000)).startswith(b"HTTP/1.1 200")  # then it stops reading
    try:
        whole = await asyncio.wait_for(fetch(server, "/api/v1/configmaps"), 10)
        assert whole.startswith(b"HTTP/1.1 200") and whole.endswith(b"]}\n\r\n0\r\n\r\n")
    finally:
        writer.close()


async def trickle(
    port: int, path: str, *, seconds: float, chunk: int = 64 * 1024
) -> tuple[bytes, float]:
    """Read an answer slowly but steadily (``chunk`` per 0.1 s: at 64 KiB, the whole 12 MB
    take 19 s) for at most ``seconds``; what was read, and when it ended (a clean end only
    after what the socket buffers held is read)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    started, data = asyncio.get_running_loop().time(), b""
    try:
        while asyncio.get_running_loop().time() - started < seconds:
            try:
                data_read = await reader.read(chunk)
            except ConnectionResetError:
                break
            if not data_read:
                break
            data += data_read
            await asyncio.sleep(0.1)
        return data, asyncio.get_running_loop().time() - started
    finally:
        writer.close()


@pytest.mark.parametrize("server", [(Limits(), PATIENT)], indirect=True)
async def test_a_list_read_too_slowly_is_cut_at_the_list_timeout(server: int) -> None:
    """Past every write deadline, a steady trickle would hold the store's one reader and its
    snapshot (which pins the WAL) for as long as it reads (19 s here): the list timeout
    bounds it, and a LIST waiting for the reader gets it then."""
    slow = asyncio.create_task(trickle(server, "/api/v1/configmaps", seconds=30))
    await asyncio.sleep(0.5)
    loop = asyncio.get_running_loop()
    asked = loop.time()
    whole = await asyncio.wait_for(fetch(server, "/api/v1/configmaps?limit=1"), 30)
    waited = loop.time() - asked
    assert whole.startswith(b"HTTP/1.1 200") and whole.endswith(b"]}\n\r\n0\r\n\r\n")
    assert LIST_TIMEOUT - 1.5 < waited < LIST_TIMEOUT + 2, waited
    data, _ = await slow
    assert data.startswith(b"HTTP/1.1 200")
    assert not data.endswith(b"0\r\n\r\n") and len(data) < 10_000_000  # cut, visibly


@pytest.mark.parametrize(
    "server", [(Limits(), ServeSettings(list_timeout=1, list_min_rate=1e6))], indirect=True
)
async def test_a_list_read_at_the_minimum_rate_is_never_cut(server: int) -> None:
    """12 MB at ~2.5 MB/s: far past the list timeout (1 s), never below the rate (1 MB/s)."""
    data, ended = await trickle(server, "/api/v1/configmaps", seconds=60, chunk=256 * 1024)
    assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"]}\n\r\n0\r\n\r\n")
    assert ended > 2


@pytest.mark.parametrize("server", [(Limits(), PATIENT)], indirect=True)
async def test_a_watchs_initial_state_ends_with_the_watch_without_a_bookmark(server: int) -> None:
    path = "/api/v1/configmaps?watch=1&resourceVersion=0&allowWatchBookmarks=true&timeoutSeconds=1"
    data, _ = await trickle(server, path, seconds=60)
    assert data.startswith(b"HTTP/1.1 200")
    assert data.endswith(b"0\r\n\r\n")  # the watch ended, as at its timeout
    assert len(data) < 10_000_000  # far from the whole initial state (12 MB)
    assert b'"BOOKMARK"' not in data  # no RV reached: the initial state was not all sent
    whole = await asyncio.wait_for(fetch(server, "/api/v1/configmaps?limit=1"), 10)
    assert whole.startswith(b"HTTP/1.1 200")
