"""Real clients through warmwatch agree with the same clients talking to the apiserver directly.

kubectl, kubernetes-asyncio and the client-go informer program (informer, metadata-only and
controller-runtime modes) list and watch ConfigMaps, Pods (objects only: there is no kubelet)
and a CRD through warmwatch; their final caches equal those of direct clients, object for
object (namespace/name/resourceVersion). Everything else passes through unchanged: writes of
every kind, tables, single-object GETs, discovery.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio import watch as k8s_watch

from loadtest import kubeapi
from loadtest.cluster import ControlPlane
from loadtest.goclient import GoClient
from loadtest.sidecar import Sidecar
from tests.e2e.conftest import CreateMany, Keys, Kubectl, listed_keys

pytestmark = pytest.mark.e2e

CRD = Path(__file__).resolve().parents[2] / "loadtest" / "manifests" / "widgets-crd.yaml"


@pytest.fixture(scope="module")
def widgets(kubectl: Kubectl) -> str:
    kubectl("apply", "-f", str(CRD))
    kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/widgets.example.com")
    return "example.com/v1/widgets"


async def wait_for_service_account(api: kubeapi.RawClient, namespace: str) -> None:
    """Pods need the namespace's default ServiceAccount (made by the controller-manager)."""
    for _ in range(100):
        try:
            await api.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
            return
        except kubeapi.ApiError:
            await asyncio.sleep(0.1)
    raise TimeoutError("no default service account")


def pod(name: str, *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/none:1"}]},
    }


def widget(name: str, size: int) -> dict[str, Any]:
    return {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"size": size},
    }


async def populate(api: kubeapi.RawClient, namespace: str, create_many: CreateMany) -> None:
    await create_many(namespace=namespace, count=40)
    await wait_for_service_account(api, namespace)
    await api.gather(
        api.create(f"/api/v1/namespaces/{namespace}/pods", pod(f"p-{i}")) for i in range(8)
    )
    await api.gather(
        api.create(f"/apis/example.com/v1/namespaces/{namespace}/widgets", widget(f"w-{i}", i))
        for i in range(8)
    )


async def churn(api: kubeapi.RawClient, namespace: str) -> None:
    """Creates, updates and deletes of each kind, one at a time."""
    base = f"/api/v1/namespaces/{namespace}"
    widgets_path = f"/apis/example.com/v1/namespaces/{namespace}/widgets"
    for i in range(4):
        await api.create(
            f"{base}/configmaps", kubeapi.configmap(name=f"new-{i}", namespace=namespace)
        )
        await api.merge_patch(f"{base}/configmaps/cm-{i:06d}", {"data": {"changed": str(i)}})
        await api.delete(f"{base}/configmaps/cm-{i + 20:06d}")
        await api.create(f"{base}/pods", pod(f"new-p-{i}"))
        await api.merge_patch(f"{base}/pods/p-{i}", {"metadata": {"labels": {"v": str(i)}}})
        await api.request(
            "DELETE", f"{base}/pods/p-{i + 4}", body={"gracePeriodSeconds": 0}, ok=(200, 202)
        )
        await api.create(widgets_path, widget(f"new-w-{i}", 100 + i))
        await api.merge_patch(f"{widgets_path}/w-{i}", {"spec": {"size": 50 + i}})
        await api.delete(f"{widgets_path}/w-{i + 4}")


def digests(client: GoClient) -> dict[str, Keys]:
    return {resource: {tuple(i) for i in d["items"]} for resource, d in client.digest().items()}


async def converge(clients: list[GoClient], expected: dict[str, Keys]) -> None:
    for _ in range(120):
        if all(digests(c) == expected for c in clients):
            return
        await asyncio.sleep(0.5)
    for client in clients:
        assert digests(client) == expected


@pytest.mark.parametrize("watch_list", [False, True], ids=["list-watch", "watch-list"])
async def test_informers_through_warmwatch_equal_direct_ones(
    watch_list: bool,
    plane: ControlPlane,
    namespace: str,
    widgets: str,
    kubectl: Kubectl,
    admin_api: kubeapi.RawClient,
    create_many: CreateMany,
    start_sidecar: Callable[..., Sidecar],
    start_goclient: Callable[..., GoClient],
) -> None:
    await populate(admin_api, namespace, create_many)
    sidecar = start_sidecar()  # learns every shape from the clients' requests
    resources = [f"v1/configmaps@{namespace}", f"v1/pods@{namespace}", f"{widgets}@{namespace}"]
    direct = start_goclient(
        kubeconfig=plane.admin_kubeconfig, resources=resources, watch_list=watch_list
    )
    through = [
        start_goclient(
            kubeconfig=sidecar.kubeconfig, resources=resources, watch_list=watch_list, mode=mode
        )
        for mode in ("informer", "metadata", "controller-runtime")
    ]
    for client in [direct, *through]:
        client.wait_synced(len(resources))
    # Every read was served from the cache: learning a shape that several clients ask for at
    # once passes none of them through (a list passed through has the apiserver's RV, older
    # than the fill's, and the watch from it is a 410 and a relist the apiserver would not
    # have caused; before the churn it goes unseen in the events compared below).
    assert not re.search("passing (the request )?through", sidecar.log.read_text())
    await churn(admin_api, namespace)

    expected = {
        resources[0]: listed_keys(kubectl, "configmaps", namespace),
        resources[1]: listed_keys(kubectl, "pods", namespace),
        resources[2]: listed_keys(kubectl, "widgets.example.com", namespace),
    }
    await converge([direct, *through], expected)
    # Every change reached the informers through warmwatch as it reached the direct one.
    direct_events = [
        (e["resource"], e["type"], e["name"], e["rv"]) for e in direct.events() if not e["initial"]
    ]
    for client in through:
        seen = [
            (e["resource"], e["type"], e["name"], e["rv"])
            for e in client.events()
            if not e["initial"]
        ]
        assert sorted(seen) == sorted(direct_events)
    # kubectl through warmwatch lists what kubectl lists directly.
    for kind, resource in zip(
        ("configmaps", "pods", "widgets.example.com"), resources, strict=True
    ):
        assert (
            listed_keys(kubectl, kind, namespace, kubeconfig=sidecar.kubeconfig)
            == expected[resource]
        )


async def test_kubernetes_asyncio_lists_and_watches_through_warmwatch(
    plane: ControlPlane,
    namespace: str,
    admin_api: kubeapi.RawClient,
    create_many: CreateMany,
    start_sidecar: Callable[..., Sidecar],
) -> None:
    await create_many(namespace=namespace, count=30)
    sidecar = start_sidecar(resources=["v1/configmaps"])  # cluster-wide; filtered locally

    async def client_for(kubeconfig: Path) -> k8s_client.ApiClient:
        configuration = k8s_client.Configuration()
        await k8s_config.load_kube_config(
            config_file=str(kubeconfig), client_configuration=configuration
        )
        return k8s_client.ApiClient(configuration)

    async with (
        await client_for(plane.admin_kubeconfig) as direct_api,
        await client_for(sidecar.kubeconfig) as through_api,
    ):
        direct, through = k8s_client.CoreV1Api(direct_api), k8s_client.CoreV1Api(through_api)
        listed_direct = await direct.list_namespaced_config_map(namespace)
        listed_through = await through.list_namespaced_config_map(namespace)
        assert {(i.metadata.name, i.metadata.resource_version) for i in listed_through.items} == {
            (i.metadata.name, i.metadata.resource_version) for i in listed_direct.items
        }

        async def watch(core: k8s_client.CoreV1Api, rv: str, count: int) -> list[tuple[str, ...]]:
            seen: list[tuple[str, ...]] = []
            stream = k8s_watch.Watch()
            async for event in stream.stream(
                core.list_namespaced_config_map, namespace, resource_version=rv, timeout_seconds=30
            ):
                seen.append(
                    (
                        event["type"],
                        event["object"].metadata.name,
                        event["object"].metadata.resource_version,
                    )
                )
                if len(seen) == count:
                    stream.stop()
            return seen

        rv = listed_direct.metadata.resource_version
        watchers = [asyncio.create_task(watch(core, rv, 9)) for core in (direct, through)]
        await asyncio.sleep(0.5)
        path = f"/api/v1/namespaces/{namespace}/configmaps"
        for i in range(3):
            await admin_api.create(path, kubeapi.configmap(name=f"w-{i}", namespace=namespace))
            await admin_api.merge_patch(f"{path}/cm-{i:06d}", {"data": {"x": "y"}})
            await admin_api.delete(f"{path}/cm-{i + 10:06d}")
        by_direct, by_through = await asyncio.wait_for(asyncio.gather(*watchers), 60)
        assert by_through == by_direct
        assert [t for t, _, _ in by_direct].count("DELETED") == 3


def test_kubectl_writes_and_reads_pass_through(
    namespace: str,
    kubectl: Kubectl,
    start_sidecar: Callable[..., Sidecar],
    tmp_path: Path,
) -> None:
    sidecar = start_sidecar(resources=["v1/configmaps"])
    via = sidecar.kubeconfig
    manifest = tmp_path / "cm.yaml"
    manifest.write_text(
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: applied\n"
        f"  namespace: {namespace}\ndata:\n  a: '1'\n"
    )
    kubectl("create", "configmap", "created", "-n", namespace, "--from-literal=k=v", kubeconfig=via)
    kubectl("apply", "-f", str(manifest), kubeconfig=via)
    manifest.write_text(manifest.read_text().replace("a: '1'", "a: '2'"))
    kubectl("apply", "-f", str(manifest), kubeconfig=via)
    kubectl(
        "apply",
        "--server-side",
        "--field-manager=ww-test",
        "-f",
        str(manifest),
        "--force-conflicts",
        kubeconfig=via,
    )
    kubectl(
        "patch",
        "configmap",
        "created",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"data":{"k":"patched"}}',
        kubeconfig=via,
    )
    kubectl("label", "configmap", "created", "-n", namespace, "team=a", kubeconfig=via)
    kubectl("delete", "configmap", "applied", "-n", namespace, kubeconfig=via)

    # Single-object GET and YAML output: passed through, identical.
    assert (
        kubectl("get", "configmap", "created", "-n", namespace, "-o", "yaml", kubeconfig=via).stdout
        == kubectl("get", "configmap", "created", "-n", namespace, "-o", "yaml").stdout
    )
    direct = json.loads(
        kubectl("get", "configmap", "created", "-n", namespace, "-o", "json").stdout
    )
    assert direct["data"] == {"k": "patched"}
    assert direct["metadata"]["labels"] == {"team": "a"}
    # Tables (as=Table) are rendered by the apiserver: same columns and rows.
    table_via = kubectl("get", "configmaps", "-n", namespace, kubeconfig=via).stdout
    table_direct = kubectl("get", "configmaps", "-n", namespace).stdout
    assert [line.split()[:2] for line in table_via.splitlines()] == [
        line.split()[:2] for line in table_direct.splitlines()
    ]
    assert "applied" not in table_via
    # Discovery, through and cached.
    assert (
        kubectl("api-resources", "--api-group=", "-o", "name", kubeconfig=via).stdout
        == kubectl("api-resources", "--api-group=", "-o", "name").stdout
    )
    assert "Server Version: v1.37.2" in kubectl("version", kubeconfig=via).stdout
    assert sidecar.metric("warmwatch_passthrough_requests_total", {"verb": "PATCH"}) >= 3


def test_refused_collections_are_not_cached(
    plane: ControlPlane, kubectl: Kubectl, tmp_path: Path
) -> None:
    """warmwatch never caches what its identity may not read, and the client gets the
    apiserver's own answer; a collection that can be listed but not watched still lists."""
    restricted = Sidecar.start(
        upstream_kubeconfig=plane.restricted_kubeconfig, db=tmp_path / "restricted.db"
    )
    try:
        via = restricted.kubeconfig
        refused = kubectl("get", "configmaps", "-A", "-o", "name", kubeconfig=via, check=False)
        direct = kubectl(
            "get",
            "configmaps",
            "-A",
            "-o",
            "name",
            kubeconfig=plane.restricted_kubeconfig,
            check=False,
        )
        assert refused.returncode != 0
        assert refused.stderr == direct.stderr  # the apiserver's own 403, word for word
        assert restricted.metric("warmwatch_shape_objects") == 0
        with sqlite3.connect(restricted.db) as db:
            assert db.execute("SELECT count(*) FROM shapes").fetchone()[0] == 0
    finally:
        restricted.stop()

    admin = Sidecar.start(upstream_kubeconfig=plane.admin_kubeconfig, db=tmp_path / "admin.db")
    try:  # componentstatuses: list only, no watch
        listed = kubectl("get", "componentstatuses", "-o", "name", kubeconfig=admin.kubeconfig)
        direct = kubectl("get", "componentstatuses", "-o", "name").stdout
        assert sorted(listed.stdout.split()) == sorted(direct.split())  # unordered upstream
        assert "componentstatus/etcd-0" in listed.stdout
    finally:
        admin.stop()
