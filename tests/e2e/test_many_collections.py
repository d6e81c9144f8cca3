"""Many collections and many clients: nothing a controller or a client does starves warmwatch
of the apiserver (docs/design.md §9, upstream connections by purpose).

Each upstream watch holds one HTTP/1.1 connection. In one shared pool of 100 connections,
kube-controller-manager's garbage collector and quota controller, which watch every resource
type, took them all in a cluster with 150 CRDs (211 collections): it never synced, and nothing
else reached the apiserver. One client could do the same on purpose, with passed-through
watches or with LISTs that each learn a collection. Here each of those runs against the real
apiserver, and a passed-through request of another client is answered within a second
throughout.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from loadtest import kubeapi
from loadtest.cluster import ControlPlane
from loadtest.sidecar import Sidecar
from tests.e2e.conftest import StartKcm

pytestmark = pytest.mark.e2e

CRDS = 150
"""A modest real cluster's custom resource types."""
GROUPS = 50
"""...in this many API groups (three kinds each), as operators ship them."""
CRD_LABEL = {"warmwatch-e2e": "many-collections"}

MANY_CONTROLLERS = ("garbagecollector", "resourcequota", "deployment", "replicaset")
"""The controllers that watch every resource type (garbage collector, quota), and two more."""

SYNC_TIMEOUT = 60.0
"""Bounds a failure; a working start takes seconds."""

ANSWER_BOUND = 1.0
"""A passed-through request of another client is answered within this, throughout."""


# -- the stage ---------------------------------------------------------------------------------


def _crd(group: int, kind: int) -> dict[str, Any]:
    return kubeapi.custom_resource_definition(
        group=f"g{group}.many.warmwatch.test", kind=f"Thing{kind}", labels=CRD_LABEL
    )


CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CRD_SELECTOR = ",".join(f"{k}={v}" for k, v in CRD_LABEL.items())


async def _established(admin: kubeapi.RawClient) -> int:
    listed = await admin.get(CRD_PATH, labelSelector=CRD_SELECTOR)
    return sum(
        any(
            c["type"] == "Established" and c["status"] == "True"
            for c in item.get("status", {}).get("conditions") or []
        )
        for item in listed["items"]
    )


@pytest.fixture
async def many_crds(admin_api: kubeapi.RawClient) -> AsyncIterator[int]:
    """150 CRDs, established and in discovery; deleted again afterwards (the plane is shared)."""
    per_group = CRDS // GROUPS
    await admin_api.gather(
        admin_api.create(CRD_PATH, _crd(g, k)) for g in range(GROUPS) for k in range(per_group)
    )
    try:
        deadline = time.monotonic() + 120
        while await _established(admin_api) < CRDS or not await _in_discovery(admin_api):
            assert time.monotonic() < deadline, "150 CRDs not established within 120 s"
            await asyncio.sleep(0.5)
        yield CRDS
    finally:
        await admin_api.request(
            "DELETE", CRD_PATH, params={"labelSelector": CRD_SELECTOR}, ok=(200,)
        )
        deadline = time.monotonic() + 120
        while (await admin_api.get(CRD_PATH, labelSelector=CRD_SELECTOR))["items"]:
            assert time.monotonic() < deadline, "CRDs not deleted within 120 s"
            await asyncio.sleep(0.5)


async def _in_discovery(admin: kubeapi.RawClient) -> bool:
    groups = (await admin.get("/apis"))["groups"]
    return sum(g["name"].endswith(".many.warmwatch.test") for g in groups) == GROUPS


@dataclass
class Probe:
    """Another client's passed-through request (a GET of one object), every 0.2 s while the
    block runs; the answers' times."""

    url: str
    headers: dict[str, str] = field(default_factory=dict)
    times: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=10 * ANSWER_BOUND)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                started = time.monotonic()
                try:
                    async with session.get(self.url, headers=self.headers) as answer:
                        await answer.read()
                        if answer.status != 200:
                            self.failures.append(f"{answer.status}")
                except (aiohttp.ClientError, TimeoutError) as error:
                    self.failures.append(repr(error))
                self.times.append(time.monotonic() - started)
                await asyncio.sleep(0.2)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Probe]:
        task = asyncio.create_task(self._run(), name="passthrough probe")
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def check(self, what: str) -> None:
        assert self.times, f"{what}: the probe made no request"
        slowest = max(self.times)
        print(f"{what}: {len(self.times)} passthrough GETs, slowest {slowest * 1000:.0f} ms")
        assert not self.failures, f"{what}: {self.failures[:5]}"
        assert slowest < ANSWER_BOUND, f"{what}: a passthrough GET took {slowest:.2f} s"


# -- kube-controller-manager with 150 CRDs ------------------------------------------------------


async def test_controller_manager_with_150_crds_syncs_and_restarts_offline(
    plane: ControlPlane,
    many_crds: int,
    start_sidecar: Callable[..., Sidecar],
    start_kcm: StartKcm,
) -> None:
    """The garbage collector and quota controller watch every resource type. Through a fresh
    warmwatch they sync within twice their direct time plus 5 s, a passthrough GET is answered
    within a second throughout, and a restart with the apiserver down syncs from the cache."""
    direct_kcm = start_kcm(kubeconfig=plane.admin_kubeconfig, controllers=MANY_CONTROLLERS)
    direct = await asyncio.to_thread(direct_kcm.wait_synced, SYNC_TIMEOUT)
    direct_kcm.stop()
    print(f"kube-controller-manager with {many_crds} CRDs, directly: synced in {direct:.1f} s")

    sidecar = start_sidecar()
    probe = Probe(f"{sidecar.url}/api/v1/namespaces/default")
    async with probe.running():
        via_kcm = start_kcm(kubeconfig=sidecar.kubeconfig, controllers=MANY_CONTROLLERS)
        via = await asyncio.to_thread(via_kcm.wait_synced, SYNC_TIMEOUT)
    print(f"...through a fresh warmwatch: synced in {via:.1f} s")
    probe.check("while it synced through warmwatch")
    held = sidecar.metric("warmwatch_upstream_connections", {"purpose": "reflector"})
    print(f"...warmwatch holds {held:.0f} upstream watches")
    assert held > 100 + many_crds // 2  # past the old shared pool of 100
    assert sidecar.metric("warmwatch_upstream_busy_total") == 0
    assert via <= 2 * direct + 5, f"through warmwatch {via:.1f} s, directly {direct:.1f} s"
    via_kcm.stop()

    assert sidecar.stop() == 0
    plane.stop_apiserver()
    try:
        sidecar.restart(wait_ready=True)
        offline_kcm = start_kcm(kubeconfig=sidecar.kubeconfig, controllers=MANY_CONTROLLERS)
        offline = await asyncio.to_thread(offline_kcm.wait_synced, SYNC_TIMEOUT)
        print(f"...restarted with the apiserver down: synced from the cache in {offline:.1f} s")
        assert not plane.status().get("kube-apiserver")  # really synced offline
        offline_kcm.stop()
    finally:
        plane.start_apiserver()


# -- one client on purpose ----------------------------------------------------------------------


async def _reader(admin: kubeapi.RawClient, namespace: str, account: str) -> str:
    """A service account that may list and watch ConfigMaps in ``namespace``; its token."""
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    await admin.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": account}}
    )
    await admin.create(
        f"{rbac}/namespaces/{namespace}/roles",
        {
            "metadata": {"name": account},
            "rules": [
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}
            ],
        },
    )
    await admin.create(
        f"{rbac}/namespaces/{namespace}/rolebindings",
        {
            "metadata": {"name": account},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        },
    )
    return await kubeapi.service_account_token(admin, namespace=namespace, account=account)


def _unpooled() -> aiohttp.ClientSession:
    """A client session with a connection per request (aiohttp's own pool stops at 100)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(connect=10)
    )


LEARNED_RSS_BOUND = 64 << 20
"""What 115 learned collections (three objects each) may add to warmwatch's memory: their
reflectors, upstream connections and logs' rings."""
LEARNED_DB_BOUND = 16 << 20
"""...and to its database and write-ahead log."""


def _db_bytes(sidecar: Sidecar) -> int:
    return sum(
        path.stat().st_size
        for path in (sidecar.db, sidecar.db.with_name(sidecar.db.name + "-wal"))
        if path.exists()
    )


PER_WATCH_BOUND = 256 * 1024
"""Memory a passed-through watch may cost warmwatch (its two sockets, their buffers, a task);
measured: 93-94 KiB."""


TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
"""kubectl's Accept: tables are rendered by the apiserver, so such a watch is passed through."""


async def test_one_client_cannot_take_the_apiserver_from_the_others(
    namespace: str,
    admin_api: kubeapi.RawClient,
    start_sidecar: Callable[..., Sidecar],
) -> None:
    """``delegated``: one service account opens 110 passed-through watches, then makes 115
    LISTs with distinct label selectors (each learns a collection with its own upstream watch).
    Meanwhile another client's GETs, a new client's first request (its TokenReview and
    SubjectAccessReview) and an anonymous ``/version`` are answered within a second."""
    await kubeapi.create_configmaps(admin_api, namespace=namespace, count=3)
    flooder = await _reader(admin_api, namespace, "flooder")
    other = await _reader(admin_api, namespace, "other")
    sidecar = start_sidecar(extra=["--client-auth=delegated"])
    collection = f"{sidecar.url}/api/v1/namespaces/{namespace}/configmaps"
    probe = Probe(f"{collection}/cm-000000", headers={"Authorization": f"Bearer {other}"})
    flood = {"Authorization": f"Bearer {flooder}"}
    before = sidecar.rss_bytes()
    async with (
        _unpooled() as session,
        probe.running(),
        contextlib.AsyncExitStack() as watches,
    ):
        for i in range(110):
            async with asyncio.timeout(5 * ANSWER_BOUND):  # headers at once, or starved
                answer = await watches.enter_async_context(
                    session.get(
                        collection,
                        params={"watch": "true", "labelSelector": f"w{i}=x"},
                        headers={**flood, "Accept": TABLE},
                    )
                )
            assert answer.status == 200, await answer.text()
        assert sidecar.metric("warmwatch_upstream_connections", {"purpose": "passthrough"}) >= 110
        per_watch = (sidecar.rss_bytes() - before) / 110
        print(f"110 passed-through watches: {per_watch / 1024:.0f} KiB of warmwatch's RSS each")
        assert per_watch < PER_WATCH_BOUND

        async def listed(i: int) -> int:
            async with session.get(
                collection, params={"labelSelector": f"l{i}=x"}, headers=flood
            ) as answer:
                await answer.read()
                return answer.status

        rss, db = sidecar.rss_bytes(), _db_bytes(sidecar)
        codes = await asyncio.gather(*(listed(i) for i in range(115)))
        assert set(codes) == {200}, codes
        assert sidecar.metric("warmwatch_upstream_connections", {"purpose": "reflector"}) >= 115
        grown, stored = sidecar.rss_bytes() - rss, _db_bytes(sidecar) - db
        print(f"115 learned collections: RSS +{grown >> 20} MiB, database +{stored >> 10} KiB")
        assert grown < LEARNED_RSS_BOUND
        assert stored < LEARNED_DB_BOUND

        # A client warmwatch has not seen yet: its token and its read are reviewed upstream.
        newcomer = await _reader(admin_api, namespace, "newcomer")
        started = time.monotonic()
        async with session.get(
            collection, headers={"Authorization": f"Bearer {newcomer}"}
        ) as answer:
            assert answer.status == 200, await answer.text()
        assert time.monotonic() - started < ANSWER_BOUND
        started = time.monotonic()
        async with session.get(f"{sidecar.url}/version") as answer:  # anonymous
            assert answer.status == 200
        assert time.monotonic() - started < ANSWER_BOUND
    probe.check("while one client flooded warmwatch")
    assert sidecar.metric("warmwatch_upstream_busy_total") == 0


async def test_passthrough_watches_over_the_limits_are_refused_at_once(
    namespace: str,
    start_sidecar: Callable[..., Sidecar],
) -> None:
    """Passed-through watches count against ``--max-client-watches`` and ``--max-watches``,
    followed logs too: past them the apiserver's 429 at once, and the upstream connections
    they would have taken stay free for everyone else (``none``: every caller is warmwatch)."""
    sidecar = start_sidecar(extra=["--max-watches=20", "--max-client-watches=10"])
    collection = f"{sidecar.url}/api/v1/namespaces/{namespace}/configmaps"
    probe = Probe(f"{sidecar.url}/api/v1/namespaces/{namespace}")
    async with (
        _unpooled() as session,
        probe.running(),
        contextlib.AsyncExitStack() as held,
    ):
        statuses = []
        for _ in range(15):
            answer = await held.enter_async_context(
                session.get(collection, params={"watch": "true"}, headers={"Accept": TABLE})
            )
            statuses.append(answer.status)
        assert statuses == [200] * 10 + [429] * 5
        assert sidecar.metric("warmwatch_rejected_total", {"limit": "client_watches"}) == 5
        assert sidecar.metric("warmwatch_upstream_connections", {"purpose": "passthrough"}) == 10
    probe.check("beside a client at its watch limit")


async def test_learned_collections_leave_passthrough_answered_after_a_restart(
    namespace: str,
    admin_api: kubeapi.RawClient,
    start_sidecar: Callable[..., Sidecar],
) -> None:
    """``none``: 115 LISTs with distinct label selectors learn 115 collections, which are
    stored and resumed at the next start, each with its upstream watch. Passthrough is
    answered within a second before and after the restart (in one shared pool of 100
    connections, every passthrough hung, again after each restart)."""
    await kubeapi.create_configmaps(admin_api, namespace=namespace, count=3)
    sidecar = start_sidecar()
    collection = f"{sidecar.url}/api/v1/namespaces/{namespace}/configmaps"
    async with _unpooled() as session:

        async def listed(i: int) -> int:
            async with session.get(collection, params={"labelSelector": f"l{i}=x"}) as answer:
                await answer.read()
                return answer.status

        assert set(await asyncio.gather(*(listed(i) for i in range(115)))) == {200}
    assert sidecar.metric("warmwatch_upstream_connections", {"purpose": "reflector"}) >= 115
    assert sidecar.stop() == 0
    sidecar.restart(wait_ready=True)
    probe = Probe(f"{collection}/cm-000000")
    async with probe.running():
        deadline = time.monotonic() + 30
        while sidecar.metric("warmwatch_upstream_connections", {"purpose": "reflector"}) < 115:
            assert time.monotonic() < deadline, "the stored collections did not resume"
            await asyncio.sleep(0.2)
        await asyncio.sleep(1)  # a few more probes with every watch open
    probe.check("after a restart with 115 stored collections")
