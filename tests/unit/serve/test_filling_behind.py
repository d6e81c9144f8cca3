"""A protobuf client answered from the JSON collection: its protobuf collection is learned (and
its fill begun) only once the answer's list, or its watch's initial state, has been sent
(proxy/serve/executing.py). Found in CI: kube-controller-manager's 45,000 ConfigMaps were
served in 14 s instead of 7 s while their protobuf fill ran beside them over the slow link.
A real aiohttp server on loopback, a real store; the learning is recorded, not filled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from proxy.cache.records import ChangeType, change_from_object
from proxy.cache.shapes import Encoding, ShapeKey
from proxy.cache.store import Store, StoreSettings
from proxy.kube.resources import GroupVersionResource
from proxy.serve.context import ServeSettings
from tests.unit.serve.conftest import serving

CM = GroupVersionResource.parse("v1/configmaps")
PROTOBUF = ShapeKey.of(CM, encoding=Encoding.PROTOBUF)
ACCEPT = "application/vnd.kubernetes.protobuf, application/json"
"""What a typed client-go controller sends."""
SETTINGS = ServeSettings(slow_write_timeout=10, list_timeout=10)


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[int, list[ShapeKey]]]:
    """The port, and the shapes learned, of a server holding 3,000 ConfigMaps (12 MB, far more
    than socket buffers hold) in JSON only."""
    store = await Store.open(StoreSettings(path=tmp_path / "c.db"))
    shape = await store.ensure_shape(ShapeKey.of(CM), configured=True)
    objects = [
        {
            "kind": "ConfigMap",
            "apiVersion": "v1",
            "metadata": {"name": f"cm-{i:05d}", "namespace": "a", "resourceVersion": str(i + 1)},
            "data": {"k": "x" * 4000},
        }
        for i in range(3000)
    ]
    await store.stage(shape, [change_from_object(ChangeType.ADDED, o) for o in objects])
    await store.finish_list(shape, rv="5000", kind="ConfigMap", api_version="v1")
    learned: list[ShapeKey] = []
    async with serving(store, settings=SETTINGS, learned=learned) as port:
        yield port, learned
    await store.close()


async def _open(port: int, target: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: {ACCEPT}\r\n"
        "Connection: close\r\n\r\n".encode()
    )
    await writer.drain()
    return reader, writer


async def _learned_soon(learned: list[ShapeKey]) -> list[ShapeKey]:
    for _ in range(100):
        if learned:
            break
        await asyncio.sleep(0.02)
    return learned


async def test_a_list_is_sent_before_its_protobuf_collection_is_learned(
    served: tuple[int, list[ShapeKey]],
) -> None:
    port, learned = served
    reader, writer = await _open(port, "/api/v1/configmaps")
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"application/json" in head
    await asyncio.sleep(0.3)  # the server is blocked on the full socket buffers
    assert learned == []
    body = await reader.read()
    writer.close()
    assert body.count(b'"name":"cm-') == 3000
    assert await _learned_soon(learned) == [PROTOBUF]


async def test_a_watch_sends_its_initial_state_before_the_protobuf_collection_is_learned(
    served: tuple[int, list[ShapeKey]],
) -> None:
    port, learned = served
    reader, writer = await _open(
        port,
        "/api/v1/configmaps?watch=1&sendInitialEvents=true&allowWatchBookmarks=true"
        "&resourceVersionMatch=NotOlderThan&timeoutSeconds=2",
    )
    await reader.readuntil(b"\r\n\r\n")
    await asyncio.sleep(0.3)
    assert learned == []
    received = b""
    while b"k8s.io/initial-events-end" not in received[-4096:]:
        received += await reader.read(1 << 16)
    assert await _learned_soon(learned) == [PROTOBUF]
    await reader.read()  # the watch's end, at its timeout
    writer.close()


async def test_a_client_that_leaves_mid_list_still_gets_its_collection_learned(
    served: tuple[int, list[ShapeKey]],
) -> None:
    port, learned = served
    reader, writer = await _open(port, "/api/v1/configmaps")
    await reader.readuntil(b"\r\n\r\n")
    writer.close()
    assert await _learned_soon(learned) == [PROTOBUF]
