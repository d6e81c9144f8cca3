"""Finding peers: the choice (pure, payloads in, addresses out) over many pods and owners,
and the lookup against a fake apiserver (what it asks, and its failures: a cold start, never
a crash)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
from aiohttp import web

from proxy.metrics import Metrics
from proxy.upstream.connecting import ConnectionSettings, Upstream, connect
from proxy.upstream.errors import UpstreamStatusError
from proxy.upstream.peering import (
    MAX_PEERS,
    SIDECAR_CONTAINER,
    PodPayload,
    ReplicaSetPayload,
    choose_peers,
    look_up,
)
from proxy.upstream.seeding import SeedSettings, seed
from tests.unit.upstream.conftest import Served, token_kubeconfig

PORT = 9090


def owner(kind: str, uid: str, *, api_version: str = "apps/v1", controller: bool = True) -> Any:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": f"{kind.lower()}-{uid}",
        "uid": uid,
        "controller": controller,
    }


def pod(
    name: str,
    *,
    owners: list[Any] | None = None,
    ip: str | None = None,
    created: str = "2026-12-05T08:00:00Z",
    phase: str = "Running",
    ready: bool = True,
    deleting: bool = False,
    sidecar_ready: bool | None = None,
) -> PodPayload:
    meta: dict[str, Any] = {"name": name, "uid": f"uid-{name}", "creationTimestamp": created}
    if owners is not None:
        meta["ownerReferences"] = owners
    if deleting:
        meta["deletionTimestamp"] = "2026-12-05T08:10:00Z"
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    if ip is not None:
        status["podIP"] = ip
    if sidecar_ready is not None:
        status["initContainerStatuses"] = [{"name": SIDECAR_CONTAINER, "ready": sidecar_ready}]
        status["containerStatuses"] = [{"name": "controller", "ready": False}]
    return cast(PodPayload, {"metadata": meta, "status": status})


def replica_set(uid: str, *owners: Any) -> ReplicaSetPayload:
    return cast(ReplicaSetPayload, {"metadata": {"uid": uid, "ownerReferences": list(owners)}})


DEPLOYMENT = owner("Deployment", "d1")
OTHER_DEPLOYMENT = owner("Deployment", "d2")
REPLICA_SETS = [
    replica_set("rs-old", DEPLOYMENT),
    replica_set("rs-new", DEPLOYMENT),
    replica_set("rs-other", OTHER_DEPLOYMENT),
    replica_set("rs-bare"),
]
RS_NEW, RS_OLD = owner("ReplicaSet", "rs-new"), owner("ReplicaSet", "rs-old")
ME = pod("me", owners=[RS_NEW], ip="10.0.0.1", created="2026-12-05T08:05:00Z", ready=False)


def peers(own: PodPayload, *pods: PodPayload, replica_sets: Any = REPLICA_SETS) -> list[str]:
    chosen = choose_peers(own=own, pods=[own, *pods], replica_sets=replica_sets, port=PORT)
    assert all(port == PORT for _, port in chosen)
    return [host for host, _ in chosen]


def test_a_deployments_pods_of_every_replica_set_newest_first() -> None:
    old = pod("old", owners=[RS_OLD], ip="10.0.0.2", created="2026-12-01T00:00:00Z")
    new = pod("new", owners=[RS_NEW], ip="10.0.0.3", created="2026-12-05T08:01:00Z")
    other = pod("other", owners=[owner("ReplicaSet", "rs-other")], ip="10.0.0.4")
    assert peers(ME, old, new, other) == ["10.0.0.3", "10.0.0.2"]


def test_not_serving_pods_are_left_out() -> None:
    def one(**options: Any) -> list[str]:
        return peers(ME, pod("p", owners=[RS_OLD], **{"ip": "10.0.0.9", **options}))

    assert one() == ["10.0.0.9"]
    assert one(deleting=True) == []  # terminating: stopping, may go away mid-snapshot
    assert one(ready=False) == []
    assert one(ip=None) == []  # not started yet
    assert one(phase="Pending") == []
    assert one(phase="Succeeded") == []
    # Not Ready (its controller's probe fails, a standby), but its warmwatch is: a peer.
    assert one(ready=False, sidecar_ready=True) == ["10.0.0.9"]
    assert one(ready=False, sidecar_ready=False) == []


def test_itself_is_never_its_own_peer() -> None:
    assert peers(pod("me", owners=[RS_NEW], ip="10.0.0.1")) == []
    # A stale copy of itself under another uid (recreated with the same name): still itself.
    twin = cast(PodPayload, {**ME, "metadata": {**ME["metadata"], "uid": "uid-other"}})
    assert peers(ME, twin) == []


def test_a_bare_pod_has_no_peers() -> None:
    bare = pod("bare", ip="10.0.0.1")
    assert peers(bare, pod("p", ip="10.0.0.2"), pod("q", owners=[RS_OLD], ip="10.0.0.3")) == []
    # An owner that is not the controller (a garbage-collection owner only) is no workload.
    loose = pod("loose", owners=[owner("ConfigMap", "c", api_version="v1", controller=False)])
    assert peers(loose, pod("p", owners=loose["metadata"]["ownerReferences"], ip="10.0.0.2")) == []


def test_a_replica_set_without_a_deployment_is_the_workload() -> None:
    bare = owner("ReplicaSet", "rs-bare")
    me = pod("me", owners=[bare])
    sibling = pod("sibling", owners=[bare], ip="10.0.0.2")
    of_deployment = pod("d", owners=[RS_OLD], ip="10.0.0.3")
    assert peers(me, sibling, of_deployment) == ["10.0.0.2"]
    # Its ReplicaSet not (or no longer) listed: the ReplicaSet's own pods still.
    assert peers(me, sibling, replica_sets=[]) == ["10.0.0.2"]
    assert peers(ME, pod("new", owners=[RS_NEW], ip="10.0.0.4"), replica_sets=[]) == ["10.0.0.4"]


def test_a_statefulset_and_other_controllers() -> None:
    sts = owner("StatefulSet", "s1")
    me = pod("ctl-1", owners=[sts])
    ctl0 = pod("ctl-0", owners=[sts], ip="10.0.0.2", created="2026-12-01T00:00:00Z")
    ctl2 = pod("ctl-2", owners=[sts], ip="10.0.0.3", created="2026-12-02T00:00:00Z")
    stranger = pod("x-0", owners=[owner("StatefulSet", "s2")], ip="10.0.0.4")
    assert peers(me, ctl0, ctl2, stranger, replica_sets=[]) == ["10.0.0.3", "10.0.0.2"]
    daemon = owner("DaemonSet", "ds")
    assert peers(pod("a", owners=[daemon]), pod("b", owners=[daemon], ip="10.1.0.2")) == [
        "10.1.0.2"
    ]
    # A custom resource named ReplicaSet is its own controller, not a Deployment's.
    custom = owner("ReplicaSet", "rs-new", api_version="example.com/v1")
    assert peers(pod("c", owners=[custom]), pod("d", owners=[RS_OLD], ip="10.0.0.5")) == []


def test_at_most_max_peers_and_ties_by_name() -> None:
    many = [pod(f"p{i}", owners=[RS_OLD], ip=f"10.0.1.{i}") for i in range(MAX_PEERS + 3)]
    chosen = peers(ME, *many)
    assert len(chosen) == MAX_PEERS
    assert chosen == [f"10.0.1.{i}" for i in reversed(range(3, MAX_PEERS + 3))]


def test_payloads_missing_fields_are_no_peers() -> None:
    empty = cast(PodPayload, {})
    assert peers(empty, pod("p", owners=[RS_OLD], ip="10.0.0.2")) == []
    no_status = cast(PodPayload, {"metadata": {"name": "n", "ownerReferences": [RS_OLD]}})
    assert peers(ME, no_status, cast(PodPayload, {})) == []


def test_the_choice_takes_microseconds() -> None:
    pods = [
        pod(f"p{i}", owners=[RS_OLD if i % 2 else owner("ReplicaSet", f"x{i}")], ip="10.0.0.2")
        for i in range(1000)
    ]
    started = time.perf_counter()
    for _ in range(10):
        peers(ME, *pods)
    assert (time.perf_counter() - started) / 10 < 0.05  # 1,000 pods: well under 50 ms


# -- the lookup, against a fake apiserver ------------------------------------------------


class Apiserver:
    """The pod, the ReplicaSets and the pods of namespace ``team``; every request seen."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.refuse: dict[str, int] = {}
        self.slow = False
        self.pods = [ME, pod("old", owners=[RS_OLD], ip="10.0.0.2")]

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append(request.path_qs)
        if self.slow:
            await asyncio.sleep(30)
        for part, code in self.refuse.items():
            if part in request.path:
                return web.json_response({"kind": "Status", "code": code}, status=code)
        if request.path == "/api/v1/namespaces/team/pods/me":
            return web.json_response(ME)
        if request.path == "/apis/apps/v1/namespaces/team/replicasets":
            return web.json_response({"items": REPLICA_SETS})
        if request.path == "/api/v1/namespaces/team/pods":
            return web.json_response({"items": self.pods})
        if request.path == "/api/v1/namespaces/kube-system":
            return web.json_response({"metadata": {"uid": "cluster"}})
        if request.path == "/apis/authentication.k8s.io/v1/selfsubjectreviews":
            user = {"username": "system:serviceaccount:team:ctl"}
            return web.json_response({"status": {"userInfo": user}}, status=201)
        return web.json_response({"kind": "Status", "code": 404}, status=404)


@pytest.fixture
async def apiserver(tmp_path: Path) -> AsyncIterator[tuple[Apiserver, Upstream]]:
    fake = Apiserver()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    served = Served(app)
    await served.start()
    kubeconfig = token_kubeconfig(tmp_path / "kc", server=served.url, token="sidecar")
    upstream = await connect(ConnectionSettings(kubeconfig=str(kubeconfig)), metrics=Metrics())
    yield fake, upstream
    await upstream.close()
    await served.stop()


async def test_the_lookup_asks_for_the_pod_the_replica_sets_and_the_running_pods(
    apiserver: tuple[Apiserver, Upstream],
) -> None:
    fake, upstream = apiserver
    assert await look_up(upstream, name="me", namespace="team", port=9191) == (("10.0.0.2", 9191),)
    assert fake.seen == [
        "/api/v1/namespaces/team/pods/me",
        "/apis/apps/v1/namespaces/team/replicasets",
        "/api/v1/namespaces/team/pods?fieldSelector=status.phase%3DRunning",
    ]


async def test_a_refused_lookup_raises_the_apiservers_status(
    apiserver: tuple[Apiserver, Upstream],
) -> None:
    fake, upstream = apiserver
    fake.refuse["replicasets"] = 403
    with pytest.raises(UpstreamStatusError) as refused:
        await look_up(upstream, name="me", namespace="team", port=PORT)
    assert refused.value.code == 403


async def seeding(upstream: Upstream, tmp_path: Path, **options: Any) -> tuple[str, float]:
    """``seed`` with the pod named and no peer; its result and how long it took."""
    settings = SeedSettings(pod_name="me", pod_namespace="team", **{"peer_port": PORT, **options})
    database = tmp_path / "new" / "cache.db"
    database.parent.mkdir(exist_ok=True)
    started = time.monotonic()
    result = await seed(settings, upstream=upstream, database=database, metrics=Metrics())
    return result, time.monotonic() - started


@pytest.mark.parametrize("failure", ["pods/me", "replicasets", "namespaces/team/pods"])
@pytest.mark.parametrize("code", [403, 404])
async def test_a_failed_lookup_is_a_cold_start(
    apiserver: tuple[Apiserver, Upstream],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    failure: str,
    code: int,
) -> None:
    fake, upstream = apiserver
    fake.refuse[failure] = code
    assert (await seeding(upstream, tmp_path))[0] == "none"
    (line,) = [r.getMessage() for r in caplog.records if r.name == "proxy.upstream.seeding"]
    assert "the peers of pod team/me cannot be looked up" in line and str(code) in line


async def test_a_lookup_that_does_not_answer_is_given_up_within_the_seed_timeout(
    apiserver: tuple[Apiserver, Upstream], tmp_path: Path
) -> None:
    fake, upstream = apiserver
    fake.slow = True
    result, took = await seeding(upstream, tmp_path, timeout=0.3)
    assert result == "none" and took < 3


async def test_no_serving_peer_is_a_cold_start_without_asking_anyone(
    apiserver: tuple[Apiserver, Upstream], tmp_path: Path
) -> None:
    fake, upstream = apiserver
    fake.pods = [ME]
    assert (await seeding(upstream, tmp_path))[0] == "none"
    assert not any("kube-system" in seen for seen in fake.seen)


async def test_a_found_peer_is_asked(
    apiserver: tuple[Apiserver, Upstream], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The found peer (127.0.0.2: nobody listens) is asked, and its failure is a failure."""
    fake, upstream = apiserver
    fake.pods = [ME, pod("old", owners=[RS_OLD], ip="127.0.0.2")]
    result, took = await seeding(upstream, tmp_path, peer_port=1)
    assert result == "failed" and took < 5
    assert "/api/v1/namespaces/kube-system" in fake.seen
    assert "seeding: peer 127.0.0.2:1 failed" in caplog.text
