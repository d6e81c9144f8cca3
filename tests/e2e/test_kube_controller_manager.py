"""The real kube-controller-manager through warmwatch: its workload controllers and garbage
collector work, it starts about as fast as directly against the apiserver, and it restarts warm
from warmwatch's cache while the apiserver is down, then catches up with what it missed.

The harness's own kube-controller-manager (service accounts, tokens, namespaces, garbage
collection, run directly against the apiserver) is paused for these tests: the one under test
runs those controllers too, so every ReplicaSet, Pod and garbage collection seen here is its
work. There is no kubelet: Pods stay Pending.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from loadtest import kubeapi
from loadtest.cluster import ControlPlane
from loadtest.controllers import LEASE_ACQUIRED, deployment, job
from loadtest.sidecar import Sidecar
from tests.e2e.conftest import StartKcm

pytestmark = pytest.mark.e2e

SYNC_TIMEOUT = 90.0
"""Time-to-synced is seconds when things work (a handful of objects); this bounds a failure."""

WORK_TIMEOUT = 60.0
"""For a controller to act on a change it has seen (ReplicaSet, Pods, garbage collection)."""

CATCH_UP_TIMEOUT = 30.0
"""After the apiserver returns: warmwatch reconnects (backoff), relists on 410, then the
controllers act."""

T = TypeVar("T")


# -- objects -----------------------------------------------------------------------------------


def owned_by(items: list[dict[str, Any]], owner: dict[str, Any]) -> list[dict[str, Any]]:
    uid = owner["metadata"]["uid"]
    return [
        i
        for i in items
        if any(ref["uid"] == uid for ref in i["metadata"].get("ownerReferences", []))
        and not i["metadata"].get("deletionTimestamp")
    ]


class Namespace:
    """Reads and writes in one namespace, directly against the apiserver as admin."""

    def __init__(self, api: kubeapi.RawClient, name: str) -> None:
        self.api = api
        self.name = name

    def path(self, kind: str, name: str = "") -> str:
        base = {
            "deployments": f"/apis/apps/v1/namespaces/{self.name}/deployments",
            "replicasets": f"/apis/apps/v1/namespaces/{self.name}/replicasets",
            "jobs": f"/apis/batch/v1/namespaces/{self.name}/jobs",
            "pods": f"/api/v1/namespaces/{self.name}/pods",
            "leases": f"/apis/coordination.k8s.io/v1/namespaces/{self.name}/leases",
        }[kind]
        return f"{base}/{name}" if name else base

    async def create(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.api.create(self.path(kind), body)

    async def get(self, kind: str, name: str) -> dict[str, Any]:
        return await self.api.get(self.path(kind, name))

    async def items(self, kind: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = (await self.api.get(self.path(kind)))["items"]
        return items

    async def owned(self, kind: str, owner: dict[str, Any]) -> list[dict[str, Any]]:
        return owned_by(await self.items(kind), owner)

    async def delete_in_background(self, kind: str, name: str) -> None:
        await self.api.request(
            "DELETE",
            self.path(kind, name),
            body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"},
            ok=(200, 202),
        )


async def eventually(probe: Callable[[], Awaitable[T | None]], *, timeout: float, what: str) -> T:
    """Poll ``probe`` until it returns something other than None; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        found = await probe()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        await asyncio.sleep(0.5)


async def replicaset_with_pods(
    ns: Namespace, deployment_name: str, *, pods: int, timeout: float
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The Deployment's one ReplicaSet once it owns exactly ``pods`` live Pods."""
    owner = await ns.get("deployments", deployment_name)

    async def probe() -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        sets = await ns.owned("replicasets", owner)
        if len(sets) != 1:
            return None
        owned = await ns.owned("pods", sets[0])
        return (sets[0], owned) if len(owned) == pods else None

    return await eventually(
        probe, timeout=timeout, what=f"Deployment {deployment_name}: a ReplicaSet with {pods} Pods"
    )


async def job_pods(
    ns: Namespace, job_name: str, *, pods: int, timeout: float
) -> list[dict[str, Any]]:
    owner = await ns.get("jobs", job_name)

    async def probe() -> list[dict[str, Any]] | None:
        owned = await ns.owned("pods", owner)
        return owned if len(owned) == pods else None

    return await eventually(probe, timeout=timeout, what=f"Job {job_name}: {pods} Pods")


def harness_kcm_stopped(plane: ControlPlane) -> bool:
    return not plane.status().get("kube-controller-manager")


def report_traffic(sidecar: Sidecar) -> None:
    """What warmwatch passed through and sent upstream (shown with -s or on failure)."""
    for line in sidecar.metrics().splitlines():
        if line.startswith(
            ("warmwatch_passthrough_requests_total", "warmwatch_upstream_requests_total")
        ) and not line.endswith(" 0.0"):
            print(line)


# -- a. the controllers work through warmwatch -------------------------------------------------


async def test_workloads_and_garbage_collection_through_warmwatch(
    plane: ControlPlane,
    namespace: str,
    admin_api: kubeapi.RawClient,
    start_sidecar: Callable[..., Sidecar],
    start_kcm: StartKcm,
) -> None:
    """A Deployment gets its ReplicaSet and Pods, a Job its Pods, and deleting the Deployment
    (background propagation) garbage-collects its ReplicaSet and Pods — all done by a
    kube-controller-manager whose only API endpoint is warmwatch."""
    sidecar = start_sidecar()
    kcm = start_kcm(kubeconfig=sidecar.kubeconfig)
    synced = kcm.wait_synced(SYNC_TIMEOUT)
    print(f"kube-controller-manager through warmwatch synced in {synced:.1f} s")
    assert harness_kcm_stopped(plane)
    ns = Namespace(admin_api, namespace)

    await ns.create("deployments", deployment("web", replicas=2))
    await ns.create("jobs", job("batch", parallelism=2))
    replicaset, pods = await replicaset_with_pods(ns, "web", pods=2, timeout=WORK_TIMEOUT)
    assert {p["status"].get("phase") for p in pods} == {"Pending"}  # no kubelet
    assert all(p["metadata"]["labels"]["app"] == "web" for p in pods)
    await job_pods(ns, "batch", pods=2, timeout=WORK_TIMEOUT)

    await ns.delete_in_background("deployments", "web")

    async def collected() -> bool | None:
        names = {r["metadata"]["name"] for r in await ns.items("replicasets")}
        left = await ns.owned("pods", replicaset)
        return True if replicaset["metadata"]["name"] not in names and not left else None

    await eventually(
        collected, timeout=WORK_TIMEOUT, what="the ReplicaSet and its Pods garbage-collected"
    )
    # The Job is nobody's garbage: its Pods stay.
    await job_pods(ns, "batch", pods=2, timeout=1)
    assert kcm.running
    # Every list and watch of the controllers went through warmwatch, which cached them.
    assert sidecar.metric("warmwatch_watchers") > 0
    assert sidecar.metric("warmwatch_events_out_total") > 0
    report_traffic(sidecar)


async def test_leader_election_through_warmwatch(
    plane: ControlPlane,
    namespace: str,
    admin_api: kubeapi.RawClient,
    start_sidecar: Callable[..., Sidecar],
    start_kcm: StartKcm,
) -> None:
    """With --leader-elect=true the Lease is read and written through warmwatch (passed
    through): the controller-manager acquires it, keeps renewing it, and its controllers work."""
    sidecar = start_sidecar()
    kcm = start_kcm(
        kubeconfig=sidecar.kubeconfig,
        leader_elect=True,
        extra=[
            f"--leader-elect-resource-namespace={namespace}",
            "--leader-elect-resource-name=kcm-under-test",
        ],
    )
    acquired = kcm.wait_for_line(LEASE_ACQUIRED, timeout=SYNC_TIMEOUT)
    assert f"{namespace}/kcm-under-test" in acquired, acquired
    synced = kcm.wait_synced(SYNC_TIMEOUT)
    print(f"kube-controller-manager (leader-elect) through warmwatch synced in {synced:.1f} s")
    ns = Namespace(admin_api, namespace)
    lease = await ns.get("leases", "kcm-under-test")
    holder = lease["spec"]["holderIdentity"]
    assert holder, lease

    async def renewed() -> dict[str, Any] | None:
        now = await ns.get("leases", "kcm-under-test")
        return now if now["spec"]["renewTime"] != lease["spec"]["renewTime"] else None

    later = await eventually(renewed, timeout=30, what="the Lease renewed")  # every ~2 s
    assert later["spec"]["holderIdentity"] == holder

    await ns.create("deployments", deployment("web", replicas=2))
    await replicaset_with_pods(ns, "web", pods=2, timeout=WORK_TIMEOUT)
    assert harness_kcm_stopped(plane)


# -- b. cold start -----------------------------------------------------------------------------


def test_cold_start_time_to_synced(
    plane: ControlPlane,
    start_sidecar: Callable[..., Sidecar],
    start_kcm: StartKcm,
) -> None:
    """A fresh warmwatch (empty database: it fills every collection from the apiserver while
    the controllers wait) costs at most twice the direct start plus 2 s."""
    direct_kcm = start_kcm(kubeconfig=plane.admin_kubeconfig)
    direct = direct_kcm.wait_synced(SYNC_TIMEOUT)
    direct_kcm.stop()
    print(f"kube-controller-manager time-to-synced directly: {direct:.1f} s")

    sidecar = start_sidecar()
    via_kcm = start_kcm(kubeconfig=sidecar.kubeconfig)
    via = via_kcm.wait_synced(SYNC_TIMEOUT)
    print(f"kube-controller-manager time-to-synced through a fresh warmwatch: {via:.1f} s")
    assert via <= 2 * direct + 2, f"via warmwatch {via:.1f} s, direct {direct:.1f} s"


# -- c. warm restart while the apiserver is down -----------------------------------------------


async def test_warm_restart_while_apiserver_down(
    plane: ControlPlane,
    namespace: str,
    admin_api: kubeapi.RawClient,
    start_sidecar: Callable[..., Sidecar],
    start_kcm: StartKcm,
) -> None:
    """The controller-manager's pod restarts (warmwatch and KCM) while the apiserver is down:
    its caches sync from warmwatch's database alone (KCM's start-up /healthz poll answered by
    warmwatch). When the apiserver returns, the changes made while both were away arrive and
    the controllers act on them: a Deployment scaled 1 -> 3 gets 3 Pods, a new Job its Pods."""
    ns = Namespace(admin_api, namespace)
    sidecar = start_sidecar()
    first = start_kcm(kubeconfig=sidecar.kubeconfig)
    first.wait_synced(SYNC_TIMEOUT)
    await ns.create("deployments", deployment("web", replicas=1))
    replicaset, _ = await replicaset_with_pods(ns, "web", pods=1, timeout=WORK_TIMEOUT)
    first.stop()
    assert sidecar.stop() == 0

    # While both are away: scale the Deployment and create a Job, upstream.
    await admin_api.merge_patch(ns.path("deployments", "web"), {"spec": {"replicas": 3}})
    await ns.create("jobs", job("batch", parallelism=2))
    plane.stop_apiserver()
    try:
        assert harness_kcm_stopped(plane)
        sidecar.restart(wait_ready=True)  # no --resource: /readyz needs only the database
        second = start_kcm(kubeconfig=sidecar.kubeconfig)
        offline = second.wait_synced(SYNC_TIMEOUT)
        print(f"kube-controller-manager synced from warmwatch alone in {offline:.1f} s")
        assert not plane.status().get("kube-apiserver")  # really synced offline
    finally:
        plane.start_apiserver()
    assert harness_kcm_stopped(plane)  # the pause outlives the apiserver restart

    caught_up = time.monotonic()
    now_set, _ = await replicaset_with_pods(ns, "web", pods=3, timeout=CATCH_UP_TIMEOUT)
    assert now_set["metadata"]["uid"] == replicaset["metadata"]["uid"]  # scaled, not replaced
    await job_pods(ns, "batch", pods=2, timeout=CATCH_UP_TIMEOUT)
    print(f"caught up {time.monotonic() - caught_up:.1f} s after the apiserver returned")
    assert second.running
    report_traffic(sidecar)


async def test_starts_offline_from_json_collections(
    plane: ControlPlane,
    start_sidecar: Callable[..., Sidecar],
    start_kcm: StartKcm,
) -> None:
    """kube-controller-manager reads in protobuf. Its pod ran before with a JSON client set
    (here the same controllers with ``--kube-api-content-type=application/json``), so
    warmwatch holds JSON collections and JSON discovery documents only. Restarted while the
    apiserver is down, the protobuf controller-manager syncs from those: a client that
    accepts JSON is answered from a warm JSON collection and a stored JSON discovery document
    rather than refused."""
    sidecar = start_sidecar()
    json_kcm = start_kcm(
        kubeconfig=sidecar.kubeconfig, extra=["--kube-api-content-type=application/json"]
    )
    json_kcm.wait_synced(SYNC_TIMEOUT)
    json_kcm.stop()
    assert sidecar.stop() == 0
    learned = [line for line in sidecar.log.read_text().splitlines() if "(new, learned)" in line]
    in_protobuf = {line.split()[-2] for line in learned if line.endswith(" protobuf")}
    # Its apiextensions and apiregistration clients ask for protobuf whatever the flag says.
    assert in_protobuf <= {
        "apiextensions.k8s.io/v1/customresourcedefinitions",
        "apiregistration.k8s.io/v1/apiservices",
    }, in_protobuf
    assert len(learned) - len(in_protobuf) > 30
    plane.stop_apiserver()
    try:
        sidecar.restart(wait_ready=True)
        offline_kcm = start_kcm(kubeconfig=sidecar.kubeconfig)
        offline = offline_kcm.wait_synced(SYNC_TIMEOUT)
        print(f"protobuf kube-controller-manager synced from JSON collections in {offline:.1f} s")
        assert not plane.status().get("kube-apiserver")  # really synced offline
    finally:
        plane.start_apiserver()
    assert offline_kcm.running
