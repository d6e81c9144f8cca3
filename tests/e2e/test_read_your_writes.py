"""Read your writes through warmwatch: a write passed through it, followed at once by a
most-recent LIST (``resourceVersion`` unset) of the same collection, sees that write — the
read waits for the cache to show it, as the apiserver's consistent reads wait for its watch
cache (docs/design.md §5). Without that wait, a LIST answered from the cache right after the
write's answer would often miss it: the watch event arrives a moment later."""

from __future__ import annotations

from collections.abc import Callable

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
