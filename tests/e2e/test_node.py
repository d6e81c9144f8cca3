"""warmwatch where its users run it: the image, ``deploy/component`` and a real kubelet.

The module brings up its own control plane with a node (``ControlPlane.up(node=True)``:
containerd and a kubelet, loadtest/node.py), so that stopping its apiserver and the
kube-controller-manager controllers pods need disturb no other test; ~15 s, plus the image
builds (cached: ~25 s when only the code changed). It builds ``localhost/warmwatch:dev``
(``make image``) and the controller-runtime manager of tests/crmanager as a scratch image,
loads both into the node, and deploys the manager's StatefulSet with the component plus
``tests/node/machine`` (only what the test machine forces) and ``tests/node/short-token``
(a 600 s token, so that the kubelet rotates it during the module), rendered by the plane's
``kubectl kustomize``. The manager reaches warmwatch as the component sets it up: over TLS
with the sidecar's ``--cert-dir`` certificate, presenting the pod's token. The scenarios run in order on that one deployment, each asserting what
the manager prints and what warmwatch's metrics show; the rollout scenario adds a second
node (``up --second-node``) and a Deployment of the same manager; the last one stops the
nodes and checks that nothing of them is left on the machine.

The pod runs with ``hostNetwork``: warmwatch listens on the host's 127.0.0.1:8001,
0.0.0.0:9090 and 0.0.0.0:9091 (the component's ports), which the harness never hands out (ports.py: ≥ 10000).
``WARMWATCH_NODE_OBJECTS`` sets the number of ConfigMaps (default 1,000; the README's start
times are from a run with 20,000, printed by the tests as ``node: ...`` lines).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import sqlite3
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from loadtest import crmanager, images, kubeapi
from loadtest import node as node_module
from loadtest.cluster import ControlPlane
from proxy.cache import schema
from proxy.serve.authenticating import ROTATION_GRACE

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
TREES = REPO / "tests" / "node"
CRMANAGER_IMAGE = "localhost/warmwatch-crmanager:dev"
KCM_IMAGE = "localhost/warmwatch-kcm:dev"
NAMESPACE = "node-test"
LABELS = {"warmwatch.test/mirror": "true"}
METRICS = "http://127.0.0.1:9090/metrics"
OBJECTS = int(os.environ.get("WARMWATCH_NODE_OBJECTS", "1000"))
LABELLED = 20
"""Of the ConfigMaps, this many are mirrored by the manager (the rest are only cached)."""

POD_TIMEOUT = 180.0
"""Pod creation to the manager synced: a cold fill of 20,000 objects is ~10 s, but CI is slow."""
EFFECT_TIMEOUT = 60.0
"""Seconds for the running manager to mirror a new ConfigMap."""


@dataclass
class NodeTest:
    """The module's plane with its node, and what the scenarios carry from one to the next."""

    plane: ControlPlane
    workdir: Path
    iptables_before: str
    figures: dict[str, float] = field(default_factory=dict)
    pod_name: str = "crmanager-0"
    """The StatefulSet's one pod: the crmanager's, later kube-controller-manager's."""

    def kubectl(
        self, *args: str, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.plane.kubectl()), f"--kubeconfig={self.plane.admin_kubeconfig}", *args],
            capture_output=True,
            text=True,
            input=stdin,
            timeout=120,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr}")
        return result

    def pod(self) -> dict[str, Any]:
        found = self.kubectl(
            "get", "pod", "-n", NAMESPACE, self.pod_name, "-o", "json", check=False
        )
        return json.loads(found.stdout) if found.returncode == 0 else {}

    def container_log(self, pod: dict[str, Any], container: str) -> list[tuple[datetime, str]]:
        """The current run's lines of ``container`` from the kubelet's log files on disk (read
        while the apiserver is down too): (time, text)."""
        meta = pod["metadata"]
        directory = (
            self.plane.node_named(pod["spec"]["nodeName"]).directory
            / "pod-logs"
            / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
            / container
        )
        files = sorted(directory.glob("*.log"), key=lambda p: int(p.stem))
        if not files:
            return []
        lines = []
        for raw in files[-1].read_text(errors="replace").splitlines():
            stamp, _stream, _tag, text = raw.split(" ", 3)
            lines.append((datetime.fromisoformat(stamp), text))
        return lines

    def manager_lines(self, pod: dict[str, Any], kind: str) -> list[dict[str, Any]]:
        found = []
        for _, text in self.container_log(pod, "manager"):
            with contextlib.suppress(json.JSONDecodeError):
                line = json.loads(text)
                if isinstance(line, dict) and line.get("kind") == kind:
                    found.append(line)
        return found


def _metrics_text(node: node_module.Node | None) -> str:
    """The metrics of the pod on ``node`` (None: the first node): on the second one, read
    from inside its network namespace, where the pod's metrics port is."""
    if node is None or node.netns is None:
        with urllib.request.urlopen(METRICS, timeout=5) as answer:
            return str(answer.read().decode())
    read = f"import urllib.request; print(urllib.request.urlopen({METRICS!r}, timeout=5).read().decode())"
    return subprocess.run(
        node.inside([sys.executable, "-c", read]),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout


def _metric(
    name: str, labels: dict[str, str] | None = None, *, node: node_module.Node | None = None
) -> float:
    """Sum of the samples of ``name`` with ``labels`` on the pod's metrics port (the pod on
    ``node``, by default the first node's)."""
    text = _metrics_text(node)
    total = 0.0
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        metric, _, label_text = series.partition("{")
        if line.startswith("#") or metric != name:
            continue
        found = dict(p.split("=", 1) for p in label_text.rstrip("}").split(",") if "=" in p)
        if all(found.get(k, "").strip('"') == v for k, v in (labels or {}).items()):
            total += float(value)
    return total


def _wait(check: Callable[[], Any], *, what: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, KeyError, ValueError):
            found = check()
            if found:
                return found
        time.sleep(0.5)
    raise TimeoutError(f"{what}: not after {timeout:.0f}s")


def _port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as probe:
        return probe.connect_ex((host, port)) != 0


@pytest.fixture(scope="module")
def node_test(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeTest]:
    assert all(map(_port_free, (8001, 9090, 9091))), "the component's ports are taken on this host"
    images.ensure_packages()  # iptables-save among them, on a fresh machine
    iptables_before = node_module.iptables_rules()
    plane = ControlPlane(tmp_path_factory.mktemp("node-plane"))
    try:
        plane.up(node=True)
        images.build_warmwatch()
        images.import_files(
            image=CRMANAGER_IMAGE,
            files={"/crmanager": crmanager.build()},
            entrypoint=["/crmanager"],
        )
        for image in (images.WARMWATCH_IMAGE, CRMANAGER_IMAGE):
            plane.load_image(image)
        yield NodeTest(
            plane=plane,
            workdir=tmp_path_factory.mktemp("node-deploy"),
            iptables_before=iptables_before,
        )
    finally:
        plane.down()


def _local_volume(path: Path) -> dict[str, Any]:
    """A ``local`` PersistentVolume at ``path`` on the node, for the StatefulSet's claim."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"{NAMESPACE}-cache"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "local": {"path": str(path)},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": [node_module.NODE_NAME],
                                }
                            ]
                        }
                    ]
                }
            },
        },
    }


MANAGER_RESOURCES = (f"v1/configmaps@{NAMESPACE};protobuf", f"v1/configmaps@{NAMESPACE}")
"""protobuf: what the typed manager reads; JSON: what this test reads of the cache."""


OLD_RELEASE_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- {name: warmwatch, cluster: {server: "http://127.0.0.1:8001"}}
users:
- {name: pod, user: {}}
contexts:
- {name: warmwatch, context: {cluster: warmwatch, user: pod}}
current-context: warmwatch
"""
"""The component as it was before ``--cert-dir``: plain HTTP on loopback, no credentials
(``--client-auth none``)."""


def _kustomization(
    test: NodeTest,
    *,
    app: str = "crmanager",
    resources: tuple[str, ...] = MANAGER_RESOURCES,
    warmwatch_tag: str = "dev",
    old_release: bool = False,
    kind: str = "StatefulSet",
) -> Path:
    """The last layer: the controller ``app`` (a tree in tests/node, a ``kind``) with the
    machine's component and the short-lived token, the namespace, the apiserver's port, the
    --resource flags, the sidecar's image tag, and for a StatefulSet a local PV and the node
    it is on (``nodeName``: a plane with one node has no scheduler). ``old_release``: the
    sidecar's flags and the kubeconfig as the component had them before ``--cert-dir``
    (``OLD_RELEASE_KUBECONFIG``), which an older image needs."""
    directory = test.workdir / "deploy"
    volume = test.workdir / "volume"
    volume.mkdir(parents=True, exist_ok=True)
    directory.mkdir(exist_ok=True)
    port = test.plane.state().apiserver_port
    (directory / "pv.yaml").write_text(json.dumps(_local_volume(volume)))
    sidecar_env = {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": "any"},
        "spec": {
            "template": {
                "spec": {
                    **({"nodeName": node_module.NODE_NAME} if kind == "StatefulSet" else {}),
                    "initContainers": [
                        {
                            "name": "warmwatch",
                            "env": [{"name": "KUBERNETES_SERVICE_PORT", "value": str(port)}],
                        }
                    ],
                }
            }
        },
    }
    resource = [
        {
            "op": "add",
            "path": "/spec/template/spec/initContainers/0/args/-",
            "value": f"--resource={gvr}",
        }
        for gvr in resources
    ]
    release: list[dict[str, Any]] = []
    if old_release:
        args = {
            "op": "replace",
            "path": "/spec/template/spec/initContainers/0/args",
            "value": ["--client-auth=none"],
        }
        release = [
            {"target": {"kind": kind}, "patch": json.dumps([args])},
            {
                "target": {"kind": "ConfigMap", "name": "warmwatch-kubeconfig"},
                "patch": json.dumps(
                    [
                        {
                            "op": "replace",
                            "path": "/data/kubeconfig",
                            "value": OLD_RELEASE_KUBECONFIG,
                        }
                    ]
                ),
            },
        ]
    (directory / "kustomization.yaml").write_text(
        json.dumps(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": NAMESPACE,
                "resources": [
                    os.path.relpath(TREES / app, directory),
                    *(["pv.yaml"] if kind == "StatefulSet" else []),
                ],
                "components": [
                    os.path.relpath(TREES / "machine", directory),
                    os.path.relpath(TREES / "short-token", directory),
                ],
                "images": [{"name": "localhost/warmwatch", "newTag": warmwatch_tag}],
                "patches": [
                    {"target": {"kind": kind}, "patch": json.dumps(sidecar_env)},
                    *release,
                    {"target": {"kind": kind}, "patch": json.dumps(resource)},
                ],
            }
        )
    )
    return directory


def _deploy(test: NodeTest, directory: Path, *, statefulset: str) -> None:
    """``kubectl kustomize DIRECTORY | kubectl apply``, after the volume and the StatefulSet's
    claim on it are bound: a pod whose claim is not bound yet when it reaches the kubelet
    waits ~15 s for the kubelet's next attempt (the claim made by the StatefulSet controller
    and its pod are created together; the StatefulSet adopts an existing claim)."""
    claim = f"warmwatch-cache-{statefulset}-0"
    test.kubectl("apply", "-f", str(directory / "pv.yaml"))
    test.kubectl(
        "apply",
        "-f",
        "-",
        stdin=json.dumps(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim, "namespace": NAMESPACE},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "",
                    "volumeName": f"{NAMESPACE}-cache",
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            }
        ),
    )
    test.kubectl(
        "wait",
        "-n",
        NAMESPACE,
        f"pvc/{claim}",
        "--for=jsonpath={.status.phase}=Bound",
        f"--timeout={POD_TIMEOUT:.0f}s",
    )
    test.kubectl("apply", "-f", "-", stdin=test.kubectl("kustomize", str(directory)).stdout)


async def _create_configmaps(test: NodeTest, *, count: int, prefix: str, labelled: bool) -> None:
    async with kubeapi.RawClient(
        base_url=test.plane.server,
        ssl_context=kubeapi.client_ssl(test.plane.pki, identity="admin"),
    ) as api:
        await kubeapi.create_configmaps(
            api,
            namespace=NAMESPACE,
            count=count,
            prefix=prefix,
            labels=LABELS if labelled else None,
        )


def _mirrored(test: NodeTest, name: str) -> bool:
    found = test.kubectl("get", "configmap", "-n", NAMESPACE, f"{name}-mirror", check=False)
    return found.returncode == 0


def _synced_pod(test: NodeTest, *, restarts: int = 0, not_uid: str = "") -> dict[str, Any]:
    """Wait until the pod (a new one when ``not_uid``) runs its manager's ``restarts``-th
    restart and that run has printed ``synced``; the pod."""

    def ready() -> dict[str, Any] | None:
        pod = test.pod()
        if not pod or pod["metadata"]["uid"] == not_uid:
            return None
        statuses = pod.get("status", {}).get("containerStatuses", [])
        if not statuses or statuses[0]["restartCount"] < restarts:
            return None
        return pod if test.manager_lines(pod, "synced") else None

    found: dict[str, Any] = _wait(ready, what="manager synced", timeout=POD_TIMEOUT)
    return found


def _seconds_to_synced(test: NodeTest, pod: dict[str, Any]) -> float:
    """Pod creation (the apiserver's timestamp, whole seconds) to the manager's synced line."""
    created = datetime.fromisoformat(pod["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    synced = next(t for t, text in test.container_log(pod, "manager") if '"synced"' in text)
    return (synced - created).total_seconds()


def _pid(program: bytes) -> int:
    """The process in the pod whose command line has ``program`` (the host sees the
    containers' processes)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if program in argv[:2]:
                return int(entry.name)
    raise LookupError(f"no process {program!r}")


def _phases(test: NodeTest, pod: dict[str, Any]) -> str:
    """Where a start's time went: seconds from the pod's creation to each step."""
    created = datetime.fromisoformat(pod["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    steps = {
        "sidecar's first line": test.container_log(pod, "warmwatch")[0][0],
        "manager's first line": test.container_log(pod, "manager")[0][0],
    }
    return ", ".join(f"{k} {(t - created).total_seconds():.1f}s" for k, t in steps.items())


def _manager_pid() -> int:
    return _pid(b"/crmanager")


def _rss_bytes(program: bytes) -> int:
    for line in Path(f"/proc/{_pid(program)}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def test_cold_start(node_test: NodeTest) -> None:
    """The sidecar's startup probe gates the manager, which syncs through warmwatch (cached
    as the manager reads it, protobuf) and mirrors; the sidecar logs JSON lines that
    ``kubectl logs`` shows; its metrics port answers."""
    test = node_test
    test.kubectl("create", "namespace", NAMESPACE)
    asyncio.run(_create_configmaps(test, count=OBJECTS - LABELLED, prefix="plain", labelled=False))
    asyncio.run(_create_configmaps(test, count=LABELLED, prefix="src", labelled=True))
    _deploy(test, _kustomization(test), statefulset="crmanager")

    pod = _synced_pod(test)
    (synced,) = test.manager_lines(pod, "synced")
    # Every ConfigMap of the namespace: ours, kube-root-ca.crt and the component's kubeconfig.
    assert synced["count"] == OBJECTS + 2
    seconds = _seconds_to_synced(test, pod)
    test.figures["cold"] = seconds
    print(f"node: cold start, {OBJECTS} objects: pod created -> manager synced {seconds:.1f}s")
    print(f"node: {_phases(test, pod)}")
    assert _wait(
        lambda: all(_mirrored(test, f"src-{i:06d}") for i in range(LABELLED)),
        what="mirrors",
        timeout=EFFECT_TIMEOUT,
    )

    # The gate: the manager started only after warmwatch had listed the configured collection.
    sidecar_log = test.container_log(pod, "warmwatch")
    listed_at = next(t for t, text in sidecar_log if "listed at RV" in text)
    statuses = {s["name"]: s for s in pod["status"]["containerStatuses"]}
    started = datetime.fromisoformat(
        statuses["manager"]["state"]["running"]["startedAt"].replace("Z", "+00:00")
    )
    assert listed_at.timestamp() < started.timestamp() + 1  # startedAt is whole seconds

    # token-file over the --cert-dir TLS: the pod's token is answered, another one is 401
    # (counted), plain HTTP is not served; the token's identity was checked at the start (a
    # check that could not be made would have been logged).
    assert _listener_get(test, pod, "/version")["major"] == "1"
    with pytest.raises(urllib.error.HTTPError) as refused:
        _listener_get(test, pod, "/version", token="not-the-pod-token")
    assert refused.value.code == 401
    assert _metric("warmwatch_client_errors_total", {"reason": "unauthorized"}) == 1
    with pytest.raises((OSError, http.client.HTTPException)):
        urllib.request.urlopen("http://127.0.0.1:8001/version", timeout=10)
    assert not any("cannot check the identity" in text for _, text in sidecar_log)

    logs = test.kubectl("logs", "-n", NAMESPACE, test.pod_name, "-c", "warmwatch").stdout
    records = [json.loads(line) for line in logs.splitlines()]
    assert {"time", "level", "logger", "message"} <= set(records[0])
    assert any(r.get("resource") == "v1/configmaps" and "objects" in r for r in records)
    # Peer seeding, on by default: the first pod's sidecar looked for peers with the grants
    # the README gives (tests/node/crmanager/rbac.yaml) and found none, which is no fault.
    assert any(
        r["message"].startswith("seeding: peers of pod") and "none serving" in r["message"]
        for r in records
    )
    assert _metric("warmwatch_seedings_total", {"result": "none"}) == 1
    assert [r["message"] for r in records if r["level"] in ("WARNING", "ERROR")] == []

    assert _metric("warmwatch_upstream_relists_total") == 2  # the cold fills: both encodings


def test_controller_crash_restarts_from_cache(node_test: NodeTest) -> None:
    """kill -9 of the manager: the kubelet restarts the container, which syncs from
    warmwatch's cache with no upstream list or watch of the cached collection."""
    test = node_test
    relists = _metric("warmwatch_upstream_relists_total")
    watches = _metric("warmwatch_upstream_requests_total", {"verb": "WATCH"})
    lists = _metric("warmwatch_upstream_requests_total", {"verb": "LIST"})
    os.kill(_manager_pid(), signal.SIGKILL)
    pod = _synced_pod(test, restarts=1)
    (synced,) = test.manager_lines(pod, "synced")
    assert synced["count"] == OBJECTS + 2 + LABELLED  # the mirrors too
    assert _metric("warmwatch_upstream_relists_total") == relists
    assert _metric("warmwatch_upstream_requests_total", {"verb": "WATCH"}) == watches
    assert _metric("warmwatch_upstream_requests_total", {"verb": "LIST"}) == lists
    asyncio.run(_create_configmaps(test, count=1, prefix="after-crash", labelled=True))
    assert _wait(
        lambda: _mirrored(test, "after-crash-000000"), what="mirror", timeout=EFFECT_TIMEOUT
    )


def test_pod_deleted_resumes_from_volume(node_test: NodeTest) -> None:
    """The StatefulSet's new pod finds the cache on its volume: warmwatch resumes the
    collection (no list) and its watch from the stored resourceVersion."""
    test = node_test
    old = test.pod()
    test.kubectl("delete", "pod", "-n", NAMESPACE, test.pod_name, "--wait=false")
    pod = _synced_pod(test, not_uid=old["metadata"]["uid"])
    seconds = _seconds_to_synced(test, pod)
    test.figures["warm"] = seconds
    print(f"node: warm start (pod deleted), {OBJECTS} objects: -> manager synced {seconds:.1f}s")
    print(f"node: {_phases(test, pod)}")
    sidecar_log = [text for _, text in test.container_log(pod, "warmwatch")]
    assert any("(resumed, configured)" in text for text in sidecar_log), sidecar_log[:5]
    assert not any("listed at RV" in text for text in sidecar_log)
    assert _metric("warmwatch_upstream_relists_total") == 0
    asyncio.run(_create_configmaps(test, count=1, prefix="after-delete", labelled=True))
    assert _wait(
        lambda: _mirrored(test, "after-delete-000000"), what="mirror", timeout=EFFECT_TIMEOUT
    )
    rss = _rss_bytes(b"/opt/warmwatch/bin/warmwatch")
    print(f"node: warmwatch RSS in the pod {rss / 2**20:.0f} MiB ({OBJECTS} objects)")


def _pod_volume(test: NodeTest, pod: dict[str, Any], *, plugin: str, name: str) -> Path:
    """A volume of ``pod`` on the node: the kubelet's directory for it (``name`` a glob)."""
    volumes = (
        test.plane.directory
        / "node/kubelet/root/pods"
        / pod["metadata"]["uid"]
        / f"volumes/kubernetes.io~{plugin}"
    )
    (volume,) = volumes.glob(name)
    return volume


def _token_volume(test: NodeTest, pod: dict[str, Any]) -> Path:
    """The pod's service-account volume (tests/node/short-token): token, ca.crt, namespace,
    behind the ``..data`` symlink the kubelet's atomic writer swaps."""
    return _pod_volume(test, pod, plugin="projected", name="kube-api-access-*")


def _listener_get(
    test: NodeTest, pod: dict[str, Any], path: str, *, token: str | None = None
) -> Any:
    """GET ``path`` on the pod's listener as its manager does (the host's loopback:
    hostNetwork): https, trusting the certificate the sidecar made in its ``--cert-dir``
    volume, with the pod's token (or ``token``); the decoded answer."""
    ca = _pod_volume(test, pod, plugin="empty-dir", name="warmwatch-tls") / "warmwatch.crt"
    token = (_token_volume(test, pod) / "token").read_text() if token is None else token
    request = urllib.request.Request(
        f"https://127.0.0.1:8001{path}", headers={"Authorization": f"Bearer {token}"}
    )
    context = ssl.create_default_context(cafile=str(ca))
    with urllib.request.urlopen(request, timeout=10, context=context) as answer:
        return json.loads(answer.read())


def _cached_names(test: NodeTest, pod: dict[str, Any], *, name: str = "") -> set[str]:
    """ConfigMaps of the namespace in warmwatch's cache: a LIST on the pod's listener, which
    warmwatch answers from the cache."""
    query = f"?fieldSelector=metadata.name%3D{name}" if name else ""
    found = _listener_get(test, pod, f"/api/v1/namespaces/{NAMESPACE}/configmaps{query}")
    return {item["metadata"]["name"] for item in found["items"]}


def test_apiserver_down_controller_killed(node_test: NodeTest) -> None:
    """A ConfigMap is created while the manager is frozen (SIGSTOP: it sees nothing, and the
    kubelet does not restart it); then the apiserver stops and the manager is killed. It
    restarts and syncs from the cache alone, the new ConfigMap included; when the apiserver
    returns, this run mirrors it."""
    test = node_test
    pod = test.pod()
    restarts = pod["status"]["containerStatuses"][0]["restartCount"]
    frozen = _manager_pid()
    os.kill(frozen, signal.SIGSTOP)
    try:
        asyncio.run(_create_configmaps(test, count=1, prefix="in-outage", labelled=True))
        _wait(
            lambda: _cached_names(test, pod, name="in-outage-000000"),
            what="cached",
            timeout=EFFECT_TIMEOUT,
        )
        test.plane.stop_apiserver()
    finally:
        os.kill(frozen, signal.SIGKILL)
    try:

        def synced_again() -> bool:
            # the pod's status cannot be read now: the kubelet's log file of the next run
            # (named by its restart count) tells the restart
            numbers = [int(path.stem) for path in _log_files(test, pod)]
            return max(numbers) > restarts and bool(test.manager_lines(pod, "synced"))

        _wait(synced_again, what="manager synced, apiserver down", timeout=POD_TIMEOUT)
        (synced,) = test.manager_lines(pod, "synced")
        cached = _cached_names(test, pod)
        assert "in-outage-000000" in cached
        assert synced["count"] == len(cached)
        assert not _cached_names(test, pod, name="in-outage-000000-mirror")
    finally:
        test.plane.start_apiserver()
    assert _wait(lambda: _mirrored(test, "in-outage-000000"), what="mirror", timeout=EFFECT_TIMEOUT)
    created = {
        line["name"] for line in test.manager_lines(pod, "reconcile") if line["result"] == "created"
    }
    assert "in-outage-000000" in created


def _log_files(test: NodeTest, pod: dict[str, Any]) -> Iterator[Path]:
    meta = pod["metadata"]
    directory = (
        test.plane.directory
        / "node"
        / "pod-logs"
        / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
        / "manager"
    )
    return directory.glob("*.log")


def _claims(token: str) -> dict[str, Any]:
    """A JWT's claims (not verified: the token is the pod's own, read from its volume)."""
    payload = token.split(".")[1]
    padded = payload + "=" * (-len(payload) % 4)
    claims: dict[str, Any] = json.loads(base64.urlsafe_b64decode(padded))
    return claims


def test_token_rotated_by_the_kubelet(node_test: NodeTest) -> None:
    """The kubelet refreshes the pod's 600 s token (the shortest a pod may ask for,
    tests/node/short-token) at ~80 % of its life. Once the old token has expired and
    warmwatch's grace for it has passed, the manager's next write still goes through:
    the manager sent the new token (client-go re-reads its kubeconfig's ``tokenFile``) and
    warmwatch accepted it, and warmwatch's own upstream request carried the new token too
    (it re-reads its in-cluster token file). No request was refused on either side.

    This waits for the kubelet: up to ~10 minutes from the pod's creation."""
    test = node_test
    pod = test.pod()
    token_file = _token_volume(test, pod) / "token"
    first = token_file.read_text()
    claims = _claims(first)
    assert claims["exp"] - claims["iat"] == 600
    refused = _metric("warmwatch_client_errors_total", {"reason": "unauthorized"})
    upstream_refused = _metric("warmwatch_upstream_requests_total", {"code": "401"})

    _wait(
        lambda: token_file.read_text() != first,
        what="the kubelet rotated the token",
        timeout=max(0.0, claims["exp"] - time.time()) + 30,
    )
    rotated = time.time()
    print(f"node: the kubelet rotated the token {rotated - claims['iat']:.0f}s after its issue")
    second = token_file.read_text()
    assert _claims(second)["exp"] > claims["exp"]
    # The old token is dead upstream and no longer accepted by warmwatch.
    time.sleep(max(0.0, max(claims["exp"], rotated + ROTATION_GRACE) + 5 - time.time()))
    with pytest.raises(urllib.error.HTTPError) as expired:
        _listener_get(test, pod, "/version", token=first)
    assert expired.value.code == 401

    asyncio.run(_create_configmaps(test, count=1, prefix="after-rotation", labelled=True))
    assert _wait(
        lambda: _mirrored(test, "after-rotation-000000"), what="mirror", timeout=EFFECT_TIMEOUT
    )
    assert _listener_get(test, pod, "/version")["major"] == "1"
    # One 401: the expired token above. None for the manager; none from the apiserver.
    assert _metric("warmwatch_client_errors_total", {"reason": "unauthorized"}) == refused + 1
    assert _metric("warmwatch_upstream_requests_total", {"code": "401"}) == upstream_refused
    sidecar_log = [text for _, text in test.container_log(pod, "warmwatch")]
    assert any("token file" in text and "rotated" in text for text in sidecar_log)
    manager_log = [text for _, text in test.container_log(pod, "manager")]
    assert not [text for text in manager_log if "Unauthorized" in text]


OLD_SCHEMA_COMMIT = "a127b88"
"""The last commit whose database is schema version 2 (the next one, ed2b209, made it 3 and
migrates version 2 in place)."""


def _schema_version(test: NodeTest) -> str:
    db = test.workdir / "volume" / "cache.db"
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as connection:
        (version,) = connection.execute(
            "SELECT value FROM meta WHERE key = 'schema_version'"
        ).fetchone()
    return str(version)


def test_upgrade_keeps_cache(node_test: NodeTest, tmp_path: Path) -> None:
    """A pod of an older release (schema version 2, deployed with the component's flags of
    its time: plain HTTP, ``none``) is replaced by one of this build and today's component:
    the new sidecar migrates the database on the volume in place and resumes from it,
    without a relist, and the manager syncs over TLS with its token."""
    test = node_test
    old_tag = "schema2"
    context = images.release_context(commit=OLD_SCHEMA_COMMIT, directory=tmp_path / "old")
    test.plane.load_image(
        images.build_warmwatch(tag=f"localhost/warmwatch:{old_tag}", context=context)
    )
    _remove_deployment(test, "crmanager")  # a fresh one on the old release
    _deploy(
        test,
        _kustomization(test, warmwatch_tag=old_tag, old_release=True),
        statefulset="crmanager",
    )
    old = _synced_pod(test)
    assert _schema_version(test) == "2"

    rendered = test.kubectl("kustomize", str(_kustomization(test))).stdout
    test.kubectl("apply", "-f", "-", stdin=rendered)
    pod = _synced_pod(test, not_uid=old["metadata"]["uid"])
    assert pod["spec"]["initContainers"][0]["image"] == images.WARMWATCH_IMAGE
    sidecar_log = [text for _, text in test.container_log(pod, "warmwatch")]
    assert sum("(resumed, configured)" in text for text in sidecar_log) == 2, sidecar_log[:5]
    assert not any("listed at RV" in text for text in sidecar_log)
    assert _metric("warmwatch_upstream_relists_total") == 0
    assert _schema_version(test) == str(schema.SCHEMA_VERSION)  # migrated in place
    (synced,) = test.manager_lines(pod, "synced")
    assert synced["count"] == len(_cached_names(test, pod))


def _remove_deployment(test: NodeTest, statefulset: str) -> None:
    """The StatefulSet, its pod, claim and volume go (the volume's files too)."""
    test.kubectl("delete", "statefulset", "-n", NAMESPACE, statefulset, "--wait=true")
    _wait(lambda: not test.pod(), what="pod gone", timeout=POD_TIMEOUT)
    test.kubectl("delete", "pvc", "-n", NAMESPACE, "--all", "--wait=true")
    test.kubectl("delete", "pv", f"{NAMESPACE}-cache", "--wait=true")
    shutil.rmtree(test.workdir / "volume")


KCM_RESOURCES = ("batch/v1/jobs;protobuf", "v1/pods;protobuf")
"""What the Job controller lists and watches (kube-controller-manager reads protobuf)."""


def _job(name: str) -> str:
    return json.dumps(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": "localhost/none"}],
                    }
                }
            },
        }
    )


def _job_pods(test: NodeTest, job: str) -> list[str]:
    found = test.kubectl(
        "get", "pods", "-n", NAMESPACE, "-l", f"job-name={job}", "-o", "name"
    ).stdout
    return found.split()


def test_kube_controller_manager_in_an_image(node_test: NodeTest) -> None:
    """kube-controller-manager as the controller: its Job controller creates a Job's pod
    through warmwatch; killed, it restarts from the cache (no relist) and keeps working."""
    test = node_test
    binaries = Path(test.plane.state().binaries)
    images.import_files(
        image=KCM_IMAGE,
        files={"/kube-controller-manager": binaries / "kube-controller-manager"},
        entrypoint=["/kube-controller-manager"],
    )
    test.plane.load_image(KCM_IMAGE)
    _remove_deployment(test, "crmanager")
    test.pod_name = "kcm-0"
    _deploy(test, _kustomization(test, app="kcm", resources=KCM_RESOURCES), statefulset="kcm")
    _wait(
        lambda: test.pod().get("status", {}).get("containerStatuses", [{}])[0].get("ready"),
        what="kube-controller-manager running",
        timeout=POD_TIMEOUT,
    )
    test.kubectl("apply", "-f", "-", stdin=_job("first"))
    _wait(lambda: _job_pods(test, "first"), what="the Job's pod", timeout=EFFECT_TIMEOUT)
    relists = _metric("warmwatch_upstream_relists_total")
    assert relists >= len(KCM_RESOURCES)  # cold fills: the configured, any learned

    os.kill(_pid(b"/kube-controller-manager"), signal.SIGKILL)
    _wait(
        lambda: (
            test.pod()["status"]["containerStatuses"][0]["restartCount"] == 1
            and test.pod()["status"]["containerStatuses"][0]["ready"]
        ),
        what="kube-controller-manager restarted",
        timeout=POD_TIMEOUT,
    )
    test.kubectl("apply", "-f", "-", stdin=_job("second"))
    _wait(lambda: _job_pods(test, "second"), what="the Job's pod", timeout=EFFECT_TIMEOUT)
    assert len(_job_pods(test, "first")) == 1  # the restarted controller made no second
    assert _metric("warmwatch_upstream_relists_total") == relists


def _deployment_pods(test: NodeTest) -> list[dict[str, Any]]:
    found = test.kubectl("get", "pods", "-n", NAMESPACE, "-l", "app=crmanager", "-o", "json")
    return list(json.loads(found.stdout)["items"])


def _synced_deployment_pod(test: NodeTest, *, not_uid: str = "") -> dict[str, Any]:
    """The Deployment's pod (not ``not_uid``) once its manager has printed ``synced``."""

    def synced() -> dict[str, Any] | None:
        for pod in _deployment_pods(test):
            started = pod["spec"].get("nodeName") and pod["status"].get("containerStatuses")
            if pod["metadata"]["uid"] != not_uid and started and test.manager_lines(pod, "synced"):
                return pod
        return None

    found: dict[str, Any] = _wait(synced, what="Deployment's manager synced", timeout=POD_TIMEOUT)
    return found


def _configmap_count(test: NodeTest) -> int:
    return len(test.kubectl("get", "configmaps", "-n", NAMESPACE, "-o", "name").stdout.split())


def test_rollout_seeds_the_new_pod(node_test: NodeTest) -> None:
    """``kubectl rollout restart`` of a Deployment with the component: the new pod's sidecar
    starts on an empty ``emptyDir``, seeds it from the old pod's sidecar (found through the
    apiserver from its own pod, over TLS, proven the same service account), and its manager
    syncs from the seed — no list of the collections — then follows new objects by watch.

    One node cannot hold both pods of the rollout: they are hostNetwork pods of one template,
    with the same host ports. So a second node joins the plane (``up --second-node``: its own
    kubelet and containerd in a network namespace of their own, joined to the first by relays;
    loadtest/node.py) and kube-scheduler runs; the old pod is on one node, and the scheduler
    puts the new one on the other, where the ports are free, as in a cluster."""
    test = node_test
    _remove_deployment(test, "kcm")
    test.kubectl("delete", "jobs", "--all", "-n", NAMESPACE, "--wait=true")
    test.plane.up(second_node=True)
    second = test.plane.node_named(node_module.SECOND_NODE_NAME)
    for image in (images.WARMWATCH_IMAGE, CRMANAGER_IMAGE):
        second.load_image(image)
    directory = _kustomization(test, app="crmanager-deployment", kind="Deployment")
    test.kubectl("apply", "-f", "-", stdin=test.kubectl("kustomize", str(directory)).stdout)
    old = _synced_deployment_pod(test)
    old_node = test.plane.node_named(old["spec"]["nodeName"])
    cold = _seconds_to_synced(test, old)
    assert _metric("warmwatch_upstream_relists_total", node=old_node) == 2  # cold: both
    asyncio.run(_create_configmaps(test, count=10, prefix="before-rollout", labelled=False))

    test.kubectl("rollout", "restart", "-n", NAMESPACE, "deployment/crmanager")
    new = _synced_deployment_pod(test, not_uid=old["metadata"]["uid"])
    seeded = _seconds_to_synced(test, new)
    new_node = test.plane.node_named(new["spec"]["nodeName"])
    assert new_node.name != old_node.name
    print(
        f"node: rollout, {_configmap_count(test)} objects: old pod (cold) {cold:.1f}s, "
        f"new pod (seeded from the old one) {seeded:.1f}s to the manager synced"
    )

    records = [json.loads(text) for _, text in test.container_log(new, "warmwatch")]
    peer = f"{old['status']['podIP']}:9091"
    (installed,) = [r for r in records if r["message"].startswith("seeded ")]
    assert installed["peer"] == peer and installed["bytes"] > 0
    print(f"node: {installed['message']}")
    assert _metric("warmwatch_seedings_total", {"result": "installed"}, node=new_node) == 1
    assert _metric("warmwatch_seeding_bytes_total", node=new_node) == installed["bytes"]
    # started from the seed: both collections resumed from the snapshot's resourceVersions,
    # none listed
    assert sum("(resumed, configured)" in r["message"] for r in records) == 2
    assert _metric("warmwatch_upstream_relists_total", node=new_node) == 0
    assert [r["message"] for r in records if r["level"] in ("WARNING", "ERROR")] == []
    (synced,) = test.manager_lines(new, "synced")
    assert synced["count"] == _configmap_count(test)  # the ConfigMaps made after the seed too

    # the rollout ends with the old pod gone (`rollout status` may return while it is still
    # terminating: a ReplicaSet does not count terminating pods)
    _wait(
        lambda: [p["metadata"]["uid"] for p in _deployment_pods(test)] == [new["metadata"]["uid"]],
        what="the old pod gone",
        timeout=POD_TIMEOUT,
    )
    asyncio.run(_create_configmaps(test, count=1, prefix="after-rollout", labelled=True))
    assert _wait(
        lambda: _mirrored(test, "after-rollout-000000"), what="mirror", timeout=EFFECT_TIMEOUT
    )


def test_down_leaves_nothing_behind(node_test: NodeTest) -> None:
    """``down``: no process, mount, cgroup directory, system path or iptables rule of the
    node is left on the machine."""
    test = node_test
    test.plane.down()
    assert list(test.plane._ours()) == []
    assert [n.leftovers() for n in test.plane.nodes()] == [[], []]
    assert node_module.iptables_rules() == test.iptables_before
    assert all(map(_port_free, (8001, 9090, 9091)))
