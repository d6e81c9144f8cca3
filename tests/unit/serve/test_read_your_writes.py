"""Read your writes, serving half: the written RV read from answers, and a most-recent read
waiting for the cache to show a write (a real store on a temporary file, no sockets)."""

from __future__ import annotations

import asyncio
import gzip
import tracemalloc
import zlib
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from proxy.cache.freshness import RecentWrites
from proxy.cache.records import ChangeType, change_from_object
from proxy.cache.shapes import ShapeKey
from proxy.cache.store import Store, StoreSettings
from proxy.kube.resources import GroupVersionResource
from proxy.serve.context import Context, ServeSettings
from proxy.serve.read_your_writes import caught_up, record_write, written_resource_version
from tests.unit.kube.test_protobuf import configmap, envelope, field

CM = GroupVersionResource.parse("v1/configmaps")
JSON = CIMultiDict({"Content-Type": "application/json"})
PROTOBUF = CIMultiDict({"Content-Type": "application/vnd.kubernetes.protobuf"})


def obj(name: str, rv: int, namespace: str = "a") -> dict[str, Any]:
    return {
        "kind": "ConfigMap",
        "apiVersion": "v1",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": str(rv)},
    }


STATUS = {"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}}


def test_the_written_rv_from_json_protobuf_and_gzip() -> None:
    assert written_resource_version(JSON, orjson.dumps(obj("x", 42))) == "42"
    assert written_resource_version(JSON, orjson.dumps(STATUS)) is None
    assert written_resource_version(JSON, b"not json") is None
    pb = envelope(kind="ConfigMap", raw=configmap("x", "a", "43"))
    assert written_resource_version(PROTOBUF, pb) == "43"
    status = envelope(kind="Status", raw=field(1, field(2, b"44")))
    assert written_resource_version(PROTOBUF, status) is None
    assert written_resource_version(PROTOBUF, b"k8s\x00\x0a\xff") is None  # malformed
    zipped = CIMultiDict({"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert written_resource_version(zipped, gzip.compress(orjson.dumps(obj("x", 45)))) == "45"
    assert written_resource_version(CIMultiDict({"Content-Type": "application/yaml"}), b"") is None


def test_a_compressed_answer_is_decompressed_only_up_to_the_bound() -> None:
    """A small compressed answer that stands for much more than one object (a
    deletecollection's list) is given up at 8 MiB decompressed, not inflated whole first."""
    zipped = CIMultiDict({"Content-Type": "application/json", "Content-Encoding": "gzip"})
    big = {**obj("x", 46), "data": {"a": "x" * (64 << 20)}}
    bomb = gzip.compress(orjson.dumps(big), compresslevel=9)
    assert len(bomb) < 1 << 20
    tracemalloc.start()
    try:
        assert written_resource_version(zipped, bomb) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 14 << 20, f"peak {peak / 2**20:.0f} MiB"  # the 8 MiB bound and a piece, not 64
    # deflate (the zlib format), and answers that do not decompress whole: not read.
    deflated = CIMultiDict({"Content-Type": "application/json", "Content-Encoding": "deflate"})
    assert written_resource_version(deflated, zlib.compress(orjson.dumps(obj("x", 47)))) == "47"
    whole = gzip.compress(orjson.dumps(obj("x", 48)))
    assert written_resource_version(zipped, whole[:-8]) is None  # cut short
    assert written_resource_version(zipped, b"not gzip") is None


def test_record_write_by_path_and_method() -> None:
    writes = RecentWrites()
    record = record_write
    record(
        writes,
        make_mocked_request("POST", "/api/v1/namespaces/a/configmaps"),
        JSON,
        orjson.dumps(obj("x", 50)),
    )
    record(
        writes,
        make_mocked_request("DELETE", "/api/v1/namespaces/a/configmaps/y"),
        JSON,
        orjson.dumps(STATUS),
    )
    record(  # a subresource: the scale of a deployment carries the deployment's RV
        writes,
        make_mocked_request("PUT", "/apis/apps/v1/namespaces/a/deployments/d/scale"),
        JSON,
        orjson.dumps({"kind": "Scale", "metadata": {"resourceVersion": "60"}}),
    )
    record(writes, make_mocked_request("POST", "/version"), JSON, b"{}")
    target = writes.target(CM, namespace="a")
    assert target.rv == "50" and target.deleted == (("a", "y"),)
    assert writes.target(GroupVersionResource.parse("apps/v1/deployments"), namespace=None).rv == (
        "60"
    )


@pytest.fixture
async def world(tmp_path: Path) -> Any:
    store = await Store.open(StoreSettings(path=tmp_path / "c.db"))
    shape = await store.ensure_shape(ShapeKey.of(CM), configured=True)
    await store.stage(shape, [change_from_object(ChangeType.ADDED, obj("old", 5))])
    await store.finish_list(shape, rv="10", kind="ConfigMap", api_version="v1")
    ctx = Context(
        store=store,
        syncer=cast(Any, None),
        upstream=cast(Any, None),
        discovery=cast(Any, None),
        metrics=cast(Any, None),
        settings=ServeSettings(too_large_wait=0.5),
        credentials="sidecar",
        learn=True,
        breaker=cast(Any, None),
        ready=lambda: (True, "ok"),
        writes=RecentWrites(),
    )
    yield ctx, store, shape
    await store.close()


async def test_a_most_recent_read_waits_for_a_write_to_arrive(world: Any) -> None:
    ctx, store, shape = world
    assert await caught_up(ctx, shape, namespace=None)  # nothing written
    ctx.writes.wrote(CM, namespace="a", rv="11")

    async def arrives() -> None:
        await asyncio.sleep(0.1)
        await store.apply(shape, [change_from_object(ChangeType.ADDED, obj("new", 11))])

    arriving = asyncio.create_task(arrives())
    assert await caught_up(ctx, shape, namespace="a")
    await arriving


async def test_a_write_that_does_not_arrive_passes_the_read_through(world: Any) -> None:
    ctx, _, shape = world
    ctx.writes.wrote(CM, namespace="a", rv="12")
    assert not await caught_up(ctx, shape, namespace=None)
    assert await caught_up(ctx, shape, namespace="b")  # another namespace's read: no wait


async def test_a_delete_is_waited_for_until_the_object_left_the_cache(world: Any) -> None:
    ctx, store, shape = world
    ctx.writes.deleted(CM, namespace="a", name="old")
    assert not await caught_up(ctx, shape, namespace=None)  # still cached after 0.5 s
    deleted = change_from_object(ChangeType.DELETED, obj("old", 13))
    await store.apply(shape, [deleted])
    assert await caught_up(ctx, shape, namespace=None)


async def test_a_watcher_whose_whole_tail_was_trimmed_is_told(world: Any) -> None:
    """Found by review: read_events took "no rows" for "nothing new" although the log had
    moved on, and the watcher spun at 100 % CPU."""
    from proxy.cache.reading import LogTrimmed

    _, store, shape = world
    for rv in range(11, 11 + 5):
        await store.apply(shape, [change_from_object(ChangeType.ADDED, obj(f"n{rv}", rv))])
    object.__setattr__(store.settings, "retention_seconds", -1.0)  # everything is too old
    await store.trim()
    shape.log._ring.clear()  # as after a restart: nothing in memory
    with pytest.raises(LogTrimmed):
        await store.read_events(shape, after=1, limit=10)
