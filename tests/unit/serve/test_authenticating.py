"""Local authentication and the Host check, on an in-process aiohttp app."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from aiohttp import WSServerHandshakeError, web
from aiohttp.test_utils import TestClient, TestServer

from proxy.serve import authenticating
from proxy.serve.routing import statuses
from proxy.upstream.errors import UpstreamUnavailable
from proxy.upstream.reviewing import IdentityMismatch


async def _client(auth: authenticating.ClientAuth) -> TestClient[web.Request, web.Application]:
    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(middlewares=[statuses, authenticating.middleware(auth)])
    app.router.add_get("/api/v1/configmaps", ok)
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


async def test_token_file_requires_the_current_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    client = await _client(authenticating.ClientAuth.parse(f"token-file:{token}"))
    try:
        refused = await client.get("/api/v1/configmaps")
        assert refused.status == 401
        body = await refused.json()
        assert (body["kind"], body["reason"], body["code"]) == ("Status", "Unauthorized", 401)
        wrong = await client.get("/api/v1/configmaps", headers={"Authorization": "Bearer nope"})
        assert wrong.status == 401
        good = await client.get("/api/v1/configmaps", headers={"Authorization": "Bearer first"})
        assert good.status == 200

        token.write_text("second\n")  # rotation: the file is re-read when it changes
        os.utime(token, ns=(1, 10**18))
        old = await client.get("/api/v1/configmaps", headers={"Authorization": "Bearer first"})
        assert old.status == 401
        new = await client.get("/api/v1/configmaps", headers={"Authorization": "Bearer second"})
        assert new.status == 200
    finally:
        await client.close()


async def test_host_must_be_loopback() -> None:
    client = await _client(authenticating.ClientAuth.parse("none"))
    try:
        assert (await client.get("/api/v1/configmaps")).status == 200
        rebound = await client.get("/api/v1/configmaps", headers={"Host": "evil.example:8001"})
        assert rebound.status == 403
        assert (await rebound.json())["reason"] == "Forbidden"
        for host in ("localhost:8001", "127.0.0.1", "[::1]:8001", "127.0.0.5:1"):
            answer = await client.get("/api/v1/configmaps", headers={"Host": host})
            assert answer.status == 200, host
    finally:
        await client.close()


@pytest.mark.parametrize("text", ["token-file:", "tokenfile:/x", "open", "delegate"])
def test_bad_client_auth_values_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="client-auth"):
        authenticating.ClientAuth.parse(text)


def test_delegated_is_a_mode() -> None:
    assert authenticating.ClientAuth.parse("delegated").mode == "delegated"


@pytest.mark.parametrize(
    ("origin", "loopback"),
    [
        ("http://127.0.0.1:8001", True),
        ("https://localhost", True),
        ("http://[::1]:3000", True),
        ("http://127.9.9.9", True),
        ("http://evil.example", False),
        ("https://127.0.0.1.evil.example", False),
        ("http://localhost.evil.example:8001", False),
        ("null", False),
        ("file://", False),
        ("", False),
        ("http://[::ffff:10.0.0.1]", False),
    ],
)
def test_loopback_origins(origin: str, loopback: bool) -> None:
    assert authenticating.is_loopback_origin(origin) is loopback


async def _guarded(
    auth: authenticating.ClientAuth, *, guard: authenticating.Guard | None = None
) -> TestClient[web.Request, web.Application]:
    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def websocket(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.close()
        return ws

    app = web.Application(middlewares=[statuses, authenticating.middleware(auth, guard=guard)])
    app.router.add_get("/api/v1/watch/namespaces/kube-system/secrets/s", websocket)
    app.router.add_route("*", "/{tail:.*}", ok)
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


async def test_none_mode_refuses_cross_origin_requests_and_websockets() -> None:
    client = await _guarded(authenticating.ClientAuth.parse("none"))
    try:
        assert (await client.get("/api/v1/configmaps")).status == 200  # no Origin: not a page
        same = await client.get("/api/v1/configmaps", headers={"Origin": "http://localhost:1"})
        assert same.status == 200
        for origin in ("http://evil.example", "null"):
            refused = await client.get("/api/v1/configmaps", headers={"Origin": origin})
            assert refused.status == 403, origin
            body = await refused.json()
            assert (body["kind"], body["reason"], body["code"]) == ("Status", "Forbidden", 403)
        path = "/api/v1/watch/namespaces/kube-system/secrets/s"
        with pytest.raises(WSServerHandshakeError) as handshake:
            await client.ws_connect(path, headers={"Origin": "http://evil.example"})
        assert handshake.value.status == 403
        ws = await client.ws_connect(path)  # the same handshake from a non-browser client
        await ws.close()
    finally:
        await client.close()


async def test_other_modes_do_not_check_the_origin(tmp_path: Path) -> None:
    # A bearer token is no ambient credential: a page cannot use one it does not know.
    token = tmp_path / "token"
    token.write_text("t")
    client = await _guarded(authenticating.ClientAuth.parse(f"token-file:{token}"))
    try:
        answer = await client.get(
            "/api/v1/configmaps",
            headers={"Origin": "http://evil.example", "Authorization": "Bearer t"},
        )
        assert answer.status == 200
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("path", "rejected"),
    [
        ("/api/v1/namespaces/a/pods/p/exec", True),
        ("/api/v1/namespaces/a/pods/p/attach", True),
        ("/api/v1/namespaces/a/pods/p/portforward", True),
        ("/api/v1/namespaces/a/pods/p/%65xec", True),  # decoded before matching
        ("/api/v1/nodes/n/proxy/run/ns/pod/container", True),  # the kubelet's run
        ("/api/v1/nodes/n:10250/proxy/exec/ns/pod/container", True),
        ("/api/v1/nodes/n/proxy", True),
        ("/api/v1/namespaces/a/pods/p/proxy/", True),
        ("/api/v1/namespaces/a/pods/http:p:8080/proxy/metrics", True),
        ("/api/v1/namespaces/a/services/s/proxy/admin", True),
        ("/api/v1/namespaces/a/services/https:s:443/proxy", True),
        ("/api/v1/namespaces/a/pods/p/log", False),
        ("/api/v1/namespaces/a/pods/p", False),
        ("/api/v1/nodes/n", False),
        ("/api/v1/nodes/n/status", False),
        ("/api/v1/namespaces/a/services/s", False),
        ("/apis/apps/v1/namespaces/a/deployments/exec", False),
    ],
)
async def test_none_mode_rejects_exec_attach_port_forward_and_proxies(
    path: str, rejected: bool
) -> None:
    client = await _guarded(authenticating.ClientAuth.parse("none"))
    try:
        answer = await client.post(path)
        assert answer.status == (403 if rejected else 200)
        if rejected:
            assert "--reject-paths" in (await answer.json())["message"]
    finally:
        await client.close()


async def test_reject_paths_can_be_emptied_and_apply_to_none_mode_only(tmp_path: Path) -> None:
    exec_path = "/api/v1/namespaces/a/pods/p/exec"
    allowing = await _guarded(
        authenticating.ClientAuth.parse("none"),
        guard=authenticating.Guard(reject_paths=authenticating.RejectPaths.parse("")),
    )
    delegated = await _guarded(authenticating.ClientAuth.parse("delegated"))
    try:
        assert (await allowing.post(exec_path)).status == 200
        assert (await delegated.post(exec_path)).status == 200  # the apiserver decides
    finally:
        await allowing.close()
        await delegated.close()


def test_repeated_slashes_do_not_slip_by() -> None:
    rejecting = authenticating.RejectPaths.parse(authenticating.DEFAULT_REJECT_PATHS)
    assert rejecting.rejects("//api/v1/namespaces/a/pods/p/exec")
    assert rejecting.rejects("/api/v1/namespaces/a/pods/p//attach")
    assert not rejecting.rejects("/apis/v1/namespaces/a/pods/p/log")


def test_kubectl_proxys_default_plus_port_forward_and_proxies() -> None:
    assert authenticating.DEFAULT_REJECT_PATHS.split(",") == [
        "^/api/.*/pods/.*/exec",
        "^/api/.*/pods/.*/attach",
        "^/api/.*/pods/.*/portforward",
        "^/api/.*/nodes/.*/proxy",
        "^/api/.*/pods/.*/proxy",
        "^/api/.*/services/.*/proxy",
    ]
    with pytest.raises(ValueError, match="reject-paths"):
        authenticating.RejectPaths.parse("^/api/(")


async def test_a_non_loopback_listener_skips_the_host_check() -> None:
    client = await _guarded(
        authenticating.ClientAuth.parse("delegated"),
        guard=authenticating.Guard(loopback_listener=False),
    )
    try:
        answer = await client.get("/api/v1/configmaps", headers={"Host": "warmwatch.svc:8443"})
        assert answer.status == 200
    finally:
        await client.close()


class Verifier:
    def __init__(self) -> None:
        self.mine = "same"
        self.reachable = True
        self.calls = 0

    async def __call__(self, token: str) -> None:
        self.calls += 1
        if not self.reachable:
            raise UpstreamUnavailable("down")
        if token != self.mine:
            raise IdentityMismatch(f"{token} is not {self.mine}")


async def test_token_file_identity_is_checked_at_start_and_on_rotation(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("other\n")
    verifier, now = Verifier(), [0.0]
    tokens = authenticating.TokenFile(path, verify=verifier, retry=10, clock=lambda: now[0])
    with pytest.raises(IdentityMismatch):
        await tokens.check()  # at start: the start is refused
    assert await tokens.accepted() == b""

    path.write_text("same\n")
    os.utime(path, ns=(1, 10**18))
    assert await tokens.accepted() == b"same"
    calls = verifier.calls
    assert await tokens.accepted() == b"same"
    assert verifier.calls == calls  # checked once per token

    # Rotated while the apiserver is away: accepted unchecked, checked again later.
    verifier.reachable = False
    path.write_text("rotated\n")
    os.utime(path, ns=(2, 2 * 10**18))
    assert await tokens.accepted() == b"rotated"
    verifier.reachable = True
    assert await tokens.accepted() == b"rotated"  # not due yet
    now[0] = 11.0
    assert await tokens.accepted() == b""  # checked: another identity, refused
