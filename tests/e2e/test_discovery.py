"""Discovery through warmwatch against the real apiserver (docs/design.md §5): answered from
copies the apiserver confirmed lately, new CRDs made elsewhere visible within the copies' age,
a CRD created through warmwatch visible through it as soon as at the apiserver."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
import pytest

from loadtest import kubeapi
from loadtest.sidecar import Sidecar

pytestmark = pytest.mark.e2e

AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
MAX_AGE = 3.0
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def crd(group: str) -> dict[str, Any]:
    return kubeapi.custom_resource_definition(group=group, kind="Gadget")


async def groups(session: aiohttp.ClientSession, base: str, **kwargs: Any) -> set[str]:
    async with session.get(f"{base}/apis", headers={"Accept": AGGREGATED}, **kwargs) as response:
        assert response.status == 200, await response.text()
        return {item["metadata"]["name"] for item in orjson.loads(await response.read())["items"]}


async def until(probe: Callable[[], Any], *, timeout: float, what: str) -> float:
    """Seconds until ``await probe()`` is true."""
    started = time.monotonic()
    while not await probe():
        assert time.monotonic() - started < timeout, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def test_discovery_from_confirmed_copies(
    start_sidecar: Callable[..., Sidecar], admin_api: kubeapi.RawClient
) -> None:
    sidecar = start_sidecar(extra=[f"--discovery-max-age={MAX_AGE}"])
    made: list[str] = []
    async with aiohttp.ClientSession() as session:

        async def through() -> set[str]:
            return await groups(session, sidecar.url)

        async def at_apiserver() -> set[str]:
            return await groups(admin_api.session, "")  # the session has its base URL

        try:
            first = await through()
            assert first == await at_apiserver()
            copies = sidecar.metric("warmwatch_discovery_answers_total", {"source": "copy"})
            for _ in range(5):
                assert await through() == first
            # answered without asking the apiserver
            assert (
                sidecar.metric("warmwatch_discovery_answers_total", {"source": "copy"})
                >= copies + 4
            )

            # A CRD made by someone else: visible through warmwatch within the copies' age.
            elsewhere = f"g{uuid.uuid4().hex[:8]}.example.org"
            made.append(elsewhere)
            await admin_api.create(CRD_PATH, crd(elsewhere))
            await until(
                lambda: _has(at_apiserver, elsewhere), timeout=30, what="the apiserver's discovery"
            )
            late = await until(
                lambda: _has(through, elsewhere), timeout=MAX_AGE + 10, what="warmwatch's copy"
            )
            assert late <= MAX_AGE + 5

            # A CRD created through warmwatch: visible through it as soon as at the apiserver.
            ours = f"g{uuid.uuid4().hex[:8]}.example.org"
            made.append(ours)
            async with session.post(
                f"{sidecar.url}{CRD_PATH}",
                data=orjson.dumps(crd(ours)),
                headers={"Content-Type": "application/json"},
            ) as response:
                assert response.status == 201, await response.text()
            await until(lambda: _has(at_apiserver, ours), timeout=30, what="the new CRD")
            assert ours in await through()
        finally:
            for group in made:
                await admin_api.delete(f"{CRD_PATH}/gadgets.{group}")


async def _has(probe: Callable[[], Any], group: str) -> bool:
    return group in await probe()
