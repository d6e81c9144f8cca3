"""The product's point: a controller restarts warm from warmwatch's cache, even while the
apiserver is down, and then receives exactly what it missed — with no upstream relist."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from loadtest import kubeapi
from loadtest.cluster import ControlPlane
from loadtest.goclient import GoClient
from loadtest.sidecar import Sidecar
from tests.e2e.conftest import CreateMany, Kubectl, listed_keys

pytestmark = pytest.mark.e2e

OBJECTS = 20_000


async def make_changes(api: kubeapi.RawClient, namespace: str) -> list[tuple[str, str, str]]:
    """40 creates, 40 updates, 20 deletes, one at a time: (type, name, rv) in order (the RV of
    a delete is not in its answer: "")."""
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    changes: list[tuple[str, str, str]] = []
    for i in range(20):
        created = await api.create(path, kubeapi.configmap(name=f"late-{i}", namespace=namespace))
        changes.append(("ADDED", f"late-{i}", created["metadata"]["resourceVersion"]))
        for j in (2 * i, 2 * i + 1):
            name = f"cm-{j:06d}"
            updated = await api.merge_patch(f"{path}/{name}", {"data": {"v": str(i)}})
            changes.append(("MODIFIED", name, updated["metadata"]["resourceVersion"]))
        created = await api.create(path, kubeapi.configmap(name=f"late-b-{i}", namespace=namespace))
        changes.append(("ADDED", f"late-b-{i}", created["metadata"]["resourceVersion"]))
        name = f"cm-{1000 + i:06d}"
        await api.delete(f"{path}/{name}")  # answers a Status: the deletion RV is not known
        changes.append(("DELETED", name, ""))
    return changes


async def _cached_then_changed(
    *,
    watch_list: bool,
    namespace: str,
    admin_api: kubeapi.RawClient,
    create_many: CreateMany,
    start_sidecar: Callable[..., Sidecar],
    start_goclient: Callable[..., GoClient],
) -> tuple[Sidecar, str, list[tuple[str, str, str]]]:
    """20,000 ConfigMaps cached through warmwatch by a client; warmwatch stopped; 100 changes
    made upstream while it is down."""
    await create_many(namespace=namespace, count=OBJECTS)
    shape = f"v1/configmaps@{namespace}"
    sidecar = start_sidecar(resources=[shape])
    first = start_goclient(kubeconfig=sidecar.kubeconfig, resources=[shape], watch_list=watch_list)
    assert first.wait_synced()[0]["count"] == OBJECTS
    first.stop()
    assert sidecar.stop() == 0  # graceful
    return sidecar, shape, await make_changes(admin_api, namespace)


def _missed(client: GoClient) -> list[tuple[str, str, str]]:
    return [
        (e["type"], e["name"], e["rv"] if e["type"] != "DELETED" else "")
        for e in client.events()
        if not e["initial"]
    ]


@pytest.mark.parametrize("watch_list", [False, True], ids=["list-watch", "watch-list"])
async def test_sidecar_restart_resumes_without_relisting(
    watch_list: bool,
    namespace: str,
    kubectl: Kubectl,
    admin_api: kubeapi.RawClient,
    create_many: CreateMany,
    start_sidecar: Callable[..., Sidecar],
    start_goclient: Callable[..., GoClient],
) -> None:
    """The usual restart (a rollout of the controller's pod): the apiserver stays up, warmwatch
    resumes its watch from the persisted RV, the client gets exactly what it missed, in order."""
    sidecar, shape, changes = await _cached_then_changed(
        watch_list=watch_list,
        namespace=namespace,
        admin_api=admin_api,
        create_many=create_many,
        start_sidecar=start_sidecar,
        start_goclient=start_goclient,
    )
    sidecar.restart()
    client = start_goclient(kubeconfig=sidecar.kubeconfig, resources=[shape], watch_list=watch_list)
    assert client.wait_synced()[0]["count"] in (OBJECTS, OBJECTS + 20)  # cache, maybe caught up
    for _ in range(120):
        if client.digest()[shape]["count"] == OBJECTS + 20:
            break
        await asyncio.sleep(1)
    await asyncio.sleep(2)  # nothing more may arrive
    missed = _missed(client)
    assert missed == changes[len(changes) - len(missed) :]  # the tail the initial list lacked
    assert {tuple(i) for i in client.digest()[shape]["items"]} == listed_keys(
        kubectl, "configmaps", namespace
    )
    # The restart cost no upstream list: the reflector resumed its watch from the cache's RV.
    assert sidecar.metric("warmwatch_upstream_relists_total") == 0
    assert sidecar.metric("warmwatch_upstream_requests_total", {"verb": "LIST"}) == 0


@pytest.mark.parametrize("watch_list", [False, True], ids=["list-watch", "watch-list"])
async def test_restart_while_apiserver_down_then_catch_up(
    watch_list: bool,
    plane: ControlPlane,
    namespace: str,
    kubectl: Kubectl,
    admin_api: kubeapi.RawClient,
    create_many: CreateMany,
    start_sidecar: Callable[..., Sidecar],
    start_goclient: Callable[..., GoClient],
) -> None:
    """Start with the apiserver down: the client syncs from the cache alone. When the apiserver
    returns, its fresh watch cache answers the resume with 410 (it does so to every client; its
    window starts at its own start), so warmwatch relists upstream once and appends the
    difference: the client receives every change it missed — creates and updates with their
    RVs in order, deletes at the relist RV (docs/design.md §5a, "Complete") — and no relist of its
    own."""
    sidecar, shape, changes = await _cached_then_changed(
        watch_list=watch_list,
        namespace=namespace,
        admin_api=admin_api,
        create_many=create_many,
        start_sidecar=start_sidecar,
        start_goclient=start_goclient,
    )
    expected = listed_keys(kubectl, "configmaps", namespace)
    plane.stop_apiserver()
    try:
        sidecar.restart()  # ready from disk alone: the apiserver is down
        client = start_goclient(
            kubeconfig=sidecar.kubeconfig, resources=[shape], watch_list=watch_list
        )
        assert client.wait_synced()[0]["count"] == OBJECTS  # the cache's state
    finally:
        plane.start_apiserver()

    client.wait_for(
        lambda lines: (
            sum(1 for x in lines if x["kind"] == "event" and not x["initial"]) >= len(changes)
        ),
        timeout=180,
    )
    await asyncio.sleep(2)  # nothing more may arrive
    in_place = [c for c in changes if c[0] != "DELETED"]
    deleted = sorted(c for c in changes if c[0] == "DELETED")
    missed = _missed(client)
    assert missed[: len(in_place)] == in_place
    assert sorted(missed[len(in_place) :]) == deleted
    delete_rvs = {e["rv"] for e in client.events() if e["type"] == "DELETED"}
    assert len(delete_rvs) == 1 and int(delete_rvs.pop()) > int(in_place[-1][2])
    assert {tuple(i) for i in client.digest()[shape]["items"]} == expected
    assert sidecar.metric("warmwatch_upstream_relists_total") == 1
