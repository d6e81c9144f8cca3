"""Finding the peers to seed from: the running pods of the same workload (docs/design.md §3,
peer seeding).

With ``--seed auto``, no ``--seed-peer`` and the pod's own name and namespace
(``--pod-name``, ``--pod-namespace``, from the downward API), :func:`look_up` asks the
apiserver, with warmwatch's own credentials, for its own pod, the namespace's ReplicaSets
when that pod is a ReplicaSet's, and the namespace's pods; :func:`choose_peers` (pure) picks
the peers among them. Needs ``get`` and ``list`` of pods and ``list`` of replicasets in the
pod's namespace.

The workload is the pod's top owner through controller references: a Deployment (through
any of its ReplicaSets: during a rollout the old pods are the old ReplicaSet's), else the
pod's controller itself (a StatefulSet, a bare ReplicaSet, a DaemonSet, a Job, a custom
controller). A pod without a controller has no peers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Final, TypedDict, cast
from urllib.parse import quote

from proxy.kube.payloads import ObjectMeta
from proxy.upstream.connecting import Upstream

logger = logging.getLogger(__name__)

__all__ = [
    "MAX_PEERS",
    "SIDECAR_CONTAINER",
    "PodPayload",
    "ReplicaSetPayload",
    "choose_peers",
    "look_up",
]

MAX_PEERS: Final = 5
"""Peers asked at most. Each that does not answer costs up to ``seeding.CONNECT_TIMEOUT``
(5 s) of the seed timeout (30 s by default): more could not all be tried anyway, and a
refusing peer costs it a TokenReview."""

SIDECAR_CONTAINER: Final = "warmwatch"
"""The sidecar's container name in ``deploy/component``: a pod that is not Ready (its
controller's readiness probe failing, a standby) is still a peer when this container is
ready — the cache is warmwatch's, not the controller's."""


class ConditionPayload(TypedDict, total=False):
    type: str
    status: str


class ContainerStatusPayload(TypedDict, total=False):
    name: str
    ready: bool


class PodStatusPayload(TypedDict, total=False):
    phase: str
    podIP: str
    conditions: list[ConditionPayload]
    containerStatuses: list[ContainerStatusPayload]
    initContainerStatuses: list[ContainerStatusPayload]


class PodPayload(TypedDict, total=False):
    metadata: ObjectMeta
    status: PodStatusPayload


class ReplicaSetPayload(TypedDict, total=False):
    metadata: ObjectMeta


def _controller(meta: ObjectMeta) -> tuple[str, str] | None:
    """The kind and uid of the object's controller: the owner reference marked so (at most
    one, by the API's validation); a ReplicaSet's kind is ``apps/ReplicaSet``, whatever its
    version (a custom resource may be named so too)."""
    for owner in meta.get("ownerReferences") or ():
        if owner.get("controller") and owner.get("uid"):
            group = owner.get("apiVersion", "").rpartition("/")[0]
            return f"{group}/{owner.get('kind', '')}", owner["uid"]
    return None


def _workload(pod: PodPayload, replica_sets: Sequence[ReplicaSetPayload]) -> frozenset[str]:
    """The uids of the controllers whose pods belong to the pod's workload: its
    Deployment's ReplicaSets, or else its own controller; none for a pod without one."""
    owner = _controller(pod.get("metadata") or {})
    if owner is None:
        return frozenset()
    kind, uid = owner
    if kind != "apps/ReplicaSet":
        return frozenset({uid})
    parents = {
        meta.get("uid", ""): _controller(meta)
        for meta in (rs.get("metadata") or {} for rs in replica_sets)
    }
    deployment = parents.get(uid)
    if deployment is None or deployment[0] != "apps/Deployment":
        return frozenset({uid})  # a bare ReplicaSet (or one gone since)
    return frozenset({uid, *(rs for rs, parent in parents.items() if parent == deployment)})


def _serving(pod: PodPayload) -> bool:
    """Running, not being deleted, with an address, and Ready or its warmwatch ready."""
    status = pod.get("status") or {}
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False  # its process is stopping: it may go away mid-snapshot
    if status.get("phase") != "Running" or not status.get("podIP"):
        return False
    if any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    ):
        return True
    containers = [
        *(status.get("initContainerStatuses") or ()),
        *(status.get("containerStatuses") or ()),
    ]
    return any(c.get("name") == SIDECAR_CONTAINER and c.get("ready") for c in containers)


def choose_peers(
    *,
    own: PodPayload,
    pods: Iterable[PodPayload],
    replica_sets: Sequence[ReplicaSetPayload] = (),
    port: int,
) -> tuple[tuple[str, int], ...]:
    """The peers of ``own`` among ``pods`` (its namespace's), as ``(podIP, port)``: pods of
    the same workload (:func:`_workload`), not ``own``, serving (:func:`_serving`); the
    newest first — during a rollout the old pods are the next to be deleted, and every
    serving peer is equally current (each watches the apiserver) — at most
    :data:`MAX_PEERS`."""
    controllers = _workload(own, replica_sets)
    own_meta = own.get("metadata") or {}
    itself = (own_meta.get("uid"), own_meta.get("name"))
    found: list[tuple[str, str, str]] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        owner = _controller(meta)
        if owner is None or owner[1] not in controllers:
            continue
        if meta.get("uid") == itself[0] or meta.get("name") == itself[1]:
            continue
        if _serving(pod):
            ip = (pod.get("status") or {}).get("podIP", "")
            found.append((meta.get("creationTimestamp") or "", meta.get("name", ""), ip))
    # RFC 3339 in UTC with second precision (the apiserver's form) sorts as text.
    found.sort(key=lambda item: (item[0], item[1]), reverse=True)
    return tuple((ip, port) for _, _, ip in found[:MAX_PEERS])


async def look_up(
    upstream: Upstream, *, name: str, namespace: str, port: int
) -> tuple[tuple[str, int], ...]:
    """The peers of the pod ``namespace/name`` (:func:`choose_peers`), asked of the
    apiserver: its pod, its namespace's ReplicaSets when a ReplicaSet owns it, and its
    namespace's running pods. Failures are raised as the upstream layer's errors; the caller
    bounds the time."""
    pods_path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods"
    own = cast(
        PodPayload,
        await upstream.json_request(
            "GET", f"{pods_path}/{quote(name, safe='')}", purpose="review", verb="GET"
        ),
    )
    owner = _controller(own.get("metadata") or {})
    replica_sets: list[ReplicaSetPayload] = []
    if owner is not None and owner[0] == "apps/ReplicaSet":
        answer = await upstream.json_request(
            "GET",
            f"/apis/apps/v1/namespaces/{quote(namespace, safe='')}/replicasets",
            purpose="review",
            verb="LIST",
        )
        replica_sets = list(answer.get("items") or ())
    answer = await upstream.json_request(
        "GET",
        (pods_path, {"fieldSelector": "status.phase=Running"}),
        purpose="review",
        verb="LIST",
    )
    pods = cast(list[PodPayload], answer.get("items") or [])
    return choose_peers(own=own, pods=pods, replica_sets=replica_sets, port=port)
