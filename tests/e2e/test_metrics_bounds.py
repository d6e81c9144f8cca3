"""Every label value of every metric is from a bounded set, against the real apiserver
(docs/design.md §8, proxy/metrics.py).

- ``--client-auth delegated``: 5,000 requests without a token for made-up resources, each
  passed through and refused by the apiserver, some with odd methods, while ``/metrics`` is
  scraped every half second and another client LISTs from the cache: ``/metrics`` stays
  small, and the cached LISTs answer within a second. (Before the labels were bounded, each
  such path added its own series: /metrics reached 11 MB, and cached LISTs beside a scrape
  waited up to 2.2 s.)
- 12 learned collections with label selectors of nearly 4 KiB each (the longest learned): ``/metrics`` names them by id
  and holds none of their text; the log says once which selectors each id stands for.
- A resource the apiserver's discovery names keeps its name when passed through; one made
  up does not.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from loadtest import kubeapi
from loadtest.sidecar import Sidecar
from proxy.metrics import VERBS

pytestmark = pytest.mark.e2e

FLOOD = 5000
METRICS_BOUND = 50_000
"""Bytes of ``/metrics`` at most (measured: 12.7 KB before the flood, 15.7 KB after it, 11 MB
after it before the labels were bounded; 12.9 KB with the 12 huge selectors)."""


ODD_METHODS = ("PROPFIND", "PURGE", "LOCK", "REPORT", "SEARCH")
"""Methods aiohttp's parser takes (it refuses made-up ones) and no Kubernetes client sends."""


def _label_values(text: str, label: str) -> set[str]:
    return set(re.findall(rf'[{{,]{label}="([^"]*)"', text))


async def _reader_token(admin: kubeapi.RawClient, namespace: str) -> str:
    """A service account that may list and watch ConfigMaps in ``namespace``, and its token."""
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    await admin.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "reader"}}
    )
    rule = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"]}
    await admin.create(
        f"{rbac}/namespaces/{namespace}/roles", {"metadata": {"name": "reader"}, "rules": [rule]}
    )
    await admin.create(
        f"{rbac}/namespaces/{namespace}/rolebindings",
        {
            "metadata": {"name": "reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
    )
    answer = await admin.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/reader/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
    )
    return str(answer["status"]["token"])


async def _flood(base: str, statuses: Counter[int]) -> None:
    """``FLOOD`` requests without a token, each for another made-up resource (every tenth
    with an odd method too), by 32 workers (not 5,000 tasks at once, whose scheduling would
    slow this process's own measurements)."""
    numbers = iter(range(FLOOD))
    async with aiohttp.ClientSession() as session:

        async def worker() -> None:
            for i in numbers:
                method = ODD_METHODS[i // 10 % len(ODD_METHODS)] if i % 10 == 0 else "GET"
                path = f"/apis/x{i}.example/v1/r{i}q"
                if i % 3 == 0:
                    path = f"/apis/x{i}.example/v1/namespaces/n{i}/r{i}q"
                async with session.request(method, base + path) as answer:
                    await answer.read()
                    statuses[answer.status] += 1

        await asyncio.gather(*(worker() for _ in range(32)))


async def test_a_flood_of_made_up_resources_keeps_metrics_small_and_lists_fast(
    admin_api: kubeapi.RawClient,
    namespace: str,
    start_sidecar: Callable[..., Sidecar],
) -> None:
    await kubeapi.create_configmaps(admin_api, namespace=namespace, count=50)
    token = await _reader_token(admin_api, namespace)
    # A long decision cache: the reader's LISTs are answered from the cache alone.
    sidecar = start_sidecar(extra=["--client-auth=delegated", "--auth-cache-ttl=600"])
    collection = f"{sidecar.url}/api/v1/namespaces/{namespace}/configmaps"
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    async with aiohttp.ClientSession(headers=headers) as reader:
        async with reader.get(collection) as listed:
            assert listed.status == 200  # the shape is learned and filled
        cached = {"resource": "v1/configmaps", "source": "cache"}
        before = await asyncio.to_thread(sidecar.metric, "warmwatch_list_bytes_total", cached)
        baseline = len(await asyncio.to_thread(sidecar.metrics))

        statuses: Counter[int] = Counter()
        flood = asyncio.create_task(_flood(sidecar.url, statuses))
        latencies: list[float] = []
        sizes: list[int] = []
        scrapes: list[float] = []

        async def scrape() -> None:
            """Every half second, as a Prometheus might, and once more after the flood, when
            ``/metrics`` is largest."""
            while True:
                over = flood.done()
                started = time.monotonic()
                sizes.append(len(await asyncio.to_thread(sidecar.metrics)))
                scrapes.append(time.monotonic() - started)
                if over:
                    return
                await asyncio.sleep(0.5)

        async def read(scraping: asyncio.Task[None]) -> None:
            """Another client's cached LISTs, for as long as the scrapes go on."""
            while not scraping.done():
                started = time.monotonic()
                async with reader.get(collection) as listed:
                    assert listed.status == 200
                    assert len((await listed.json())["items"]) == 50
                latencies.append(time.monotonic() - started)
                await asyncio.sleep(0.05)

        scraping = asyncio.create_task(scrape())
        await asyncio.gather(flood, scraping, read(scraping))

    text = await asyncio.to_thread(sidecar.metrics)
    print(
        f"/metrics {baseline:,} bytes before, at most {max(sizes, default=0):,} during "
        f"({len(sizes)} scrapes, slowest {max(scrapes, default=0):.3f}s), {len(text):,} after; "
        f"{len(latencies)} cached LISTs, slowest {sorted(latencies)[-5:]}s; answers {dict(statuses)}"
    )
    assert statuses == {403: FLOOD}  # the apiserver's answers, passed through
    assert await asyncio.to_thread(sidecar.metric, "warmwatch_list_bytes_total", cached) > before, (
        "the reader's LISTs were not answered from the cache"
    )
    assert len(sizes) >= 3
    assert max(sizes) < METRICS_BOUND and len(text) < METRICS_BOUND
    assert max(latencies) < 1.0
    # Not a series per path or method: the made-up values are "other".
    assert "example" not in text
    assert _label_values(text, "resource") <= {"v1/configmaps", "other"}
    assert _label_values(text, "verb") <= VERBS | {"other"}
    odd = {"verb": "other", "code": "403"}
    assert sidecar.metric("warmwatch_passthrough_requests_total", odd) == FLOOD // 10
    passed = {"resource": "other", "source": "passthrough"}
    lists = FLOOD - FLOOD // 10  # (an odd method is no LIST)
    assert sidecar.metric("warmwatch_list_duration_seconds_count", passed) == lists


def _selector(i: int) -> str:
    """A label selector of nearly 4 KiB (the longest a learned collection's key may be) that
    every ConfigMap of the test matches."""
    values = ",".join(f"not-{i:02d}-{j:04d}" for j in range(340))
    return f"app notin ({values})"


async def test_huge_selectors_are_named_by_shape_id(
    admin_api: kubeapi.RawClient, namespace: str, start_sidecar: Callable[..., Sidecar]
) -> None:
    await kubeapi.create_configmaps(admin_api, namespace=namespace, count=5)
    sidecar = start_sidecar()
    selectors = [_selector(i) for i in range(12)]
    assert all(3900 < len(s) < 4096 for s in selectors)
    collection = f"{sidecar.url}/api/v1/namespaces/{namespace}/configmaps"
    async with aiohttp.ClientSession(headers={"Accept": "application/json"}) as session:
        for selector in selectors:
            async with session.get(collection, params={"labelSelector": selector}) as listed:
                assert listed.status == 200
                assert len((await listed.json())["items"]) == 5
    text = await asyncio.to_thread(sidecar.metrics)
    ids = _label_values(text, "shape")
    print(f"/metrics {len(text):,} bytes with {len(ids)} shapes")
    assert len(ids) == 12 and all(i.isdigit() for i in ids)
    assert "notin" not in text and "not-00-0000" not in text
    assert len(text) < METRICS_BOUND
    # The log says once what each id stands for (selectors cut), so an operator can look up
    # a series' selectors.
    described = [
        line
        for line in Path(sidecar.log).read_text().splitlines()
        if re.search(r"shape \d+ \(new, learned\): v1/configmaps namespace=", line)
    ]
    assert len(described) == 12
    assert {re.search(r"shape (\d+) ", line)[1] for line in described} == ids  # type: ignore[index]
    assert all(len(line) < 1000 and 'labelSelector="app notin (not-' in line for line in described)


async def test_discovered_resources_keep_their_name_when_passed_through(
    admin_api: kubeapi.RawClient, start_sidecar: Callable[..., Sidecar]
) -> None:
    sidecar = start_sidecar()
    listed = await admin_api.get("/apis/apps/v1/deployments", limit="1")
    exact = {
        "resourceVersion": listed["metadata"]["resourceVersion"],
        "resourceVersionMatch": "Exact",  # passed through: the cache answers no exact LIST
    }
    deployments = f"{sidecar.url}/apis/apps/v1/deployments"
    aggregated = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
    count = "warmwatch_list_duration_seconds_count"
    named = {"resource": "apps/v1/deployments", "source": "passthrough"}
    other = {"resource": "other", "source": "passthrough"}
    async with aiohttp.ClientSession(headers={"Accept": "application/json"}) as session:
        # Before any discovery: a resource warmwatch holds no shape of is not named yet.
        async with session.get(deployments, params=exact) as answer:
            assert answer.status == 200
        assert sidecar.metric(count, other) == 1
        async with session.get(f"{sidecar.url}/apis", headers={"Accept": aggregated}) as answer:
            assert answer.status == 200
            assert "APIGroupDiscoveryList" in answer.headers["Content-Type"]
        # The document is read once it is whole, just after the client has it.
        deadline = time.monotonic() + 10
        while sidecar.metric(count, named) == 0:
            assert time.monotonic() < deadline, "apps/v1/deployments never named"
            async with session.get(deployments, params=exact) as answer:
                assert answer.status == 200
            await asyncio.sleep(0.05)
        before = sidecar.metric(count, other)
        async with session.get(f"{sidecar.url}/apis/x1.example/v1/r1q") as answer:
            assert answer.status == 404
        assert sidecar.metric(count, other) == before + 1
