"""loadtest.toxiproxy against the real apiserver: TLS through the TCP proxy, and its toxics
(latency, blackhole, reset) do to requests what they say."""

from __future__ import annotations

import http.client
import json
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtest import kubeapi, toxiproxy
from loadtest.cluster import ControlPlane

from .conftest import Kubectl

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[toxiproxy.Toxiproxy]:
    started = toxiproxy.Toxiproxy.start(log=tmp_path_factory.mktemp("toxiproxy") / "toxiproxy.log")
    yield started
    started.stop()


@pytest.fixture
def proxy(server: toxiproxy.Toxiproxy, plane: ControlPlane) -> Iterator[toxiproxy.Proxy]:
    created = server.create_proxy("apiserver", upstream=f"127.0.0.1:{plane.state().apiserver_port}")
    yield created
    created.delete()


def get(
    proxy: toxiproxy.Proxy, plane: ControlPlane, path: str, *, timeout: float = 10
) -> tuple[int, bytes, float]:
    """One GET on a fresh connection through ``proxy`` (TLS verified against 127.0.0.1, a SAN of
    the serving certificate): status, body, seconds."""
    context = kubeapi.client_ssl(plane.pki, identity="admin")
    connection = http.client.HTTPSConnection(
        "127.0.0.1", proxy.port, context=context, timeout=timeout
    )
    started = time.monotonic()
    try:
        connection.request("GET", path, headers={"Accept": "application/json"})
        answer = connection.getresponse()
        return answer.status, answer.read(), time.monotonic() - started
    finally:
        connection.close()


def test_kubectl_lists_through_the_proxy_with_tls_server_name(
    proxy: toxiproxy.Proxy, plane: ControlPlane, kubectl: Kubectl, tmp_path: Path
) -> None:
    kubeconfig = toxiproxy.kubeconfig_through(
        proxy, pki=plane.pki, identity="admin", path=tmp_path / "through.kubeconfig"
    )
    assert f"127.0.0.1:{proxy.port}" in kubeconfig.read_text()
    assert "tls-server-name: kubernetes" in kubeconfig.read_text()
    listed = json.loads(kubectl("get", "namespaces", "-o", "json", kubeconfig=kubeconfig).stdout)
    assert "default" in {item["metadata"]["name"] for item in listed["items"]}
    # The name is what the client verifies (not the proxy's address, also a SAN).
    wrong = toxiproxy.kubeconfig_through(
        proxy,
        pki=plane.pki,
        identity="admin",
        path=tmp_path / "wrong.kubeconfig",
        tls_server_name="wrong.example",
    )
    refused = kubectl("get", "namespaces", kubeconfig=wrong, check=False)
    assert refused.returncode != 0 and "not wrong.example" in refused.stderr


def test_latency_blackhole_and_recovery(proxy: toxiproxy.Proxy, plane: ControlPlane) -> None:
    status, body, _ = get(proxy, plane, "/api/v1/namespaces?limit=1")
    assert status == 200 and json.loads(body)["kind"] == "NamespaceList"

    latency = proxy.add_latency(400, jitter_ms=50)
    assert latency.attributes == {"latency": 400, "jitter": 50}
    assert [t.name for t in proxy.toxics()] == [latency.name]
    status, _, seconds = get(proxy, plane, "/api/v1/namespaces?limit=1")
    assert status == 200
    assert seconds >= 0.35, f"a request through a 400±50 ms latency toxic took {seconds:.3f} s"
    proxy.remove_toxic(latency.name)

    blackhole = proxy.add_timeout()  # 0: data dropped, connections kept open
    with pytest.raises(TimeoutError):
        get(proxy, plane, "/api/v1/namespaces?limit=1", timeout=1.5)
    proxy.remove_toxic(blackhole.name)
    assert proxy.toxics() == []
    status, _, seconds = get(proxy, plane, "/api/v1/namespaces?limit=1")
    assert status == 200 and seconds < 5


def test_reset_peer_resets_the_connection(proxy: toxiproxy.Proxy, plane: ControlPlane) -> None:
    reset = proxy.add_reset_peer(stream="upstream")
    with pytest.raises((ConnectionResetError, ssl.SSLError)):
        get(proxy, plane, "/api/v1/namespaces?limit=1", timeout=5)
    proxy.remove_toxic(reset.name)
    assert get(proxy, plane, "/api/v1/namespaces?limit=1")[0] == 200


def test_link_describes_and_applies_a_symmetric_link(
    proxy: toxiproxy.Proxy, plane: ControlPlane
) -> None:
    link = toxiproxy.Link(latency_ms=100, rate_kb=5000)
    assert link.describe().startswith("200 ms RTT")
    link.apply(proxy)
    assert sorted((t.type, t.stream) for t in proxy.toxics()) == [
        ("bandwidth", "downstream"),
        ("bandwidth", "upstream"),
        ("latency", "downstream"),
        ("latency", "upstream"),
    ]
    status, _, seconds = get(proxy, plane, "/api/v1/namespaces?limit=1")
    # TCP connect is local to toxiproxy; the TLS handshake and the request need >= 2 RTTs.
    assert status == 200 and seconds >= 0.4
