"""Discovery copies are bounded, against the real apiserver (docs/design.md §5): a query that
changes no answer makes no copy of its own, in ``none`` and ``delegated`` mode, while other
clients are answered within 1 s; copies that do differ (by Accept) stop at the count and byte
bounds; background revalidation of the apiserver's whole discovery set (150 CRD groups) stays
under ``DiscoverySettings.revalidation_rate``."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import orjson
import pytest

from loadtest import kubeapi
from loadtest.sidecar import Sidecar
from proxy.upstream.discovering import DiscoverySettings
from tests.e2e.test_discovery import AGGREGATED, CRD_PATH, crd, groups

pytestmark = pytest.mark.e2e

FLOOD_GROWTH_MAX = 16 * 2**20
"""What 1,000 ``/version?n=i`` and 30 ``/openapi/v2?n=i`` may add to the database: one copy of
each (``/openapi/v2`` is 1.6-4.4 MB here). Before the bounds: 30 copies of ``/openapi/v2``,
47 MiB and more."""

CRD_GROUPS = 150
MAX_AGE = 4.0
"""Copies are due every 2 s, passes run every second: the unbounded loop revalidated the
~350 mutable copies of the set every 2 s (over 150 a second)."""


def stored_keys(db: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as connection:
        return [row[0] for row in connection.execute("SELECT key FROM discovery ORDER BY key")]


def db_size(db: Path) -> int:
    """The database's size as its pages, the WAL's included: what the file holds once
    checkpointed (pages freed by a replaced row are reused, not added)."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as connection:
        (pages,) = connection.execute("PRAGMA page_count").fetchone()
        (page_size,) = connection.execute("PRAGMA page_size").fetchone()
        return int(pages) * int(page_size)


async def flood(session: aiohttp.ClientSession, paths: list[str], *, at_once: int) -> list[int]:
    """GET each path, ``at_once`` in flight; their status codes."""
    gate = asyncio.Semaphore(at_once)

    async def one(path: str) -> int:
        async with gate, session.get(path) as response:
            await response.read()
            return response.status

    return await asyncio.gather(*(one(path) for path in paths))


async def slowest_while(
    work: Awaitable[list[int]], base: str, probes: list[tuple[str, dict[str, str]]]
) -> tuple[list[int], float]:
    """Run ``work``; meanwhile another client (a thread of its own, so this loop's own work
    does not delay it) GETs each probe again and again, each answer 200. ``work``'s result,
    and the longest a probe took."""
    done = threading.Event()

    def other_client() -> float:
        slowest = 0.0
        while not done.is_set():
            for path, headers in probes:
                started = time.monotonic()
                request = urllib.request.Request(f"{base}{path}", headers=headers)
                with urllib.request.urlopen(request, timeout=10) as answer:
                    assert answer.status == 200
                    answer.read()
                slowest = max(slowest, time.monotonic() - started)
            done.wait(0.05)
        return slowest

    probing = asyncio.ensure_future(asyncio.to_thread(other_client))
    try:
        result = await work
    finally:
        done.set()
    return result, await probing


async def test_queries_make_no_copies_none_mode(
    start_sidecar: Callable[..., Sidecar], namespace: str
) -> None:
    sidecar = start_sidecar(resources=[f"v1/configmaps@{namespace}"])
    before = db_size(sidecar.db)
    probes = [
        ("/apis", {"Accept": AGGREGATED}),
        (f"/api/v1/namespaces/{namespace}/configmaps", {}),
    ]
    async with aiohttp.ClientSession(sidecar.url) as session:
        paths = [f"/version?n={i}" for i in range(1000)]
        paths += [f"/openapi/v2?n={i}" for i in range(30)]
        work = flood(session, paths, at_once=16)
        codes, slowest = await slowest_while(work, sidecar.url, probes)
    assert set(codes) == {200}
    assert slowest < 1.0, f"another client waited {slowest:.2f} s"
    keys = stored_keys(sidecar.db)
    assert [key.partition("?")[0] for key in keys] == ["/apis", "/openapi/v2", "/version"], keys
    assert sidecar.metric("warmwatch_discovery_copies") == 3
    held = sidecar.metric("warmwatch_discovery_copy_bytes")
    grown = db_size(sidecar.db) - before
    assert grown < FLOOD_GROWTH_MAX, f"the database grew by {grown} bytes"
    # Answered from the one copy, not passed through each time.
    assert sidecar.metric("warmwatch_discovery_answers_total", {"source": "copy"}) > 900
    print(
        f"\nnone: {len(keys)} copies of {held / 2**20:.1f} MiB, database "
        f"+{grown / 2**20:.1f} MiB, slowest other client {slowest:.3f} s"
    )


async def test_queries_make_no_copies_delegated_anonymous(
    start_sidecar: Callable[..., Sidecar],
) -> None:
    """An anonymous client in ``delegated`` mode (passed through whole; the apiserver lets
    anyone read ``/version``): each answer is stored, as the one copy of ``/version``."""
    sidecar = start_sidecar(extra=["--client-auth=delegated"])
    async with aiohttp.ClientSession(sidecar.url) as session:
        paths = [f"/version?n={i}" for i in range(1000)]
        work = flood(session, paths, at_once=16)
        codes, slowest = await slowest_while(work, sidecar.url, [("/version", {"Accept": "*/*"})])
    assert set(codes) == {200}
    assert slowest < 1.0, f"another client waited {slowest:.2f} s"
    keys = stored_keys(sidecar.db)
    assert [key.partition("?")[0] for key in keys] == ["/version"], keys
    assert sidecar.metric("warmwatch_discovery_copies") == 1
    print(f"\ndelegated: {len(keys)} copies, slowest other {slowest:.3f} s")


async def test_accept_headers_stay_within_the_bounds(
    start_sidecar: Callable[..., Sidecar],
) -> None:
    """Each Accept header is a copy of its own (the answer depends on it): 30 of
    ``/openapi/v2`` and 100 of ``/version`` fill the bounds and stop there."""
    max_bytes, max_copies = 8 * 2**20, 20
    sidecar = start_sidecar(
        extra=[f"--discovery-max-bytes={max_bytes}", f"--discovery-max-copies={max_copies}"]
    )
    before = db_size(sidecar.db)
    async with aiohttp.ClientSession(sidecar.url) as session:
        gate = asyncio.Semaphore(8)

        async def one(path: str, index: int) -> int:
            accept = f"application/json;q=0.{index:03d}"
            async with gate, session.get(path, headers={"Accept": accept}) as response:
                await response.read()
                return response.status

        codes = await asyncio.gather(
            *(one("/openapi/v2", index) for index in range(1, 31)),
            *(one("/version", index) for index in range(1, 101)),
        )
    assert set(codes) == {200}
    copies = sidecar.metric("warmwatch_discovery_copies")
    held = sidecar.metric("warmwatch_discovery_copy_bytes")
    assert copies == len(stored_keys(sidecar.db)) <= max_copies
    assert held <= max_bytes
    assert sidecar.metric("warmwatch_discovery_copies_dropped_total", {"reason": "no room"}) > 0
    grown = db_size(sidecar.db) - before
    assert grown < 2 * max_bytes, f"the database grew by {grown} bytes"
    print(
        f"\naccept: {copies:.0f} copies of {held / 2**20:.1f} MiB, "
        f"database +{grown / 2**20:.1f} MiB"
    )


@pytest.fixture
async def crd_groups(admin_api: kubeapi.RawClient) -> AsyncIterator[list[str]]:
    """150 CRDs, one group each, served: the apiserver's discovery set of a real cluster."""
    suffix = uuid.uuid4().hex[:6]
    made = [f"g{index:03d}.{suffix}.example.org" for index in range(CRD_GROUPS)]
    await admin_api.gather(admin_api.create(CRD_PATH, crd(group)) for group in made)
    try:
        await served(admin_api.session, made)
        yield made
    finally:
        await admin_api.gather(admin_api.delete(f"{CRD_PATH}/gadgets.{group}") for group in made)
        deadline = time.monotonic() + 120  # the plane as found, for the tests after this one
        while set(made) & await groups(admin_api.session, ""):
            assert time.monotonic() < deadline, "the CRDs were not gone within 120 s"
            await asyncio.sleep(0.5)


async def served(session: aiohttp.ClientSession, made: list[str]) -> None:
    """Until each group is in every discovery the apiserver serves (aggregated, legacy,
    openapi v3: the CRD controllers fill them one after the other), 120 s at most."""
    deadline = time.monotonic() + 120

    async def legacy(group: str) -> bool:
        async with session.get(f"/apis/{group}/v1") as response:
            await response.read()
            return response.status == 200

    async def openapi_v3() -> set[str]:
        async with session.get("/openapi/v3") as response:
            return set(orjson.loads(await response.read())["paths"])

    while not (
        set(made) <= await groups(session, "")
        and all(await asyncio.gather(*(legacy(group) for group in made)))
        and {f"apis/{group}/v1" for group in made} <= await openapi_v3()
    ):
        assert time.monotonic() < deadline, "the CRDs were not served within 120 s"
        await asyncio.sleep(0.5)


async def read_discovery_set(session: aiohttp.ClientSession) -> int:
    """GET every document a client of legacy and aggregated discovery, openapi v2 and every
    group-version's openapi v3 reads; how many."""
    json = "application/json"
    documents = [("/version", json), ("/api", AGGREGATED), ("/apis", AGGREGATED)]
    documents += [(path, json) for path in ("/api", "/apis", "/api/v1", "/openapi/v2")]
    documents.append(("/openapi/v3", json))
    async with session.get("/apis", headers={"Accept": json}) as response:
        for group in orjson.loads(await response.read())["groups"]:
            documents.append((f"/apis/{group['name']}", json))
            documents += [(f"/apis/{v['groupVersion']}", json) for v in group["versions"]]
    async with session.get("/openapi/v3", headers={"Accept": json}) as response:
        listed = orjson.loads(await response.read())["paths"].values()
    documents += [(document["serverRelativeURL"], json) for document in listed]
    for path, accept in documents:
        async with session.get(path, headers={"Accept": accept}) as response:
            assert response.status == 200, (path, response.status)
            await response.read()
    return len(documents)


async def test_background_revalidation_stays_under_its_rate(
    start_sidecar: Callable[..., Sidecar], crd_groups: list[str]
) -> None:
    sidecar = start_sidecar(extra=[f"--discovery-max-age={MAX_AGE}"])
    async with aiohttp.ClientSession(sidecar.url) as session:
        documents = await read_discovery_set(session)
    copies = sidecar.metric("warmwatch_discovery_copies")
    assert documents >= 2 * CRD_GROUPS + 150 and copies == documents
    assert copies <= DiscoverySettings().max_copies
    await asyncio.sleep(MAX_AGE)  # every copy is due by now
    counted = "warmwatch_discovery_revalidations_total"
    first, started = sidecar.metric(counted), time.monotonic()
    await asyncio.sleep(15.0)  # the measuring window
    done, window = sidecar.metric(counted) - first, time.monotonic() - started
    rate = DiscoverySettings().revalidation_rate
    per_pass = rate * MAX_AGE / 4  # a pass may fall at either end of the window
    assert 0 < done <= rate * window + per_pass, f"{done:.0f} revalidations in {window:.1f} s"
    print(
        f"\n{documents} documents ({copies:.0f} copies, "
        f"{sidecar.metric('warmwatch_discovery_copy_bytes') / 2**20:.1f} MiB): "
        f"{done:.0f} revalidations in {window:.1f} s, {done / window:.1f}/s"
    )
