"""Read your writes through warmwatch: a write passed through it, followed at once by a
most-recent LIST (``resourceVersion`` unset) of the same collection, sees that write — the
read waits for the cache to show it, as the apiserver's consistent reads wait for its watch
cache (docs/design.md §5). Without that wait, a LIST answered from the cache right after the
write's answer would often miss it: the watch event arrives a moment later.

Reading the written resourceVersion from a compressed answer decompresses at most 8 MiB of
it: a deletecollection of 100 MB of ConfigMaps, answered gzipped in ~150 KB, does not grow
warmwatch's peak RSS by more than ``INFLATE_BOUND``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from loadtest import kubeapi
from loadtest.sidecar import Sidecar

pytestmark = pytest.mark.e2e

ROUNDS = 40


def names(listed: dict[str, object]) -> set[str]:
    return {item["metadata"]["name"] for item in listed["items"]}  # type: ignore[attr-defined, index]


async def test_a_write_is_seen_by_the_next_most_recent_list(
    namespace: str, start_sidecar: Callable[..., Sidecar]
) -> None:
    sidecar = start_sidecar(resources=[f"v1/configmaps@{namespace}"])
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    async with kubeapi.RawClient(base_url=sidecar.url) as ww:
        assert names(await ww.get(path)) == set()
        for i in range(ROUNDS):
            created = await ww.create(path, kubeapi.configmap(name=f"w-{i}", namespace=namespace))
            listed = await ww.get(path)  # resourceVersion unset: most recent
            assert f"w-{i}" in names(listed), f"round {i}: the create is missing"
            assert int(listed["metadata"]["resourceVersion"]) >= int(
                created["metadata"]["resourceVersion"]
            )
            await ww.merge_patch(f"{path}/w-{i}", {"data": {"round": str(i)}})
            listed = await ww.get(path)
            item = next(x for x in listed["items"] if x["metadata"]["name"] == f"w-{i}")
            assert item["data"]["round"] == str(i), f"round {i}: the update is missing"
            await ww.delete(f"{path}/w-{i}")  # answered with a Status: no resourceVersion
            assert f"w-{i}" not in names(await ww.get(path)), f"round {i}: the delete is missing"
    # Served from the cache, not passed through (the point is a fresh cache, not a detour).
    assert sidecar.metric("warmwatch_list_bytes_total", {"source": "cache"}) > 0
    assert sidecar.metric("warmwatch_passthrough_requests_total", {"verb": "GET"}) == 0


BIG_OBJECTS = 100
BIG_SIZE = 1_000_000
INFLATE_BOUND = 24 * 2**20
"""How much warmwatch's peak RSS may grow while it passes on the gzipped list of 100 MB a
deletecollection answers: the 8 MiB it may decompress to read a resourceVersion, and some
(stated in the README: Limits). Decompressed whole, it grew by more than 100 MiB."""


def _peak_rss_reset(pid: int) -> int:
    """Reset the process's peak RSS (``VmHWM``) to its current RSS, and return that."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return _status_bytes(pid, "VmHWM")


def _status_bytes(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


async def test_a_compressed_write_answer_is_not_decompressed_whole(
    namespace: str, admin_api: kubeapi.RawClient, start_sidecar: Callable[..., Sidecar]
) -> None:
    await kubeapi.create_configmaps(
        admin_api, namespace=namespace, count=BIG_OBJECTS, size=BIG_SIZE
    )
    sidecar = start_sidecar()
    pid = sidecar.process.pid
    before = _peak_rss_reset(pid)
    # One connection: its next request is handled once the handler of the delete (which
    # reads the answer after passing it on) has returned.
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        async with session.delete(
            f"{sidecar.url}/api/v1/namespaces/{namespace}/configmaps",
            headers={"Accept": "application/json", "Accept-Encoding": "gzip"},
        ) as answer:
            body = await answer.read()
            assert answer.status == 200 and answer.headers["Content-Encoding"] == "gzip"
        async with session.get(f"{sidecar.url}/version") as after:
            assert after.status == 200
    assert len(body) < 1 << 20  # the gzipped list, passed on as the apiserver sent it
    grown = _status_bytes(pid, "VmHWM") - before
    assert grown < INFLATE_BOUND, f"peak RSS grew by {grown / 2**20:.0f} MiB"
