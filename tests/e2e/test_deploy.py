"""deploy/: the Kustomize component rendered by kubectl and accepted by a real apiserver
(``kubectl apply --dry-run=server``: admission and validation run, nothing is stored)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import Kubectl

pytestmark = pytest.mark.e2e

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"

DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata:
  name: my-operator
  annotations: {warmwatch.io/sidecar: enabled}
spec:
  selector:
    matchLabels: {app: my-operator}
  template:
    metadata:
      labels: {app: my-operator}
    spec:
      initContainers:
      - {name: migrate, image: example.com/migrate:1}
      containers:
      - name: operator
        image: example.com/operator:1
        env: [{name: LOG_LEVEL, value: debug}]
      - {name: exporter, image: example.com/exporter:1}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: left-alone
spec:
  selector:
    matchLabels: {app: left-alone}
  template:
    metadata:
      labels: {app: left-alone}
    spec:
      containers: [{name: main, image: example.com/main:1}]
"""


def relative(path: Path, start: Path) -> str:
    """kustomize takes other kustomizations by relative path only."""
    return os.path.relpath(path, start)


def render(kubectl: Kubectl, directory: Path) -> list[dict[str, Any]]:
    out = kubectl("kustomize", str(directory)).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def apply_dry_run(kubectl: Kubectl, documents: list[dict[str, Any]]) -> str:
    result = kubectl(
        "apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump_all(documents), check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def pod_of(documents: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (workload,) = (d for d in documents if d["kind"] == kind and d["metadata"]["name"] == name)
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def assert_sidecar_first(pod: dict[str, Any]) -> None:
    sidecar = pod["initContainers"][0]
    assert sidecar["name"] == "warmwatch"
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["securityContext"] | {} == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert sidecar["startupProbe"]["httpGet"]["path"] == "/readyz"
    assert sidecar["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert {"name": "warmwatch-cache", "mountPath": "/var/lib/warmwatch"} in sidecar["volumeMounts"]
    controller = pod["containers"][0]
    assert {"name": "KUBECONFIG", "value": "/etc/warmwatch/kubeconfig"} in controller["env"]
    assert {"name": "warmwatch-kubeconfig", "mountPath": "/etc/warmwatch"} in controller[
        "volumeMounts"
    ]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["warmwatch-kubeconfig"]["configMap"]["name"].endswith("warmwatch-kubeconfig")
    # TLS for the token: the sidecar's --cert-dir is the volume the controller trusts.
    tls = {"name": "warmwatch-tls", "mountPath": "/var/run/warmwatch"}
    assert tls in sidecar["volumeMounts"] and tls in controller["volumeMounts"]
    assert "--cert-dir=/var/run/warmwatch" in sidecar["args"]
    assert (
        "--client-auth=token-file:/var/run/secrets/kubernetes.io/serviceaccount/token"
        in sidecar["args"]
    )
    assert volumes["warmwatch-tls"]["emptyDir"]["medium"] == "Memory"
    # Peer seeding: served on 9091 (TLS), the peers found from the pod's own name and
    # namespace (the downward API).
    env = {e["name"]: e for e in sidecar["env"]}
    assert env["WARMWATCH_SEED_LISTEN"]["value"] == "0.0.0.0:9091"
    for variable, field in (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace")):
        assert env[f"WARMWATCH_{variable}"]["valueFrom"] == {"fieldRef": {"fieldPath": field}}
    assert {"name": "ww-seed", "containerPort": 9091} in sidecar["ports"]


def test_component_on_a_deployment(kubectl: Kubectl, namespace: str, tmp_path: Path) -> None:
    (tmp_path / "workloads.yaml").write_text(DEPLOYMENT)
    (tmp_path / "kustomization.yaml").write_text(
        f"namespace: {namespace}\n"
        "resources: [workloads.yaml]\n"
        f"components: [{relative(DEPLOY / 'component', tmp_path)}]\n"
    )
    documents = render(kubectl, tmp_path)
    pod = pod_of(documents, "Deployment", "my-operator")
    assert_sidecar_first(pod)
    # The workload's own init container follows the sidecar; its env is kept, and only the
    # first container is the controller.
    assert [c["name"] for c in pod["initContainers"]] == ["warmwatch", "migrate"]
    assert pod["containers"][0]["env"][0] == {"name": "LOG_LEVEL", "value": "debug"}
    assert "env" not in pod["containers"][1]
    assert pod["volumes"][0]["name"] in ("warmwatch-cache", "warmwatch-kubeconfig")
    # A Deployment without the annotation is left alone.
    assert "initContainers" not in pod_of(documents, "Deployment", "left-alone")

    out = apply_dry_run(kubectl, documents)
    assert "deployment.apps/my-operator created (server dry run)" in out
    assert "configmap/warmwatch-kubeconfig created (server dry run)" in out


def test_example_overlay_on_a_statefulset(kubectl: Kubectl, namespace: str, tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(
        f"namespace: {namespace}\nresources: [{relative(DEPLOY / 'example', tmp_path)}]\n"
    )
    documents = render(kubectl, tmp_path)
    pod = pod_of(documents, "StatefulSet", "my-controller")
    assert_sidecar_first(pod)
    sidecar = pod["initContainers"][0]
    assert sidecar["image"] == "registry.example.com/warmwatch:0.1.0"
    assert "--resource=v1/configmaps" in sidecar["args"]
    account = pod["serviceAccountName"]
    bindings = [d for d in documents if d["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    assert len(bindings) == 3
    # The grants go to the account where it is deployed: the outer kustomization's namespace.
    subjects = [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
    assert all(binding["subjects"] == subjects for binding in bindings)
    assert_seeding_rules(documents, account=account, namespace=namespace)

    out = apply_dry_run(kubectl, documents)
    assert "statefulset.apps/my-controller created (server dry run)" in out
    assert "clusterrole.rbac.authorization.k8s.io/my-controller-warmwatch" in out
    assert "role.rbac.authorization.k8s.io/my-controller-warmwatch-seeding created" in out


def assert_seeding_rules(documents: list[dict[str, Any]], *, account: str, namespace: str) -> None:
    """What seeding asks of the apiserver, granted and no more: in the namespace, get its
    pod, list pods and ReplicaSets (the lookup), and tokens of its own account only; in the
    cluster, the kube-system namespace and TokenReviews."""
    (role,) = (d for d in documents if d["kind"] == "Role")
    assert role["metadata"]["namespace"] == namespace
    granted = {
        (group, resource, verb, tuple(rule.get("resourceNames", ())))
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == {
        ("", "pods", "get", ()),
        ("", "pods", "list", ()),
        ("apps", "replicasets", "list", ()),
        ("", "serviceaccounts/token", "create", (account,)),
    }
    (cluster_role,) = (
        d
        for d in documents
        if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-seeding")
    )
    assert cluster_role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["namespaces"],
            "resourceNames": ["kube-system"],
            "verbs": ["get"],
        },
        {
            "apiGroups": ["authentication.k8s.io"],
            "resources": ["tokenreviews"],
            "verbs": ["create"],
        },
    ]
