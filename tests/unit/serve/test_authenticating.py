"""Local authentication and the Host check, on an in-process aiohttp app."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from proxy.serve import authenticating
from proxy.serve.routing import statuses


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


@pytest.mark.parametrize("text", ["token-file:", "tokenfile:/x", "open", "delegated"])
def test_bad_client_auth_values_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="client-auth"):
        authenticating.ClientAuth.parse(text)
