"""Passthrough against the in-process fake apiserver: methods and bodies, streaming, headers,
credential modes, WebSocket relay, discovery cache, unreachable apiserver."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy.kube.options import is_long_running
from proxy.metrics import Metrics
from proxy.serve.relaying import RelaySettings
from proxy.upstream.connecting import ConnectionSettings, Upstream, connect
from proxy.upstream.discovering import discovery_key
from proxy.upstream.errors import UpstreamUnavailable
from proxy.upstream.resilience import CircuitBreaker
from tests.unit.upstream.conftest import (
    FakeApiserver,
    MemoryDiscoveryCache,
    Proxy,
    Served,
    eventually,
    start_proxy,
)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


# ----------------------------------------------------------------------- classification


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/version", True),
        ("/api", True),
        ("/api/v1", True),
        ("/apis", True),
        ("/apis/apps", True),
        ("/apis/apps/v1", True),
        ("/openapi/v2", True),
        ("/openapi/v3", True),
        ("/openapi/v3/apis/apps/v1", True),
        ("/healthz", True),
        ("/api/v1/pods", False),
        ("/apis/apps/v1/deployments", False),
        ("/api/", False),
        ("/apis//v1", False),
        ("/healthz/etcd", False),
        ("/versions", False),
    ],
)
def test_discovery_paths(path: str, expected: bool) -> None:
    key = discovery_key(path=path, query="", accept="", user_agent="")
    assert (key is not None) is expected


@pytest.mark.parametrize(
    ("path_qs", "expected"),
    [
        ("/api/v1/pods?watch=true", True),
        ("/api/v1/pods?watch=1", True),
        ("/api/v1/pods?watch=", True),
        ("/api/v1/pods?watch=false", False),
        ("/api/v1/pods?watch=0", False),
        ("/api/v1/watch/namespaces/a/pods", True),
        ("/apis/apps/v1/watch/deployments", True),
        ("/api/v1/namespaces/a/pods/p/log?follow=true", True),
        ("/api/v1/namespaces/a/pods/p/exec", True),
        ("/api/v1/namespaces/a/pods/p/portforward", True),
        ("/api/v1/namespaces/a/pods", False),
        ("/apis/apps/v1/namespaces/a/deployments/d", False),
    ],
)
def test_long_running(path_qs: str, expected: bool) -> None:
    from aiohttp.test_utils import make_mocked_request

    request = make_mocked_request("GET", path_qs)
    assert is_long_running(request.path, request.query) is expected


# ----------------------------------------------------------------------- methods, bodies


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE"])
async def test_methods_and_bodies(
    method: str, sidecar_proxy: Proxy, fake: FakeApiserver, session: aiohttp.ClientSession
) -> None:
    body = b'{"metadata":{"name":"x"}}' if method != "GET" else b""
    async with session.request(
        method,
        f"{sidecar_proxy.url}/echo/api/v1/namespaces/a/configmaps?dryRun=All&fieldManager=m%20x",
        data=body or None,
        headers={"Content-Type": "application/merge-patch+json"} if body else {},
    ) as response:
        assert response.status == (201 if method == "POST" else 200)
        answer = orjson.loads(await response.read())
    assert answer["method"] == method
    # path and query byte for byte, encoding included
    assert answer["path_qs"] == "/echo/api/v1/namespaces/a/configmaps?dryRun=All&fieldManager=m%20x"
    assert answer["body"].encode("latin-1") == body
    if body:
        assert answer["headers"]["content-type"] == "application/merge-patch+json"
        assert answer["headers"]["content-length"] == str(len(body))


async def test_streamed_request_body(
    sidecar_proxy: Proxy, fake: FakeApiserver, session: aiohttp.ClientSession
) -> None:
    chunks = [bytes([i]) * 65536 for i in range(16)]  # 1 MiB, chunked, no Content-Length

    async def upload() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    async with session.post(f"{sidecar_proxy.url}/echo/upload", data=upload()) as response:
        assert response.status == 201
        await response.read()
    seen = fake.seen[-1]
    assert seen.body == b"".join(chunks)
    assert seen.headers.get("transfer-encoding") == "chunked"
    assert "content-length" not in seen.headers


async def test_binary_response_is_passed_as_is(
    sidecar_proxy: Proxy, session: aiohttp.ClientSession
) -> None:
    # The apiserver compressed its answer; it reaches the client compressed, with its headers.
    async with session.get(
        f"{sidecar_proxy.url}/gzip", headers={"Accept-Encoding": "gzip"}, auto_decompress=False
    ) as response:
        raw = await response.read()
        assert response.headers["Content-Encoding"] == "gzip"
    import gzip

    assert gzip.decompress(raw) == b"x" * 5000


# ----------------------------------------------------------------------------- streaming


async def test_a_client_that_stops_reading_is_cut_after_the_write_deadline(
    upstream: Upstream,
) -> None:
    """A passed-through answer to a client that stopped reading must not hold the upstream
    connection and a buffered chunk for as long as the client likes."""
    proxy = await start_proxy(
        upstream, credentials="sidecar", settings=RelaySettings(slow_write_timeout=0.5)
    )
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_connect(sock, ("127.0.0.1", proxy.served.port))
        await loop.sock_sendall(sock, b"GET /big HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert (await loop.sock_recv(sock, 12)).startswith(b"HTTP/1.1 200")
        # It reads no more: cut within the deadline (and a little), not after 32 MiB.
        for _ in range(50):
            if sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] != 1:  # ESTABLISHED
                break
            await asyncio.sleep(0.1)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] != 1
        assert upstream.metrics.value("warmwatch_client_errors_total", {"reason": "slow"}) == 1
    finally:
        sock.close()
        await proxy.served.stop()


async def test_first_chunk_arrives_before_the_upstream_ends(
    sidecar_proxy: Proxy, fake: FakeApiserver, session: aiohttp.ClientSession
) -> None:
    async with session.get(f"{sidecar_proxy.url}/slow") as response:
        assert response.status == 200
        first = await asyncio.wait_for(response.content.readline(), 5)
        assert first == b"first\n"
        assert not fake.gate.is_set()  # the upstream is still holding its second chunk
        fake.gate.set()
        assert await response.read() == b"second\n"


async def test_watch_passes_through_and_ends_when_the_client_leaves(
    sidecar_proxy: Proxy, fake: FakeApiserver, session: aiohttp.ClientSession
) -> None:
    response = await session.get(
        f"{sidecar_proxy.url}/api/v1/namespaces/default/configmaps?watch=1&stall=1"
    )
    assert response.status == 200
    line = await asyncio.wait_for(response.content.readline(), 5)
    assert orjson.loads(line)["type"] == "ADDED"
    response.close()  # the client hangs up while the upstream watch is quiet
    await asyncio.wait_for(fake.watch_ended.wait(), 5)


async def test_upstream_cut_mid_body_is_visible_to_the_client(
    sidecar_proxy: Proxy, session: aiohttp.ClientSession
) -> None:
    async with session.get(f"{sidecar_proxy.url}/cut") as response:
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()


# ------------------------------------------------------------------------------- headers


async def test_hop_by_hop_headers_are_not_forwarded(
    sidecar_proxy: Proxy, fake: FakeApiserver, session: aiohttp.ClientSession, apiserver: Served
) -> None:
    async with session.post(
        f"{sidecar_proxy.url}/echo/headers",
        data=b"abc",
        headers={
            "X-Custom": "1",
            "Accept": "application/json;as=Table;v=v1;g=meta.k8s.io",
            "Keep-Alive": "300",
            "Proxy-Authorization": "Basic c2VjcmV0",
            "Proxy-Connection": "keep-alive",
            "TE": "trailers",
            "Trailer": "X-Trail",
            "Connection": "keep-alive, X-Drop-Me",
            "X-Drop-Me": "y",
            "Audit-Id": "client-audit",
            "Impersonate-User": "jane",
        },
    ) as response:
        assert response.status == 201
        await response.read()
        # response side: hop-by-hop out, end-to-end in
        assert response.headers["Audit-Id"] == "audit-123"
        assert response.headers["Warning"] == '299 - "deprecated"'
        assert response.headers["X-End-To-End"] == "kept"
        assert response.headers["Content-Type"] == "application/json"
        assert "Keep-Alive" not in response.headers
        assert "Proxy-Authenticate" not in response.headers
        assert "X-Hop-Named" not in response.headers
    seen = fake.seen[-1].headers
    assert seen["x-custom"] == "1"
    assert seen["accept"] == "application/json;as=Table;v=v1;g=meta.k8s.io"
    assert seen["audit-id"] == "client-audit"
    assert seen["impersonate-user"] == "jane"
    assert seen["content-length"] == "3"
    assert seen["host"] == f"127.0.0.1:{apiserver.port}"
    for dropped in (
        "keep-alive",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "x-drop-me",
    ):
        assert dropped not in seen, dropped
    # aiohttp adds nothing of its own in passthrough
    assert "user-agent" in fake.seen[-1].header_names  # the client's own User-Agent
    assert seen["user-agent"].startswith("Python/")


# --------------------------------------------------------------------------- credentials


async def test_sidecar_credentials_replace_the_clients(
    sidecar_proxy: Proxy, fake: FakeApiserver, session: aiohttp.ClientSession
) -> None:
    async with session.get(
        f"{sidecar_proxy.url}/echo/x", headers={"Authorization": "Bearer client-token"}
    ) as response:
        assert response.status == 200
    assert fake.seen[-1].headers["authorization"] == "Bearer sidecar-token"
    async with session.get(f"{sidecar_proxy.url}/echo/x") as response:
        assert response.status == 200
    assert fake.seen[-1].headers["authorization"] == "Bearer sidecar-token"


async def test_client_credentials_are_forwarded_and_the_sidecars_are_not_added(
    client_proxy: Proxy, fake: FakeApiserver, session: aiohttp.ClientSession
) -> None:
    async with session.get(
        f"{client_proxy.url}/echo/x", headers={"Authorization": "Bearer client-token"}
    ) as response:
        assert response.status == 200
    assert fake.seen[-1].headers["authorization"] == "Bearer client-token"
    async with session.get(f"{client_proxy.url}/echo/x") as response:
        assert response.status == 200
    assert "authorization" not in fake.seen[-1].headers


async def test_client_credentials_do_not_lend_the_sidecars_client_certificate(
    tls_apiserver: Served,
    fake: FakeApiserver,
    pki: Any,
    tmp_path: Any,
    session: aiohttp.ClientSession,
) -> None:
    from loadtest.pki import write_kubeconfig

    kubeconfig = write_kubeconfig(
        path=tmp_path / "admin.kubeconfig", pki=pki, identity="admin", server=tls_apiserver.url
    )
    upstream = await connect(ConnectionSettings(kubeconfig=str(kubeconfig)), metrics=Metrics())
    sidecar = await start_proxy(upstream, credentials="sidecar")
    client = await start_proxy(upstream, credentials="client")
    try:
        async with session.get(f"{sidecar.url}/echo/a") as response:
            assert response.status == 200
        assert fake.seen[-1].peer_cn == "warmwatch-admin"
        assert "authorization" not in fake.seen[-1].headers

        async with session.get(
            f"{client.url}/echo/b", headers={"Authorization": "Bearer client-token"}
        ) as response:
            assert response.status == 200
        assert fake.seen[-1].peer_cn is None
        assert fake.seen[-1].headers["authorization"] == "Bearer client-token"

        # and the sidecar's session still presents its certificate afterwards
        async with session.get(f"{sidecar.url}/echo/c") as response:
            assert response.status == 200
        assert fake.seen[-1].peer_cn == "warmwatch-admin"
    finally:
        await sidecar.served.stop()
        await client.served.stop()
        await upstream.close()


# ---------------------------------------------------------------------------- websockets


async def test_websocket_relay_round_trip(
    sidecar_proxy: Proxy, fake: FakeApiserver, session: aiohttp.ClientSession, metrics: Metrics
) -> None:
    async with session.ws_connect(
        f"{sidecar_proxy.url}/api/v1/namespaces/default/pods/p/exec?command=sh&stdin=true",
        protocols=("v5.channel.k8s.io", "v4.channel.k8s.io"),
        headers={"Authorization": "Bearer client-token"},
    ) as ws:
        assert ws.protocol == "v5.channel.k8s.io"
        await ws.send_bytes(b"\x00hello")
        message = await asyncio.wait_for(ws.receive(), 5)
        assert message.type is aiohttp.WSMsgType.BINARY
        assert message.data == b"echo:\x00hello"
        await ws.send_str("text")
        message = await asyncio.wait_for(ws.receive(), 5)
        assert message.type is aiohttp.WSMsgType.TEXT
        assert message.data == "echo:text"
        await ws.send_str("bye")
        message = await asyncio.wait_for(ws.receive(), 5)
        assert message.type is aiohttp.WSMsgType.CLOSE
        assert message.data == 4001
        assert message.extra == "server says bye"
    seen = fake.seen[-1]
    assert seen.path_qs == "/api/v1/namespaces/default/pods/p/exec?command=sh&stdin=true"
    assert seen.headers["authorization"] == "Bearer sidecar-token"
    assert "v5.channel.k8s.io" in seen.headers["sec-websocket-protocol"]
    assert (
        metrics.value("warmwatch_passthrough_requests_total", {"verb": "GET", "code": "101"}) == 1
    )


async def test_websocket_client_close_reaches_the_apiserver(
    sidecar_proxy: Proxy, session: aiohttp.ClientSession
) -> None:
    async with session.ws_connect(
        f"{sidecar_proxy.url}/api/v1/namespaces/default/pods/p/exec",
        protocols=("v4.channel.k8s.io",),
    ) as ws:
        assert ws.protocol == "v4.channel.k8s.io"
        await ws.send_bytes(b"\x01x")
        assert (await asyncio.wait_for(ws.receive(), 5)).data == b"echo:\x01x"
        await asyncio.wait_for(ws.close(code=1000), 5)
        assert ws.closed


async def test_websocket_refused_upstream_is_answered_with_its_code(
    sidecar_proxy: Proxy, session: aiohttp.ClientSession
) -> None:
    async with session.get(
        f"{sidecar_proxy.url}/api/v1/namespaces/default/pods/forbidden/exec",
        headers={
            "Upgrade": "websocket",
            "Connection": "Upgrade",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Protocol": "v5.channel.k8s.io",
        },
    ) as response:
        assert response.status == 403
        status = orjson.loads(await response.read())
        assert status["kind"] == "Status"
        assert status["reason"] == "Forbidden"


async def test_spdy_upgrade_is_refused(
    sidecar_proxy: Proxy, session: aiohttp.ClientSession
) -> None:
    async with session.post(
        f"{sidecar_proxy.url}/api/v1/namespaces/default/pods/p/exec",
        headers={"Upgrade": "SPDY/3.1", "Connection": "Upgrade"},
    ) as response:
        assert response.status == 400
        assert orjson.loads(await response.read())["reason"] == "BadRequest"


async def test_invalid_websocket_handshake_is_refused(
    sidecar_proxy: Proxy, fake: FakeApiserver, session: aiohttp.ClientSession
) -> None:
    async with session.get(
        f"{sidecar_proxy.url}/api/v1/namespaces/default/pods/p/exec",
        headers={"Upgrade": "websocket", "Connection": "Upgrade"},  # no key, no version
    ) as response:
        assert response.status == 400
    assert fake.seen == []


async def test_other_upgrades_are_ignored(
    sidecar_proxy: Proxy, fake: FakeApiserver, session: aiohttp.ClientSession
) -> None:
    async with session.get(
        f"{sidecar_proxy.url}/echo/h2c",
        headers={"Upgrade": "h2c", "Connection": "Upgrade, HTTP2-Settings", "HTTP2-Settings": "x"},
    ) as response:
        assert response.status == 200
    seen = fake.seen[-1].headers
    assert "upgrade" not in seen
    assert "http2-settings" not in seen


# ----------------------------------------------------------------------------- discovery


async def test_discovery_is_cached_and_served_while_the_apiserver_is_down(
    apiserver: Served, sidecar_proxy: Proxy, fake: FakeApiserver, session: aiohttp.ClientSession
) -> None:
    accept = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
    async with session.get(
        f"{sidecar_proxy.url}/apis", headers={"Accept": accept, "Accept-Encoding": "gzip"}
    ) as response:
        assert response.status == 200
        online_body = await response.read()
        assert response.headers["ETag"] == '"etag-apis"'
    # stored uncompressed (no Accept-Encoding upstream), keyed by path, query and Accept
    assert "accept-encoding" not in fake.seen[-1].headers
    assert list(sidecar_proxy.discovery.documents) == [f"/apis?|{accept}"]
    stored = sidecar_proxy.discovery.documents[f"/apis?|{accept}"]
    assert stored.etag == '"etag-apis"'
    assert stored.body == online_body
    assert not any(
        name.lower() in ("date", "audit-id", "content-length") for name, _ in stored.headers
    )

    # the apiserver answers 304 itself while it is up
    async with session.get(
        f"{sidecar_proxy.url}/apis", headers={"Accept": accept, "If-None-Match": '"etag-apis"'}
    ) as response:
        assert response.status == 304

    await apiserver.stop()
    hits = fake.discovery_hits

    async with session.get(f"{sidecar_proxy.url}/apis", headers={"Accept": accept}) as response:
        assert response.status == 200
        assert await response.read() == online_body
        assert response.headers["Content-Type"] == "application/json"
        assert response.headers["ETag"] == '"etag-apis"'
        assert response.headers["Cache-Control"] == "public"

    async with session.get(
        f"{sidecar_proxy.url}/apis", headers={"Accept": accept, "If-None-Match": '"etag-apis"'}
    ) as response:
        assert response.status == 304
        assert response.headers["ETag"] == '"etag-apis"'
        assert await response.read() == b""

    # another Accept is another copy; none stored, but the stored one's media type
    # (this fake answers plain application/json) is one the client accepts: served
    async with session.get(
        f"{sidecar_proxy.url}/apis",
        headers={"Accept": "application/vnd.kubernetes.protobuf, application/json"},
    ) as response:
        assert response.status == 200
        assert await response.read() == online_body
    # an Accept no stored copy satisfies: 503
    for other in (
        "application/yaml",
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
    ):
        async with session.get(f"{sidecar_proxy.url}/apis", headers={"Accept": other}) as response:
            assert response.status == 503
    # never fetched at all
    async with session.get(f"{sidecar_proxy.url}/version") as response:
        assert response.status == 503
        status = orjson.loads(await response.read())
        assert status["reason"] == "ServiceUnavailable"
        assert status["code"] == 503
    assert fake.discovery_hits == hits


async def test_unreachable_apiserver_gives_503_status(
    apiserver: Served, sidecar_proxy: Proxy, session: aiohttp.ClientSession, metrics: Metrics
) -> None:
    await apiserver.stop()
    for method in ("GET", "POST"):
        async with session.request(
            method, f"{sidecar_proxy.url}/api/v1/namespaces/a/pods"
        ) as response:
            assert response.status == 503
            assert response.headers["Content-Type"].startswith("application/json")
            status = orjson.loads(await response.read())
        assert status["kind"] == "Status"
        assert status["reason"] == "ServiceUnavailable"
        assert response.headers["Retry-After"] == "1"  # client-go retries it within its timeout
        assert status["details"] == {"retryAfterSeconds": 1}
        assert (
            metrics.value("warmwatch_passthrough_requests_total", {"verb": method, "code": "error"})
            == 1
        )
    assert metrics.value("warmwatch_upstream_requests_total", {"verb": "GET", "code": "error"}) == 1


async def test_failing_discovery_cache_does_not_fail_requests(
    upstream: Upstream, session: aiohttp.ClientSession
) -> None:
    class Broken(MemoryDiscoveryCache):
        async def put(self, key: str, doc: Any) -> None:
            raise OSError("disk full")

    proxy = await start_proxy(upstream, credentials="sidecar", discovery=Broken())
    try:
        async with session.get(f"{proxy.url}/version") as response:
            assert response.status == 200
    finally:
        await proxy.served.stop()


async def test_metrics_count_passthrough(
    sidecar_proxy: Proxy, session: aiohttp.ClientSession, metrics: Metrics
) -> None:
    async with session.delete(f"{sidecar_proxy.url}/echo/x") as response:
        assert response.status == 200
    assert (
        metrics.value("warmwatch_passthrough_requests_total", {"verb": "DELETE", "code": "200"})
        == 1
    )
    assert (
        metrics.value("warmwatch_upstream_requests_total", {"verb": "DELETE", "code": "200"}) == 1
    )


async def test_an_open_breaker_fails_writes_at_once_and_serves_discovery_from_cache(
    upstream: Upstream, fake: FakeApiserver, session: aiohttp.ClientSession
) -> None:
    """While the reflectors found the apiserver unreachable, a Lease renewal or status update
    must not wait for a connect timeout: it is answered 503 + Retry-After without a try."""
    breaker = CircuitBreaker(target="apiserver")
    proxy = await start_proxy(upstream, credentials="sidecar", breaker=breaker)
    try:
        async with session.get(f"{proxy.url}/version") as response:
            assert response.status == 200  # closed: passed through, and cached
            version = await response.read()
        for _ in range(breaker.settings.failure_threshold):
            breaker.record_failure()
        seen = len(fake.seen)
        started = asyncio.get_running_loop().time()
        async with session.put(f"{proxy.url}/apis/coordination.k8s.io/v1/x", data=b"{}") as r:
            assert r.status == 503
            assert r.headers["Retry-After"] == "1"
            assert "circuit breaker open" in orjson.loads(await r.read())["message"]
        async with session.get(f"{proxy.url}/version") as response:
            assert response.status == 200
            assert await response.read() == version
        assert len(fake.seen) == seen  # nothing was sent upstream
        assert asyncio.get_running_loop().time() - started < 1
    finally:
        await proxy.served.stop()


async def test_the_offline_answer_replaces_the_503(
    apiserver: Served, upstream: Upstream, session: aiohttp.ClientSession
) -> None:
    async def offline(request: web.Request, error: UpstreamUnavailable) -> web.StreamResponse:
        return web.Response(text=f"offline: {request.path}")

    proxy = await start_proxy(upstream, credentials="sidecar", offline=offline)
    try:
        async with session.get(f"{proxy.url}/echo/x") as response:
            assert response.status == 200 and await response.text() != "offline: /echo/x"
        await apiserver.stop()
        async with session.get(f"{proxy.url}/echo/x") as response:
            assert response.status == 200
            assert await response.text() == "offline: /echo/x"
    finally:
        await proxy.served.stop()


async def test_passed_through_lists_are_measured_beside_the_cache_s(
    sidecar_proxy: Proxy, session: aiohttp.ClientSession, metrics: Metrics
) -> None:
    metrics.resources.discovered(source="/api/v1", resources=["v1/configmaps"])
    async with session.get(f"{sidecar_proxy.url}/api/v1/namespaces/default/configmaps") as answer:
        assert answer.status == 200
        size = len(await answer.read())
    labels = {"resource": "v1/configmaps", "source": "passthrough"}
    assert metrics.value("warmwatch_list_bytes_total", labels) == size
    assert metrics.value("warmwatch_list_duration_seconds_count", labels) == 1
    # a watch of the same collection is no LIST
    async with session.get(
        f"{sidecar_proxy.url}/api/v1/namespaces/default/configmaps?watch=1&timeoutSeconds=1"
    ) as answer:
        await answer.read()
    assert metrics.value("warmwatch_list_duration_seconds_count", labels) == 1
    # Resources nobody named (made up by a client): one series, "other", not one each.
    for i in range(3):
        async with session.get(f"{sidecar_proxy.url}/apis/x{i}.example/v1/r{i}q") as answer:
            await answer.read()
    other = {"resource": "other", "source": "passthrough"}
    assert metrics.value("warmwatch_list_duration_seconds_count", other) == 3


async def test_a_client_gone_before_the_answer_begins_is_counted_not_an_error(
    upstream: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    """The client leaves while the apiserver thinks: writing the answer's headers finds the
    transport closing. That is the client's doing (counted, logged at DEBUG), never an error
    of the handler (found by the fuzz test: an AssertionError per such request)."""
    proxy = await start_proxy(upstream, credentials="sidecar")
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    try:
        with caplog.at_level(logging.ERROR):
            await loop.sock_connect(sock, ("127.0.0.1", proxy.served.port))
            await loop.sock_sendall(
                sock, b"GET /sleep?seconds=0.3 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
            )
            sock.close()
            await eventually(
                lambda: (
                    upstream.metrics.value(
                        "warmwatch_client_errors_total", {"reason": "disconnected"}
                    )
                    == 1
                )
            )
            await asyncio.sleep(0.1)  # an error would be logged as the handler ends
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    finally:
        sock.close()
        await proxy.served.stop()
