"""Smoke tests of the local control plane itself, with the three real clients.

These prove the harness the rest of the suite stands on: kubectl, kubernetes-asyncio and the
client-go informer program list and watch ConfigMaps and a CRD against the real apiserver and
agree with each other; the restricted identity is refused; the apiserver stops and restarts on
the same data; a stopped plane comes back with `up` and `down` leaves no process behind.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import watch as k8s_watch
from kubernetes_asyncio.client.exceptions import ApiException

from loadtest import kubeapi
from loadtest.cluster import ControlPlane
from loadtest.goclient import GoClient
from tests.e2e.conftest import CreateMany, Kubectl, keys_of

pytestmark = pytest.mark.e2e

CRD = Path(__file__).resolve().parents[2] / "loadtest" / "manifests" / "widgets-crd.yaml"


@pytest.fixture(scope="module")
def widgets_crd(kubectl: Kubectl) -> str:
    kubectl("apply", "-f", str(CRD))
    kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/widgets.example.com")
    return "example.com/v1/widgets"


def test_admin_lists_namespaces_and_restricted_is_forbidden(
    plane: ControlPlane, kubectl: Kubectl
) -> None:
    names = kubectl("get", "ns", "-o", "jsonpath={.items[*].metadata.name}").stdout.split()
    assert {"default", "kube-system"} <= set(names)

    refused = kubectl(
        "get", "configmaps", "-A", kubeconfig=plane.restricted_kubeconfig, check=False
    )
    assert refused.returncode != 0
    assert "Forbidden" in refused.stderr, refused.stderr
    assert 'User "warmwatch-restricted" cannot list resource "configmaps"' in refused.stderr


async def test_restricted_client_gets_403(restricted_client: k8s_client.ApiClient) -> None:
    with pytest.raises(ApiException) as refused:
        await k8s_client.CoreV1Api(restricted_client).list_config_map_for_all_namespaces()
    assert refused.value.status == 403
    assert json.loads(refused.value.body)["reason"] == "Forbidden"


async def _widgets(api: kubeapi.RawClient, namespace: str, count: int) -> None:
    path = f"/apis/example.com/v1/namespaces/{namespace}/widgets"
    await api.gather(
        api.create(
            path,
            {
                "apiVersion": "example.com/v1",
                "kind": "Widget",
                "metadata": {"name": f"w-{i:03d}"},
                "spec": {"size": i},
            },
        )
        for i in range(count)
    )


async def test_clients_agree_on_list_and_watch(
    namespace: str,
    widgets_crd: str,
    kubectl: Kubectl,
    admin_api: kubeapi.RawClient,
    admin_client: k8s_client.ApiClient,
    create_many: CreateMany,
    start_goclient: Callable[..., GoClient],
    plane: ControlPlane,
) -> None:
    await create_many(namespace=namespace, count=60)
    await _widgets(admin_api, namespace, 12)
    configmaps, widgets = f"v1/configmaps@{namespace}", f"{widgets_crd}@{namespace}"

    informer = start_goclient(kubeconfig=plane.admin_kubeconfig, resources=[configmaps, widgets])
    informer.wait_synced(2)

    # LIST: kubectl, kubernetes-asyncio and the informer's cache hold the same objects.
    by_kubectl_cm = keys_of(
        json.loads(kubectl("get", "configmaps", "-n", namespace, "-o", "json").stdout)["items"]
    )
    by_kubectl_w = keys_of(
        json.loads(kubectl("get", "widgets.example.com", "-n", namespace, "-o", "json").stdout)[
            "items"
        ]
    )
    core = k8s_client.CoreV1Api(admin_client)
    listed = await core.list_namespaced_config_map(namespace)
    by_python_cm = {(namespace, i.metadata.name, i.metadata.resource_version) for i in listed.items}
    custom = k8s_client.CustomObjectsApi(admin_client)
    listed_w = await custom.list_namespaced_custom_object("example.com", "v1", namespace, "widgets")
    by_python_w = keys_of(listed_w["items"])
    digest = informer.digest()
    by_go_cm = {tuple(i) for i in digest[configmaps]["items"]}
    by_go_w = {tuple(i) for i in digest[widgets]["items"]}
    assert len(by_kubectl_cm) >= 60  # plus kube-root-ca.crt from the controller-manager
    assert by_kubectl_cm == by_python_cm == by_go_cm
    assert len(by_kubectl_w) == 12
    assert by_kubectl_w == by_python_w == by_go_w

    # WATCH: kubernetes-asyncio, kubectl and the informer see the same changes.
    seen_by_python: list[tuple[str, str, str]] = []

    async def python_watch() -> None:
        stream = k8s_watch.Watch()
        async for event in stream.stream(
            core.list_namespaced_config_map,
            namespace,
            resource_version=listed.metadata.resource_version,
            timeout_seconds=60,
        ):
            obj = event["object"]
            seen_by_python.append((event["type"], obj.metadata.name, obj.metadata.resource_version))
            if len(seen_by_python) == 15:
                stream.stop()

    # kubectl lists, then watches: one line per event, the initial list as ADDED events.
    kubectl_watch = subprocess.Popen(
        [
            str(plane.kubectl()),
            f"--kubeconfig={plane.admin_kubeconfig}",
            "get",
            "configmaps",
            "-n",
            namespace,
            "--watch",
            "--output-watch-events",
            "-o",
            'jsonpath={.type} {.object.metadata.name} {.object.metadata.resourceVersion}{"\\n"}',
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert kubectl_watch.stdout is not None
    by_kubectl_initial = [kubectl_watch.stdout.readline() for _ in by_kubectl_cm]
    assert all(line.startswith("ADDED ") for line in by_kubectl_initial), by_kubectl_initial
    watcher = asyncio.create_task(python_watch())
    await asyncio.sleep(1)
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    for i in range(5):
        await admin_api.create(path, kubeapi.configmap(name=f"new-{i}", namespace=namespace))
        await admin_api.merge_patch(f"{path}/cm-{i:06d}", {"data": {"changed": "yes"}})
        await admin_api.delete(f"{path}/cm-{i + 10:06d}")
    await asyncio.wait_for(watcher, 60)

    informer.wait_for(
        lambda ls: (
            sum(
                1
                for x in ls
                if x["kind"] == "event" and x["resource"] == configmaps and not x.get("initial")
            )
            >= 15
        )
    )
    by_go_events = [
        (e["type"], e["name"], e["rv"])
        for e in informer.events()
        if e["resource"] == configmaps and not e.get("initial")
    ]
    assert by_go_events == seen_by_python
    assert [t for t, _, _ in seen_by_python].count("DELETED") == 5

    by_kubectl_events = [tuple(kubectl_watch.stdout.readline().split()) for _ in seen_by_python]
    kubectl_watch.terminate()
    kubectl_watch.wait(10)
    assert by_kubectl_events == seen_by_python

    after = keys_of(
        json.loads(kubectl("get", "configmaps", "-n", namespace, "-o", "json").stdout)["items"]
    )
    assert {tuple(i) for i in informer.digest()[configmaps]["items"]} == after


def test_apiserver_stops_and_restarts_on_the_same_data(
    plane: ControlPlane, kubectl: Kubectl, namespace: str
) -> None:
    kubectl("create", "configmap", "survives-restart", "-n", namespace)
    plane.stop_apiserver()
    refused = kubectl("get", "ns", "--request-timeout=5s", check=False)
    assert refused.returncode != 0
    plane.start_apiserver()
    kept = kubectl("get", "configmap", "survives-restart", "-n", namespace, "-o", "name")
    assert kept.stdout.strip() == "configmap/survives-restart"


def test_up_restarts_a_stopped_plane_and_down_leaves_nothing() -> None:
    directory = Path(tempfile.mkdtemp(prefix="warmwatch-updown-"))
    plane = ControlPlane(directory)
    try:
        plane.up()
        run = [str(plane.kubectl()), f"--kubeconfig={plane.admin_kubeconfig}"]
        subprocess.run([*run, "create", "configmap", "kept", "-n", "default"], check=True)
        plane.down()
        assert not any(plane.status().values())
        plane.up()
        got = subprocess.run(
            [*run, "get", "configmap", "kept", "-n", "default", "-o", "name"],
            check=True,
            capture_output=True,
            text=True,
        )
        assert got.stdout.strip() == "configmap/kept"
    finally:
        plane.down()
    leftovers = subprocess.run(["pgrep", "-f", str(directory)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", leftovers.stdout
