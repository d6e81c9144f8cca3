"""A watcher that has sent everything follows the log parked (serve/watching.py,
cache/tailing.py): commits are written to its client from the publishing writer while the
client keeps up, and by the watcher's own loop when it falls behind — every event once, in
order, across the switch. A real aiohttp server on loopback, a real store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from proxy.cache.records import ChangeType, change_from_object
from proxy.cache.shapes import Shape, ShapeKey
from proxy.cache.store import Store, StoreSettings
from proxy.kube.resources import GroupVersionResource
from proxy.serve.context import ServeSettings
from tests.unit.serve.conftest import serving
from tests.unit.upstream.conftest import eventually

CM = GroupVersionResource.parse("v1/configmaps")
SETTINGS = ServeSettings(slow_write_timeout=20)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    store = await Store.open(StoreSettings(path=tmp_path / "c.db"))
    shape = await store.ensure_shape(ShapeKey.of(CM), configured=True)
    await store.stage(shape, [change_from_object(ChangeType.ADDED, configmap(0, rv=1))])
    await store.finish_list(shape, rv="1", kind="ConfigMap", api_version="v1")
    yield store
    await store.close()


def configmap(i: int, *, rv: int, size: int = 10) -> dict[str, object]:
    return {
        "kind": "ConfigMap",
        "apiVersion": "v1",
        "metadata": {"name": f"cm-{i}", "namespace": "a", "resourceVersion": str(rv)},
        "data": {"k": "x" * size},
    }


async def commit(store: Store, shape: Shape, rvs: range, *, size: int = 10) -> None:
    await store.apply(
        shape,
        [change_from_object(ChangeType.MODIFIED, configmap(0, rv=rv, size=size)) for rv in rvs],
    )


async def watch(port: int, session: aiohttp.ClientSession) -> aiohttp.ClientResponse:
    response = await session.get(
        f"http://127.0.0.1:{port}/api/v1/namespaces/a/configmaps",
        params={"watch": "1", "resourceVersion": "1"},
    )
    assert response.status == 200
    return response


async def read_rvs(response: aiohttp.ClientResponse, count: int) -> list[int]:
    rvs = []
    while len(rvs) < count:
        line = await asyncio.wait_for(response.content.readline(), 10)
        event = orjson.loads(line)
        rvs.append(int(event["object"]["metadata"]["resourceVersion"]))
    return rvs


async def parked(shape: Shape, count: int) -> None:
    await eventually(lambda: len(shape.log._parked) == count)


async def test_a_client_that_keeps_up_is_written_to_by_the_commit_itself(store: Store) -> None:
    shape = next(iter(store.shapes.values()))
    async with serving(store, settings=SETTINGS) as port, aiohttp.ClientSession() as session:
        responses = [await watch(port, session) for _ in range(3)]
        await parked(shape, 3)
        for rv in range(2, 52):
            await commit(store, shape, range(rv, rv + 1))
            # Still parked right after the commit returned: no watcher was woken to write
            # the event — it is on its way to every client already.
            assert len(shape.log._parked) == 3
        for response in responses:
            assert await read_rvs(response, 50) == list(range(2, 52))


async def test_a_client_that_falls_behind_is_served_by_its_watcher_every_event_once(
    store: Store,
) -> None:
    shape = next(iter(store.shapes.values()))
    async with serving(store, settings=SETTINGS) as port, aiohttp.ClientSession() as session:
        response = await watch(port, session)
        await parked(shape, 1)
        woken = False
        # It does not read while ~16 MB are committed: far more than the sockets' buffers.
        for rv in range(2, 4002, 10):
            await commit(store, shape, range(rv, rv + 10), size=4000)
            woken = woken or not shape.log._parked
        assert woken, "the watcher was never woken: the client's buffers never filled"
        assert await read_rvs(response, 4000) == list(range(2, 4002))
        await parked(shape, 1)  # caught up, it follows parked again
        await commit(store, shape, range(4002, 4003))
        assert await read_rvs(response, 1) == [4002]
