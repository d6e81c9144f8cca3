"""connect() and Upstream against the fake apiserver: credential sources and their refresh,
TLS, requests, error mapping, timeouts, metrics."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import textwrap
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from kubernetes_asyncio.config import incluster_config

from proxy.metrics import Metrics
from proxy.upstream.connecting import (
    ConnectionBudget,
    ConnectionSettings,
    Upstream,
    connect,
    proxy_for,
)
from proxy.upstream.errors import (
    UpstreamAuthError,
    UpstreamBusy,
    UpstreamProtocolError,
    UpstreamSilent,
    UpstreamStatusError,
    UpstreamUnavailable,
)
from tests.unit.upstream.conftest import (
    FakeApiserver,
    Served,
    exec_kubeconfig,
    start_proxy,
    token_kubeconfig,
)

# ----------------------------------------------------------------------- token kubeconfig


async def test_token_kubeconfig_reaches_the_apiserver(
    upstream: Upstream, fake: FakeApiserver, apiserver: Served, metrics: Metrics
) -> None:
    assert upstream.base_url == apiserver.url
    answer = await upstream.json_request(
        "GET",
        "/echo/api/v1/pods",
        params={"labelSelector": "app in (a,b)", "limit": "500"},
        purpose="passthrough",
    )
    assert answer["method"] == "GET"
    assert answer["path_qs"] == "/echo/api/v1/pods?labelSelector=app%20in%20%28a%2Cb%29&limit=500"
    assert fake.seen[-1].headers["authorization"] == "Bearer sidecar-token"
    assert fake.seen[-1].headers["accept"] == "application/json"
    assert metrics.value("warmwatch_upstream_requests_total", {"verb": "GET", "code": "200"}) == 1


async def test_targets_and_bodies(upstream: Upstream, fake: FakeApiserver) -> None:
    # (path, params) target, params appended to an existing query, JSON body
    answer = await upstream.json_request(
        "POST",
        ("/echo/x", [("a", "1")]),
        params={"b": "2"},
        json={"metadata": {"name": "n"}},
        verb="TOKENREVIEW",
        purpose="passthrough",
    )
    assert answer["path_qs"] == "/echo/x?a=1&b=2"
    assert orjson.loads(answer["body"]) == {"metadata": {"name": "n"}}
    assert fake.seen[-1].headers["content-type"] == "application/json"
    assert (
        upstream.metrics.value(
            "warmwatch_upstream_requests_total", {"verb": "TOKENREVIEW", "code": "201"}
        )
        == 1
    )

    async def body() -> Any:
        yield b"part1-"
        yield b"part2"

    async with upstream.request(
        "PUT", "/echo/y?z=%2F", data=body(), purpose="passthrough"
    ) as response:
        assert response.status == 200
        answer = orjson.loads(await response.read())
    assert answer["body"] == "part1-part2"
    assert answer["path_qs"] == "/echo/y?z=%2F"  # an encoded target is sent as it is


async def test_status_errors(upstream: Upstream) -> None:
    with pytest.raises(UpstreamStatusError) as caught:
        await upstream.json_request("GET", "/status/404", purpose="passthrough")
    assert caught.value.code == 404
    assert caught.value.reason == "NotFound"
    assert caught.value.message == "failure 404"
    assert caught.value.status["kind"] == "Status"
    assert caught.value.retry_after is None
    assert caught.value.to_status_error().to_payload()["code"] == 404

    with pytest.raises(UpstreamStatusError) as caught:
        await upstream.json_request(
            "GET", "/status/429", params={"retry_after": "3"}, purpose="passthrough"
        )
    assert caught.value.code == 429
    assert caught.value.retry_after == 3.0

    with pytest.raises(UpstreamStatusError) as caught:
        await upstream.json_request(
            "GET", "/status/504", params={"details_retry": "2"}, purpose="passthrough"
        )
    assert caught.value.retry_after == 2.0

    with pytest.raises(UpstreamStatusError) as caught:
        await upstream.json_request("GET", "/html503", purpose="passthrough")
    assert caught.value.code == 503
    assert caught.value.reason == "ServiceUnavailable"
    assert "<html>down</html>" in caught.value.message

    with pytest.raises(UpstreamProtocolError):
        await upstream.json_request("GET", "/notjson", purpose="passthrough")


async def test_unreachable(apiserver: Served, upstream: Upstream, metrics: Metrics) -> None:
    await apiserver.stop()
    with pytest.raises(UpstreamUnavailable, match="unavailable"):
        await upstream.json_request("GET", "/version", purpose="passthrough")
    with pytest.raises(UpstreamUnavailable):
        async with upstream.request(
            "GET",
            "/api/v1/namespaces/default/configmaps?watch=1",
            stream=True,
            verb="WATCH",
            purpose="passthrough",
        ):
            pass
    assert metrics.value("warmwatch_upstream_requests_total", {"verb": "GET", "code": "error"}) == 1
    assert (
        metrics.value("warmwatch_upstream_requests_total", {"verb": "WATCH", "code": "error"}) == 1
    )


async def test_total_timeout_for_ordinary_requests(upstream: Upstream) -> None:
    with pytest.raises(UpstreamUnavailable, match=r"timed out|Timeout"):
        await upstream.json_request(
            "GET", "/sleep", params={"seconds": "5"}, timeout=0.2, purpose="passthrough"
        )


async def test_closed_upstream_refuses_requests(upstream: Upstream) -> None:
    await upstream.close()
    await upstream.close()  # idempotent
    with pytest.raises(UpstreamUnavailable):
        await upstream.json_request("GET", "/version", purpose="passthrough")


# --------------------------------------------------------------------------------- streams


async def test_a_stream_yields_chunks(upstream: Upstream, fake: FakeApiserver) -> None:
    async with upstream.request(
        "GET",
        ("/api/v1/namespaces/default/configmaps", {"watch": "1", "resourceVersion": "7"}),
        headers={"Accept": "application/json"},
        stream=True,
        verb="WATCH",
        purpose="passthrough",
    ) as response:
        data = b"".join([chunk async for chunk in response.content.iter_any()])
    events = [orjson.loads(line) for line in data.splitlines()]
    assert [e["type"] for e in events] == ["ADDED", "BOOKMARK"]
    assert fake.seen[-1].headers["accept"] == "application/json"
    assert (
        upstream.metrics.value(
            "warmwatch_upstream_requests_total", {"verb": "WATCH", "code": "200"}
        )
        == 1
    )


async def test_a_silent_stream_times_out(upstream: Upstream) -> None:
    """A stream's ``timeout`` is its read-idle limit (the reflector's dead-connection
    detector); leaving the block it is UpstreamSilent, an UpstreamUnavailable."""
    first: list[bytes] = []

    async def read_until_silence() -> None:
        async with upstream.request(
            "GET",
            ("/api/v1/namespaces/default/configmaps", {"watch": "1", "stall": "1"}),
            stream=True,
            timeout=0.3,
            purpose="passthrough",
        ) as response:
            first.append(await response.content.readany())
            await response.content.readany()  # silence: the idle limit fires

    with pytest.raises(UpstreamSilent):
        await read_until_silence()
    assert b"ADDED" in first[0]


# ------------------------------------------------------------------------ credential sources


async def test_context_is_selected(apiserver: Served, tmp_path: Path, fake: FakeApiserver) -> None:
    path = tmp_path / "kc"
    path.write_text(
        textwrap.dedent(
            f"""\
            apiVersion: v1
            kind: Config
            clusters:
            - name: fake
              cluster: {{server: "{apiserver.url}"}}
            - name: elsewhere
              cluster: {{server: "http://127.0.0.1:9"}}
            users:
            - name: one
              user: {{token: one-token}}
            - name: two
              user: {{token: two-token}}
            contexts:
            - name: first
              context: {{cluster: elsewhere, user: one}}
            - name: second
              context: {{cluster: fake, user: two}}
            current-context: first
            """
        )
    )
    upstream = await connect(
        ConnectionSettings(kubeconfig=str(path), context="second"), metrics=Metrics()
    )
    try:
        await upstream.json_request("GET", "/echo/x", purpose="passthrough")
        assert fake.seen[-1].headers["authorization"] == "Bearer two-token"
    finally:
        await upstream.close()


async def test_kubeconfig_from_environment(
    apiserver: Served, tmp_path: Path, fake: FakeApiserver, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = token_kubeconfig(tmp_path / "env-kc", server=apiserver.url, token="env-token")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}:{path}")
    upstream = await connect(ConnectionSettings(), metrics=Metrics())
    try:
        await upstream.json_request("GET", "/echo/x", purpose="passthrough")
        assert fake.seen[-1].headers["authorization"] == "Bearer env-token"
    finally:
        await upstream.close()


async def test_no_credentials_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(UpstreamAuthError):
        await connect(ConnectionSettings(), metrics=Metrics())
    with pytest.raises(UpstreamAuthError):
        await connect(ConnectionSettings(kubeconfig=str(tmp_path / "nope")), metrics=Metrics())
    broken = tmp_path / "broken"
    broken.write_text("apiVersion: v1\nkind: Config\ncontexts: []\ncurrent-context: x\n")
    with pytest.raises(UpstreamAuthError):
        await connect(ConnectionSettings(kubeconfig=str(broken)), metrics=Metrics())


async def test_token_file_is_reread(apiserver: Served, tmp_path: Path, fake: FakeApiserver) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("first\n")
    path = tmp_path / "kc"
    path.write_text(
        textwrap.dedent(
            f"""\
            apiVersion: v1
            kind: Config
            clusters:
            - name: fake
              cluster: {{server: "{apiserver.url}"}}
            users:
            - name: u
              user: {{tokenFile: "{token_file}"}}
            contexts:
            - name: c
              context: {{cluster: fake, user: u}}
            current-context: c
            """
        )
    )
    upstream = await connect(
        ConnectionSettings(kubeconfig=str(path), token_file_reread=0.0), metrics=Metrics()
    )
    try:
        await upstream.json_request("GET", "/echo/1", purpose="passthrough")
        assert fake.seen[-1].headers["authorization"] == "Bearer first"
        token_file.write_text("second")
        await upstream.json_request("GET", "/echo/2", purpose="passthrough")
        assert fake.seen[-1].headers["authorization"] == "Bearer second"
    finally:
        await upstream.close()


async def test_exec_plugin_token_is_refreshed_when_it_expires(
    apiserver: Served, tmp_path: Path, fake: FakeApiserver
) -> None:
    counter = tmp_path / "count"
    # kubernetes_asyncio treats an exec token as expired 5 minutes before its expiry:
    # expiring in 5 min + 1 s means "valid for one more second".
    path = exec_kubeconfig(tmp_path / "kc", server=apiserver.url, counter=counter, expires_in="301")
    upstream = await connect(ConnectionSettings(kubeconfig=str(path)), metrics=Metrics())
    try:
        assert counter.read_text() == "1"  # run once by the loader
        await upstream.json_request("GET", "/echo/1", purpose="passthrough")
        await upstream.json_request("GET", "/echo/2", purpose="passthrough")
        assert [s.headers["authorization"] for s in fake.seen] == ["Bearer exec-token-1"] * 2
        assert counter.read_text() == "1"  # still valid: the plugin was not run again
        await asyncio.sleep(1.1)
        await upstream.json_request("GET", "/echo/3", purpose="passthrough")
        assert fake.seen[-1].headers["authorization"] == "Bearer exec-token-2"
    finally:
        await upstream.close()


async def test_exec_plugin_is_rerun_after_401(
    apiserver: Served, tmp_path: Path, fake: FakeApiserver
) -> None:
    counter = tmp_path / "count"
    path = exec_kubeconfig(
        tmp_path / "kc", server=apiserver.url, counter=counter, expires_in="none"
    )
    upstream = await connect(ConnectionSettings(kubeconfig=str(path)), metrics=Metrics())
    try:
        await upstream.json_request("GET", "/echo/1", purpose="passthrough")
        assert fake.seen[-1].headers["authorization"] == "Bearer exec-token-1"
        assert counter.read_text() == "1"  # no expiry: kept, not re-run per request
        fake.rejected_tokens.add("exec-token-1")
        with pytest.raises(UpstreamStatusError) as caught:
            await upstream.json_request("GET", "/echo/2", purpose="passthrough")
        assert caught.value.code == 401
        await upstream.json_request("GET", "/echo/3", purpose="passthrough")
        assert fake.seen[-1].headers["authorization"] == "Bearer exec-token-2"
        assert counter.read_text() == "2"
    finally:
        await upstream.close()


async def test_failing_exec_plugin(apiserver: Served, tmp_path: Path) -> None:
    path = tmp_path / "kc"
    path.write_text(
        textwrap.dedent(
            f"""\
            apiVersion: v1
            kind: Config
            clusters:
            - name: fake
              cluster: {{server: "{apiserver.url}"}}
            users:
            - name: u
              user:
                exec:
                  apiVersion: client.authentication.k8s.io/v1beta1
                  command: /bin/false
            contexts:
            - name: c
              context: {{cluster: fake, user: u}}
            current-context: c
            """
        )
    )
    with pytest.raises(UpstreamAuthError, match="exec"):
        await connect(ConnectionSettings(kubeconfig=str(path)), metrics=Metrics())


async def test_in_cluster_with_rotating_token(
    tls_apiserver: Served,
    fake: FakeApiserver,
    pki: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    token = tmp_path / "token"
    token.write_text("sa-token-1")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(tls_apiserver.port))
    # kubernetes_asyncio re-reads the token once a minute; make that "at once".
    monkeypatch.setattr(incluster_config, "TOKEN_REFRESH_PERIOD", datetime.timedelta(0))
    upstream = await connect(
        ConnectionSettings(incluster_token_path=str(token), incluster_ca_path=str(pki.ca_cert)),
        metrics=Metrics(),
    )
    try:
        assert upstream.base_url == f"https://127.0.0.1:{tls_apiserver.port}"
        await upstream.json_request("GET", "/echo/1", purpose="passthrough")
        assert fake.seen[-1].headers["authorization"] == "Bearer sa-token-1"
        assert fake.seen[-1].peer_cn is None  # a service account has no client certificate
        token.write_text("sa-token-2")
        await upstream.json_request("GET", "/echo/2", purpose="passthrough")
        assert fake.seen[-1].headers["authorization"] == "Bearer sa-token-2"
    finally:
        await upstream.close()


async def test_in_cluster_without_token_falls_back_to_kubeconfig(
    apiserver: Served, tmp_path: Path, fake: FakeApiserver, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = token_kubeconfig(tmp_path / "kc", server=apiserver.url, token="fallback")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "1")
    monkeypatch.setenv("KUBECONFIG", str(path))
    upstream = await connect(
        ConnectionSettings(incluster_token_path=str(tmp_path / "none")), metrics=Metrics()
    )
    try:
        await upstream.json_request("GET", "/echo/x", purpose="passthrough")
        assert fake.seen[-1].headers["authorization"] == "Bearer fallback"
    finally:
        await upstream.close()


async def test_tls_verification_failure_is_unavailable(
    tls_apiserver: Served, tmp_path: Path, fake: FakeApiserver
) -> None:
    # No CA given: the test CA is unknown to the system store.
    path = token_kubeconfig(tmp_path / "kc", server=tls_apiserver.url, token="t")
    upstream = await connect(ConnectionSettings(kubeconfig=str(path)), metrics=Metrics())
    try:
        with pytest.raises(UpstreamUnavailable, match="certificate"):
            await upstream.json_request("GET", "/echo/x", purpose="passthrough")
        assert fake.seen == []
    finally:
        await upstream.close()


async def test_client_certificate_kubeconfig(
    tls_apiserver: Served, fake: FakeApiserver, pki: Any, tmp_path: Path
) -> None:
    from loadtest.pki import write_kubeconfig

    path = write_kubeconfig(
        path=tmp_path / "admin.kubeconfig", pki=pki, identity="admin", server=tls_apiserver.url
    )
    upstream = await connect(ConnectionSettings(kubeconfig=str(path)), metrics=Metrics())
    try:
        await upstream.json_request("GET", "/echo/x", purpose="passthrough")
        assert fake.seen[-1].peer_cn == "warmwatch-admin"
        assert "authorization" not in fake.seen[-1].headers
    finally:
        await upstream.close()


async def test_process_default_configuration_is_untouched(
    upstream: Upstream, tmp_path: Path
) -> None:
    # The loaders always fill warmwatch's own Configuration object; a controller library
    # in the same process keeps its own defaults.
    from kubernetes_asyncio.client import Configuration

    before = Configuration._default
    path = token_kubeconfig(tmp_path / "kc2", server=upstream.base_url, token="t")
    other = await connect(ConnectionSettings(kubeconfig=str(path)), metrics=Metrics())
    await other.close()
    assert Configuration._default is before


# ------------------------------------------------------------------------------ proxies


def test_proxy_from_kubeconfig_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://env-proxy:3128")
    assert proxy_for("https://api.example:6443", configured="http://kc:1") == "http://kc:1"


def test_proxy_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert proxy_for("https://api.example:6443", configured=None) is None
    monkeypatch.setenv("HTTPS_PROXY", "http://env-proxy:3128")
    assert proxy_for("https://api.example:6443", configured=None) == "http://env-proxy:3128"
    assert proxy_for("http://api.example:8080", configured=None) is None  # no HTTP_PROXY
    assert proxy_for("https://127.0.0.1:6443", configured=None) is None  # loopback: never
    monkeypatch.setenv("NO_PROXY", ".example")
    assert proxy_for("https://api.example:6443", configured=None) is None


async def test_failing_sidecar_credentials_give_500_status(
    apiserver: Served, tmp_path: Path, fake: FakeApiserver
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("t")
    path = tmp_path / "kc"
    path.write_text(
        textwrap.dedent(
            f"""\
            apiVersion: v1
            kind: Config
            clusters:
            - name: fake
              cluster: {{server: "{apiserver.url}"}}
            users:
            - name: u
              user: {{tokenFile: "{token_file}"}}
            contexts:
            - name: c
              context: {{cluster: fake, user: u}}
            current-context: c
            """
        )
    )
    upstream = await connect(
        ConnectionSettings(kubeconfig=str(path), token_file_reread=0.0), metrics=Metrics()
    )
    proxy = await start_proxy(upstream, credentials="sidecar")
    try:
        token_file.unlink()
        with pytest.raises(UpstreamAuthError):
            await upstream.json_request("GET", "/echo/x", purpose="passthrough")
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{proxy.url}/echo/x") as response,
        ):
            assert response.status == 500
            status = orjson.loads(await response.read())
            assert status["reason"] == "InternalError"
        # a client's own credentials do not need the sidecar's
        client = await start_proxy(upstream, credentials="client")
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"{client.url}/echo/y") as response,
            ):
                assert response.status == 200
        finally:
            await client.served.stop()
        assert [s.path_qs for s in fake.seen] == ["/echo/y"]
    finally:
        await proxy.served.stop()
        await upstream.close()


def test_upstream_sockets_have_tcp_keepalive() -> None:
    """A quiet upstream connection to a peer that vanished without a reset is noticed."""
    import socket

    from proxy.upstream.connecting import _keepalive_socket

    info = socket.getaddrinfo("127.0.0.1", 443, type=socket.SOCK_STREAM)[0]
    sock = _keepalive_socket(info, idle=30)
    try:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
    finally:
        sock.close()


# ------------------------------------------------------------------------ connection budget


async def _budgeted(apiserver: Served, tmp_path: Path, budget: ConnectionBudget) -> Upstream:
    kubeconfig = token_kubeconfig(tmp_path / "kubeconfig", server=apiserver.url, token="t")
    return await connect(
        ConnectionSettings(kubeconfig=str(kubeconfig), request_timeout=5.0, budget=budget),
        metrics=Metrics(),
    )


async def test_watches_of_one_purpose_leave_the_others_their_connections(
    apiserver: Served, tmp_path: Path
) -> None:
    """A purpose whose connections are all held by open watches refuses the next request at
    once (before anything is sent), and every other purpose still reaches the apiserver: in
    one shared pool of 100 connections, 100 watches had left nothing for anyone else."""
    budget = ConnectionBudget(reflector=3, passthrough=2, review=1, discovery=1, wait=0.2)
    upstream = await _budgeted(apiserver, tmp_path, budget)
    watch = ("/api/v1/namespaces/default/configmaps", {"watch": "1", "stall": "1"})
    try:
        async with contextlib.AsyncExitStack() as held:
            for _ in range(2):
                await held.enter_async_context(
                    upstream.request("GET", watch, stream=True, purpose="passthrough")
                )
            started = time.monotonic()
            with pytest.raises(UpstreamBusy, match="2 upstream connections for passthrough"):
                await upstream.json_request("GET", "/echo/x", purpose="passthrough")
            assert time.monotonic() - started < 0.1  # at once: passthrough never waits
            for purpose in ("reflector", "review", "discovery"):
                answer = await upstream.json_request("GET", "/echo/x", purpose=purpose)
                assert answer["method"] == "GET"
            assert (
                upstream.metrics.value("warmwatch_upstream_connections", {"purpose": "passthrough"})
                == 2
            )
            assert (
                upstream.metrics.value("warmwatch_upstream_busy_total", {"purpose": "passthrough"})
                == 1
            )
        # Released with the watches.
        await upstream.json_request("GET", "/echo/x", purpose="passthrough")
        assert (
            upstream.metrics.value("warmwatch_upstream_connections", {"purpose": "passthrough"})
            == 0
        )
    finally:
        await upstream.close()


async def test_a_short_purpose_waits_briefly_for_a_slot(apiserver: Served, tmp_path: Path) -> None:
    """Reviews and discovery wait up to the budget's ``wait`` for a slot (a burst queues),
    then fail with UpstreamBusy: never queued without end."""
    budget = ConnectionBudget(reflector=1, passthrough=1, review=1, discovery=1, wait=0.3)
    upstream = await _budgeted(apiserver, tmp_path, budget)
    try:
        async with upstream.request(
            "GET", ("/sleep", {"seconds": "0.1"}), purpose="review"
        ) as first:
            queued = asyncio.create_task(
                upstream.json_request("GET", "/echo/queued", purpose="review")
            )
            await asyncio.sleep(0.05)
            assert not queued.done()
            await first.read()
        assert (await queued)["method"] == "GET"  # got the slot once the first let it go

        async with upstream.request("GET", ("/sleep", {"seconds": "2"}), purpose="review"):
            started = time.monotonic()
            with pytest.raises(UpstreamBusy):
                await upstream.json_request("GET", "/echo/late", purpose="review")
            assert 0.25 < time.monotonic() - started < 1.0
    finally:
        await upstream.close()


def test_the_budget_is_sized_from_the_limits() -> None:
    budget = ConnectionBudget.sized(shapes=510, watches=1024, requests=256)
    assert budget.reflector == 510 + 16  # one per collection, and fills' progress counts
    assert budget.passthrough == 1024 + 256
    assert budget.total == budget.reflector + budget.passthrough + 16 + 8
    with pytest.raises(ValueError, match="review connection budget"):
        ConnectionBudget(review=0)
