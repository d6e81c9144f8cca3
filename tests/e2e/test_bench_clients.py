"""The benchmark's clients (loadtest/bench/clients.py) against the real apiserver and a warm
warmwatch: with ``--no-events`` they sync every object and print no line per object.

A line per object made the harness, not the client or warmwatch, the cost that grew faster
than N (issue 20 §1): the client wrote a line per object to its pipe and the harness parsed
each one. The benchmark times the client, so its client prints only its start and synced lines.

The benchmark also reads each informer's WatchList without decoding it (the server alone):
that reader must find the end of the initial state in the apiserver's stream and in
warmwatch's, which must be served from the cache and be as long as the apiserver's.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from loadtest import kubeapi
from loadtest.bench.clients import CLIENT_KINDS, ClientKind, drain_watch_list
from loadtest.cluster import ControlPlane
from loadtest.goclient import GoClient
from loadtest.sidecar import Sidecar
from tests.e2e.conftest import CreateMany

pytestmark = pytest.mark.e2e

OBJECTS = 300

PROTOBUF_KINDS = [kind for kind in CLIENT_KINDS if kind.protobuf and not kind.is_controller_manager]


@pytest.mark.parametrize("kind", PROTOBUF_KINDS, ids=lambda kind: kind.mode)
async def test_bench_client_syncs_without_event_lines(
    kind: ClientKind,
    namespace: str,
    create_many: CreateMany,
    plane: ControlPlane,
    start_sidecar: Callable[..., Sidecar],
    start_goclient: Callable[..., GoClient],
) -> None:
    await create_many(namespace=namespace, count=OBJECTS)
    resource = f"v1/configmaps@{namespace}"
    sidecar = start_sidecar(resources=[resource, f"{resource};protobuf"])

    for kubeconfig in (plane.admin_kubeconfig, sidecar.kubeconfig):
        quiet = start_goclient(
            kubeconfig=kubeconfig,
            resources=[resource],
            mode=kind.mode,
            protobuf=True,
            extra=("--no-items", "--no-events"),
        )
        synced = quiet.wait_synced(timeout=120)
        assert synced[0]["count"] == OBJECTS
        assert quiet.events() == []

        # The same client without the flag prints a line per object (the flag is what
        # silences it).
        loud = start_goclient(
            kubeconfig=kubeconfig,
            resources=[resource],
            mode=kind.mode,
            protobuf=True,
            extra=("--no-items",),
        )
        assert loud.wait_synced(timeout=120)[0]["count"] == OBJECTS
        assert len([e for e in loud.events() if e["initial"]]) == OBJECTS


@pytest.mark.parametrize("kind", PROTOBUF_KINDS, ids=lambda kind: kind.mode)
async def test_a_watch_list_is_read_without_decoding_to_its_initial_events_end(
    kind: ClientKind,
    namespace: str,
    create_many: CreateMany,
    plane: ControlPlane,
    start_sidecar: Callable[..., Sidecar],
) -> None:
    await create_many(namespace=namespace, count=OBJECTS)
    resource = f"v1/configmaps@{namespace}"
    sidecar = start_sidecar(resources=[resource, f"{resource};protobuf"])
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    direct = await drain_watch_list(
        base_url=plane.server,
        ssl_context=kubeapi.client_ssl(plane.pki, identity="admin"),
        accept=kind.watch_accept,
        server_pid=plane.state().pids["kube-apiserver"],
        path=path,
    )
    cached = await drain_watch_list(
        base_url=f"http://127.0.0.1:{sidecar.port}",
        ssl_context=None,
        accept=kind.watch_accept,
        server_pid=sidecar.process.pid,
        path=path,
    )
    # The same objects in the same encoding (bookmarks differ by a few bytes).
    assert abs(cached.received - direct.received) < 0.02 * direct.received, (direct, cached)
    assert sidecar.metric("warmwatch_passthrough_requests_total") == 0
