"""The upstream layer against the real apiserver: credentials from a kubeconfig with client
certificates, JSON requests, refusals as UpstreamStatusError."""

from __future__ import annotations

import pytest

from loadtest.cluster import ControlPlane
from proxy.metrics import Metrics
from proxy.upstream.connecting import ConnectionSettings, connect
from proxy.upstream.errors import UpstreamStatusError

pytestmark = pytest.mark.e2e


async def test_client_certificate_kubeconfig_reaches_the_apiserver(plane: ControlPlane) -> None:
    metrics = Metrics()
    upstream = await connect(
        ConnectionSettings(kubeconfig=str(plane.admin_kubeconfig)), metrics=metrics
    )
    try:
        version = await upstream.json_request("GET", "/version", purpose="discovery")
        assert version["gitVersion"] == "v1.37.2"
        namespaces = await upstream.json_request(
            "GET", ("/api/v1/namespaces", {"limit": "1"}), purpose="reflector"
        )
        assert namespaces["kind"] == "NamespaceList"
        assert (
            metrics.value("warmwatch_upstream_requests_total", {"verb": "GET", "code": "200"}) == 2
        )
    finally:
        await upstream.close()


async def test_restricted_identity_is_refused_with_the_apiservers_status(
    plane: ControlPlane,
) -> None:
    upstream = await connect(
        ConnectionSettings(kubeconfig=str(plane.restricted_kubeconfig)), metrics=Metrics()
    )
    try:
        with pytest.raises(UpstreamStatusError) as refused:
            await upstream.json_request("GET", "/api/v1/configmaps", purpose="reflector")
        assert refused.value.code == 403
        assert refused.value.reason == "Forbidden"
    finally:
        await upstream.close()
