"""Size bounds against the real apiserver (found by a probe):

- the event log of a learned collection holds at most ``--retention-bytes``: 150 updates of
  an ~878 KiB ConfigMap grew the database by 141 MiB, retention being by count and age only;
- a request whose selectors are longer than a learned shape's key may be is passed through,
  not learned: 12 collections learned from ~683 KiB label selectors took warmwatch from 50 to
  234 MiB;
- the database, which holds Secrets, its WAL and SHM files are 0600 under the usual umask.
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yarl

from loadtest import kubeapi
from loadtest.cluster import ControlPlane
from loadtest.sidecar import Sidecar

pytestmark = pytest.mark.e2e

MIB = 2**20
OBJECT_BYTES = 878 * 1024
UPDATES = 150
SMALL_RETENTION = 16 * MIB
DEFAULT_RETENTION = 256 * MIB
GROWTH_SLACK = 24 * MIB
"""The database and its WAL beyond the log's bound: the object itself, pages freed by a trim
and not yet reused, and the WAL (a commit of this object is ~60 pages of 16 KiB; the WAL is
copied back every second and restarts after it)."""
SELECTOR_BYTES = 683 * 1024
SELECTOR_CLIENTS = 12
RSS_GROWTH_BOUND = 128 * MIB
"""What the 12 clients with huge selectors may add to warmwatch's RSS (stated in the README:
Limits): passed through, each holds a few copies of its ~683 KiB URL while it is in flight
(aiohttp's parser, yarl's parsed URLs; ~100 MiB for the 12). Learned before, they added
~200 MiB for good."""


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The usual umask, which the sidecar started meanwhile inherits."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def file_bytes(db: Path) -> int:
    """The database and its WAL, as ``db_size_bytes`` + ``db_wal_size_bytes``."""
    return sum(
        Path(f"{db}{suffix}").stat().st_size
        for suffix in ("", "-wal")
        if Path(f"{db}{suffix}").exists()
    )


async def first_event(watch: aiohttp.ClientResponse) -> Any:
    """The first event of a watch stream, however long its line (an 878 KiB object is
    longer than aiohttp's line limit)."""
    line = b""
    async with asyncio.timeout(10):
        while b"\n" not in line:
            line += await watch.content.readany()
    return orjson.loads(line.partition(b"\n")[0])


async def wait_for(condition: Callable[[], bool], *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        await asyncio.sleep(0.2)


@pytest.mark.usefixtures("umask_022")
@pytest.mark.parametrize("retention", [SMALL_RETENTION, DEFAULT_RETENTION])
async def test_the_event_log_of_large_objects_stays_within_its_bytes(
    retention: int,
    namespace: str,
    admin_api: kubeapi.RawClient,
    start_sidecar: Callable[..., Sidecar],
) -> None:
    """150 updates of an 878 KiB ConfigMap through a learned collection (129 MiB of events):
    the database grows by the log's bound and a little, not by the updates; a client resuming
    from before the log's start gets 410 and lists the latest state from the cache. The
    files are 0600 under umask 022."""
    extra = [] if retention == DEFAULT_RETENTION else [f"--retention-bytes={retention}"]
    sidecar = start_sidecar(extra=extra)
    collection = f"/api/v1/namespaces/{namespace}/configmaps"
    body = kubeapi.configmap(name="big", namespace=namespace, size=OBJECT_BYTES)
    await admin_api.create(collection, body)
    async with kubeapi.RawClient(base_url=sidecar.url) as client:
        await client.get(collection)  # learns the collection, filled before it answers
        learned = {"resource": "v1/configmaps", "source": "cache"}
        await client.get(collection)
        assert sidecar.metric("warmwatch_list_bytes_total", learned) > OBJECT_BYTES
        before = file_bytes(sidecar.db)
        rvs = []
        for i in range(UPDATES):
            body["data"]["payload"] = f"{i:06d}" + "x" * (OBJECT_BYTES - 6)
            updated = await admin_api.request("PUT", f"{collection}/big", body=body)
            rvs.append(updated["metadata"]["resourceVersion"])
        await wait_for(
            lambda: sidecar.metric("warmwatch_shape_resource_version") >= int(rvs[-1]),
            timeout=60,
            what=f"warmwatch at RV {rvs[-1]}",
        )
        grown = file_bytes(sidecar.db) - before
        wal = Path(f"{sidecar.db}-wal").stat().st_size
        print(
            f"--retention-bytes {retention / MIB:.0f} MiB: the database and WAL grew by "
            f"{grown / MIB:.1f} MiB (WAL {wal / MIB:.1f} MiB) for {UPDATES} updates of "
            f"{OBJECT_BYTES / MIB:.2f} MiB"
        )
        assert grown < min(retention, UPDATES * OBJECT_BYTES) + GROWTH_SLACK
        modes = {
            suffix: stat.S_IMODE(Path(f"{sidecar.db}{suffix}").stat().st_mode)
            for suffix in ("", "-wal", "-shm")
        }
        assert modes == {"": 0o600, "-wal": 0o600, "-shm": 0o600}
        if retention == DEFAULT_RETENTION:
            return  # 129 MiB of events: nothing to trim
        trimmed = {"resource": "v1/configmaps", "reason": "bytes"}
        assert sidecar.metric("warmwatch_events_trimmed_total", trimmed) > UPDATES - 20
        # Resumable: from a trimmed RV 410, as the apiserver's expired RVs; then a list from
        # the cache has the latest version.
        async with client.session.get(
            collection, params={"watch": "1", "resourceVersion": rvs[0]}
        ) as watch:
            assert watch.status == 200
            event = await first_event(watch)
        assert (event["type"], event["object"]["code"]) == ("ERROR", 410), event
        listed = await client.get(collection)
        assert [i["metadata"]["resourceVersion"] for i in listed["items"]] == [rvs[-1]]
        # A client within the log resumes from it.
        async with client.session.get(
            collection, params={"watch": "1", "resourceVersion": rvs[-2]}
        ) as watch:
            event = await first_event(watch)
        assert (event["type"], event["object"]["metadata"]["resourceVersion"]) == (
            "MODIFIED",
            rvs[-1],
        )


def huge_selector(namespace: str) -> str:
    """``app in (v000000,...,hit)``: ~683 KiB, valid for the apiserver (each value at most
    63 characters), selecting the one ConfigMap labelled ``app=hit``."""
    values = [f"v{i:06d}" for i in range(SELECTOR_BYTES // 8)]
    return f"app in ({','.join(values)},hit-{namespace})"


async def listed(session: aiohttp.ClientSession, base: str, path: str, selector: str) -> Any:
    # Commas and parentheses are left as they are: the request line stays ~683 KiB.
    query = "labelSelector=" + urllib.parse.quote(selector, safe="(),")
    async with session.get(yarl.URL(f"{base}{path}?{query}", encoded=True)) as answer:
        return answer.status, await answer.json()


async def test_huge_selectors_are_passed_through_not_learned(
    plane: ControlPlane,
    namespace: str,
    admin_api: kubeapi.RawClient,
    start_sidecar: Callable[..., Sidecar],
) -> None:
    """12 clients at once, each with its own ~683 KiB label selector: each gets the
    apiserver's answer, no shape is learned, and warmwatch's RSS stays within a bound."""
    sidecar = start_sidecar()
    paths = [f"/api/v1/namespaces/{namespace}-{i}/configmaps" for i in range(SELECTOR_CLIENTS)]
    for i in range(SELECTOR_CLIENTS):
        await kubeapi.ensure_namespace(admin_api, f"{namespace}-{i}")
        hit = kubeapi.configmap(
            name="hit", namespace=f"{namespace}-{i}", labels={"app": f"hit-{namespace}-{i}"}
        )
        await admin_api.create(paths[i], hit)
    selectors = [huge_selector(f"{namespace}-{i}") for i in range(SELECTOR_CLIENTS)]
    assert all(SELECTOR_BYTES <= len(s) < SELECTOR_BYTES + 64 for s in selectors)
    baseline = sidecar.rss_bytes()
    async with aiohttp.ClientSession() as session:
        through = await asyncio.gather(
            *(listed(session, sidecar.url, p, s) for p, s in zip(paths, selectors, strict=True))
        )
    rss = sidecar.rss_bytes()
    direct = []
    ssl_context = kubeapi.client_ssl(plane.pki, identity="admin")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl_context)) as session:
        for path, selector in zip(paths, selectors, strict=True):
            direct.append(await listed(session, plane.server, path, selector))
    print(f"RSS {baseline / MIB:.0f} MiB before the 12 huge selectors, {rss / MIB:.0f} after")
    for (status, answer), (api_status, api_answer) in zip(through, direct, strict=True):
        assert (status, api_status) == (200, 200)
        assert [i["metadata"]["name"] for i in answer["items"]] == ["hit"]
        assert answer["items"] == api_answer["items"]
    limited = {"reason": "key_bytes"}
    assert sidecar.metric("warmwatch_shape_limit_total", limited) == SELECTOR_CLIENTS
    assert sidecar.metric("warmwatch_upstream_relists_total") == 0  # nothing learned
    assert rss - baseline < RSS_GROWTH_BOUND
