"""Fixtures for end-to-end tests against a real etcd + kube-apiserver (loadtest.cluster).

The control plane is session-scoped: started once (binaries cached in ~/.cache/warmwatch) and
stopped at the end, also when tests fail. Set WARMWATCH_E2E_DIR to reuse a plane you started
with `python -m loadtest.cluster up --dir DIR`; it is then left running. Tests isolate themselves
by namespace (the ``namespace`` fixture) rather than by restarting the plane.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config

from loadtest import goclient, kubeapi
from loadtest.cluster import ControlPlane
from loadtest.controllers import TEST_CONTROLLERS, ControllerManager
from loadtest.sidecar import Sidecar

pytestmark = pytest.mark.e2e

Kubectl = Callable[..., subprocess.CompletedProcess[str]]
StartKcm = Callable[..., ControllerManager]


@pytest.fixture(scope="session")
def plane() -> Iterator[ControlPlane]:
    reuse = os.environ.get("WARMWATCH_E2E_DIR")
    if reuse:
        existing = ControlPlane(Path(reuse))
        existing.up()  # no-op when running; restarts stopped processes
        yield existing
        return
    directory = Path(tempfile.mkdtemp(prefix="warmwatch-e2e-"))
    started = ControlPlane(directory)
    atexit.register(started.down)  # also on an interrupted session
    try:
        started.up()
        yield started
    finally:
        started.down()


@pytest.fixture(scope="session")
def kubectl(plane: ControlPlane) -> Kubectl:
    """Run the control plane's own kubectl (same release) as admin unless told otherwise."""

    def run(
        *args: str, kubeconfig: Path | None = None, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(plane.kubectl()), f"--kubeconfig={kubeconfig or plane.admin_kubeconfig}", *args],
            capture_output=True,
            text=True,
            input=stdin,
            timeout=120,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result

    return run


@pytest.fixture
async def admin_api(plane: ControlPlane) -> AsyncIterator[kubeapi.RawClient]:
    """Raw JSON client to the apiserver as admin, for setting the stage fast."""
    async with kubeapi.RawClient(
        base_url=plane.server, ssl_context=kubeapi.client_ssl(plane.pki, identity="admin")
    ) as api:
        yield api


async def _api_client(kubeconfig: Path) -> k8s_client.ApiClient:
    configuration = k8s_client.Configuration()
    await k8s_config.load_kube_config(
        config_file=str(kubeconfig), client_configuration=configuration
    )
    return k8s_client.ApiClient(configuration)


@pytest.fixture
async def admin_client(plane: ControlPlane) -> AsyncIterator[k8s_client.ApiClient]:
    """kubernetes-asyncio as admin."""
    api = await _api_client(plane.admin_kubeconfig)
    async with api:
        yield api


@pytest.fixture
async def restricted_client(plane: ControlPlane) -> AsyncIterator[k8s_client.ApiClient]:
    """kubernetes-asyncio as the restricted identity: authenticated, no RBAC grants."""
    api = await _api_client(plane.restricted_kubeconfig)
    async with api:
        yield api


@pytest.fixture
async def namespace(admin_api: kubeapi.RawClient) -> str:
    """A fresh namespace per test, so tests never see each other's objects."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    await kubeapi.ensure_namespace(admin_api, name)
    return name


CreateMany = Callable[..., Awaitable[list[dict[str, Any]]]]


@pytest.fixture
def create_many(admin_api: kubeapi.RawClient) -> CreateMany:
    """``await create_many(namespace=..., count=...)``: ConfigMaps created concurrently."""

    async def create(*, namespace: str, count: int, **options: Any) -> list[dict[str, Any]]:
        return await kubeapi.create_configmaps(
            admin_api, namespace=namespace, count=count, **options
        )

    return create


@pytest.fixture(scope="session")
def goclient_binary() -> Path:
    return goclient.build()


@pytest.fixture
def start_goclient(goclient_binary: Path) -> Iterator[Callable[..., goclient.GoClient]]:
    """Start Go informer programs; all are stopped at the end of the test."""
    started: list[goclient.GoClient] = []

    def start(**options: Any) -> goclient.GoClient:
        client = goclient.GoClient.start(goclient_binary, **options)
        started.append(client)
        return client

    yield start
    for client in started:
        client.stop()


@pytest.fixture
def start_sidecar(plane: ControlPlane, tmp_path: Path) -> Iterator[Callable[..., Sidecar]]:
    """Start warmwatch processes against the control plane (admin identity upstream; through
    ``upstream``, a kubeconfig, when given); all are stopped at the end of the test. Each gets
    its own database unless ``db`` is given."""
    started: list[Sidecar] = []

    def start(
        *,
        resources: Sequence[str] = (),
        db: Path | None = None,
        extra: Sequence[str] = (),
        wait_ready: bool = True,
        upstream: Path | None = None,
    ) -> Sidecar:
        sidecar = Sidecar.start(
            upstream_kubeconfig=upstream or plane.admin_kubeconfig,
            db=db or tmp_path / f"warmwatch-{len(started)}.db",
            resources=resources,
            extra=extra,
            wait_ready=wait_ready,
        )
        started.append(sidecar)
        return sidecar

    yield start
    for sidecar in started:
        sidecar.stop()


Keys = set[tuple[str, str, str]]
"""Objects as (namespace, name, resourceVersion): what the informer digests compare."""


def keys_of(items: list[dict[str, Any]]) -> Keys:
    return {
        (
            i["metadata"].get("namespace", ""),
            i["metadata"]["name"],
            i["metadata"]["resourceVersion"],
        )
        for i in items
    }


def listed_keys(
    kubectl: Kubectl, kind: str, namespace: str, *, kubeconfig: Path | None = None
) -> Keys:
    """What ``kubectl get KIND -n NAMESPACE`` lists (directly, or through ``kubeconfig``)."""
    out = kubectl("get", kind, "-n", namespace, "-o", "json", kubeconfig=kubeconfig).stdout
    return keys_of(json.loads(out)["items"])


def digest_keys(client: goclient.GoClient, resource: str) -> Keys:
    return {tuple(i) for i in client.digest()[resource]["items"]}  # type: ignore[misc]


async def converge(
    client: goclient.GoClient, resource: str, expected: Keys, *, timeout: float = 120
) -> None:
    """Wait until the informer's cache equals ``expected``; fail with the difference."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if digest_keys(client, resource) == expected:
            return
        await asyncio.sleep(0.5)
    assert digest_keys(client, resource) == expected


# -- kube-controller-manager under test ---------------------------------------------------


@pytest.fixture
def harness_kcm_paused(plane: ControlPlane) -> Iterator[None]:
    """The harness's kube-controller-manager stays stopped during the test (also across
    ``stop_apiserver``/``start_apiserver``) and runs again afterwards, also after a failure."""
    plane.stop_controller_manager()
    try:
        yield
    finally:
        plane.start_controller_manager()
        plane.start_apiserver()  # a no-op when it runs; a failed test may have left it down
        assert plane.status().get("kube-controller-manager"), "harness KCM not resumed"


@pytest.fixture
def start_kcm(plane: ControlPlane, tmp_path: Path, harness_kcm_paused: None) -> Iterator[StartKcm]:
    """Start kube-controller-managers (the plane's build) with the test controller set; each
    logs to its own file in tmp_path; all are stopped at the end of the test, before the
    harness's is resumed."""
    started: list[ControllerManager] = []

    def start(
        *,
        kubeconfig: Path,
        leader_elect: bool = False,
        controllers: Sequence[str] = TEST_CONTROLLERS,
        extra: Sequence[str] = (),
    ) -> ControllerManager:
        kcm = ControllerManager.start(
            binaries=Path(plane.state().binaries),
            kubeconfig=kubeconfig,
            service_account_key=plane.pki.service_account_key,
            root_ca=plane.pki.ca_cert,
            log=tmp_path / f"kube-controller-manager-{len(started)}.log",
            leader_elect=leader_elect,
            controllers=controllers,
            extra=extra,
        )
        started.append(kcm)
        return kcm

    yield start
    for kcm in started:
        kcm.stop()
