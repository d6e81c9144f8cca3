"""An in-process fake apiserver, a proxy app around ``serve.passing.pass_through_with``, and
credentials.

The fake apiserver is a real aiohttp server on a random localhost port (plain HTTP, or TLS
with client-certificate verification); it records every request it sees so tests can assert
what the apiserver would have received (headers, Authorization, peer certificate, body).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from loadtest import pki as pki_module
from proxy.metrics import Metrics
from proxy.serve.documents import Admit
from proxy.serve.passing import pass_through_with
from proxy.serve.relaying import Offline, RelaySettings
from proxy.upstream.connecting import ConnectionSettings, Upstream, connect
from proxy.upstream.discovering import CachedDocument, DiscoveryCopies, DiscoverySettings
from proxy.upstream.resilience import CircuitBreaker, ListLimiter


async def free_slots(limiter: ListLimiter) -> int:
    """How many new listers get a slot without waiting (the slots are given back after)."""
    async with contextlib.AsyncExitStack() as stack:
        for taken in range(limiter.settings.concurrent_lists + 1):
            slot = await stack.enter_async_context(limiter.slot())
            hold = asyncio.create_task(slot.hold())
            for _ in range(3):
                await asyncio.sleep(0)
            if not hold.done():
                hold.cancel()
                await asyncio.gather(hold, return_exceptions=True)
                return taken
    return limiter.settings.concurrent_lists + 1


async def eventually(condition: Callable[[], object], *, timeout: float = 10) -> None:
    """Poll ``condition`` until it is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


@dataclass
class Seen:
    """One request as the fake apiserver received it."""

    method: str
    path_qs: str
    headers: dict[str, str]
    header_names: list[str]
    body: bytes
    peer_cn: str | None


@dataclass
class FakeApiserver:
    """Configurable endpoints; ``seen`` lists every request."""

    seen: list[Seen] = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    watch_ended: asyncio.Event = field(default_factory=asyncio.Event)
    rejected_tokens: set[str] = field(default_factory=set)
    discovery_hits: int = 0
    discovery_version: int = 0
    unhealthy: bool = False
    """Set by a test: ``/healthz`` fails."""
    """Bumped by a test: the discovery documents change (body and ETag)."""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/echo{tail:.*}", self.echo)
        app.router.add_get("/slow", self.slow)
        app.router.add_get("/big", self.big)
        app.router.add_get("/cut", self.cut)
        app.router.add_get("/sleep", self.sleep)
        app.router.add_get("/api/v1/namespaces/default/configmaps", self.configmaps)
        app.router.add_get("/api/v1/namespaces/default/pods/p/exec", self.exec_ws)
        app.router.add_get("/api/v1/namespaces/default/pods/forbidden/exec", self.forbidden)
        app.router.add_get("/status/{code}", self.status)
        app.router.add_get("/html503", self.html503)
        app.router.add_get("/notjson", self.notjson)
        app.router.add_get("/version", self.discovery)
        app.router.add_get("/apis", self.discovery)
        app.router.add_get("/api", self.discovery)
        app.router.add_get("/gzip", self.gzip)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", self.echo)
        return app

    async def record(self, request: web.Request) -> Seen:
        body = await request.read()
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        cn = None
        if peer:
            for rdn in peer.get("subject", ()):
                for key, value in rdn:
                    if key == "commonName":
                        cn = value
        seen = Seen(
            method=request.method,
            path_qs=request.path_qs,
            headers={k.lower(): v for k, v in request.headers.items()},
            header_names=[k.lower() for k in request.headers],
            body=body,
            peer_cn=cn,
        )
        self.seen.append(seen)
        auth = request.headers.get("Authorization", "")
        if auth.removeprefix("Bearer ") in self.rejected_tokens:
            raise web.HTTPUnauthorized(
                text=orjson.dumps(
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "metadata": {},
                        "status": "Failure",
                        "message": "Unauthorized",
                        "reason": "Unauthorized",
                        "code": 401,
                    }
                ).decode(),
                content_type="application/json",
            )
        return seen

    async def echo(self, request: web.Request) -> web.Response:
        seen = await self.record(request)
        response = web.Response(
            status=201 if request.method == "POST" else 200,
            body=orjson.dumps(
                {
                    "method": seen.method,
                    "path_qs": seen.path_qs,
                    "body": seen.body.decode("latin-1"),
                    "headers": seen.headers,
                    "peer_cn": seen.peer_cn,
                }
            ),
            content_type="application/json",
        )
        response.headers["Audit-Id"] = "audit-123"
        response.headers["Warning"] = '299 - "deprecated"'
        response.headers["Keep-Alive"] = "timeout=5"
        response.headers["Proxy-Authenticate"] = "Basic"
        response.headers["X-Hop-Named"] = "drop-me"
        response.headers["Connection"] = "X-Hop-Named"
        response.headers["X-End-To-End"] = "kept"
        return response

    async def big(self, request: web.Request) -> web.StreamResponse:
        """32 MiB in 64 KiB chunks: a large LIST."""
        response = web.StreamResponse()
        response.content_type = "application/json"
        await response.prepare(request)
        for _ in range(512):
            await response.write(b"x" * 65536)
        await response.write_eof()
        return response

    async def slow(self, request: web.Request) -> web.StreamResponse:
        await self.record(request)
        response = web.StreamResponse()
        response.content_type = "text/plain"
        await response.prepare(request)
        await response.write(b"first\n")
        await asyncio.wait_for(self.gate.wait(), 10)
        await response.write(b"second\n")
        await response.write_eof()
        return response

    async def cut(self, request: web.Request) -> web.StreamResponse:
        """Sends a partial chunked body, then drops the connection."""
        await self.record(request)
        response = web.StreamResponse()
        response.content_type = "application/json"
        await response.prepare(request)
        await response.write(b'{"items":[')
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.abort()
        return response

    async def sleep(self, request: web.Request) -> web.Response:
        await self.record(request)
        await asyncio.sleep(float(request.query.get("seconds", "5")))
        return web.json_response({"slept": True})

    async def configmaps(self, request: web.Request) -> web.StreamResponse:
        seen = await self.record(request)
        if "watch" not in request.query:
            return web.json_response(
                {
                    "kind": "ConfigMapList",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": "7"},
                    "items": [],
                }
            )
        if request.query.get("resourceVersion") == "1":
            return web.json_response(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Failure",
                    "message": "too old resource version: 1 (5)",
                    "reason": "Expired",
                    "code": 410,
                },
                status=410,
            )
        del seen
        response = web.StreamResponse()
        response.content_type = "application/json"
        await response.prepare(request)
        try:
            await response.write(
                b'{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","resourceVersion":"8"}}}\n'
            )
            if request.query.get("stall") == "1":
                await asyncio.sleep(3600)
            await response.write(
                b'{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"9"}}}\n'
            )
            await response.write_eof()
        finally:
            self.watch_ended.set()
        return response

    async def exec_ws(self, request: web.Request) -> web.WebSocketResponse:
        await self.record(request)
        ws = web.WebSocketResponse(protocols=("v5.channel.k8s.io", "v4.channel.k8s.io"))
        await ws.prepare(request)
        async for message in ws:
            if message.type.name == "BINARY":
                await ws.send_bytes(b"echo:" + message.data)
            elif message.type.name == "TEXT":
                if message.data == "bye":
                    await ws.close(code=4001, message=b"server says bye")
                    break
                await ws.send_str("echo:" + message.data)
        return ws

    async def forbidden(self, request: web.Request) -> web.Response:
        await self.record(request)
        return web.json_response(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": 'pods "forbidden" is forbidden: nope',
                "reason": "Forbidden",
                "code": 403,
            },
            status=403,
        )

    async def status(self, request: web.Request) -> web.Response:
        await self.record(request)
        code = int(request.match_info["code"])
        payload: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"failure {code}",
            "reason": {404: "NotFound", 429: "TooManyRequests", 504: "Timeout"}.get(code, ""),
            "code": code,
        }
        headers = {}
        if "retry_after" in request.query:
            headers["Retry-After"] = request.query["retry_after"]
        if "details_retry" in request.query:
            payload["details"] = {"retryAfterSeconds": int(request.query["details_retry"])}
        return web.json_response(payload, status=code, headers=headers)

    async def html503(self, request: web.Request) -> web.Response:
        await self.record(request)
        return web.Response(status=503, text="<html>down</html>", content_type="text/html")

    async def notjson(self, request: web.Request) -> web.Response:
        await self.record(request)
        return web.Response(text="[1, 2]", content_type="application/json")

    async def discovery(self, request: web.Request) -> web.Response:
        seen = await self.record(request)
        self.discovery_hits += 1
        accept = seen.headers.get("accept", "")
        version = self.discovery_version
        body = orjson.dumps(
            {"kind": "APIGroupList", "path": request.path, "accept": accept, "version": version}
        )
        etag = f'"etag-{request.path.strip("/")}{f"-{version}" if version else ""}"'
        if request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers={"ETag": etag})
        return web.Response(
            body=body,
            content_type="application/json",
            headers={"ETag": etag, "Cache-Control": "public", "Audit-Id": "a1"},
        )

    async def healthz(self, request: web.Request) -> web.Response:
        await self.record(request)
        if self.unhealthy:
            return web.Response(status=500, text="[-]etcd failed: reason withheld\n")
        return web.Response(text="ok")

    async def gzip(self, request: web.Request) -> web.Response:
        await self.record(request)
        response = web.Response(body=b"x" * 5000, content_type="text/plain")
        response.enable_compression(force=web.ContentCoding.gzip)
        return response


class Served:
    """An aiohttp app on 127.0.0.1 (random port, kept across restarts), optionally TLS."""

    def __init__(
        self,
        app: web.Application,
        *,
        ssl_context: ssl.SSLContext | None = None,
        handler_cancellation: bool = True,
    ) -> None:
        self.app = app
        self.handler_cancellation = handler_cancellation
        self.ssl_context = ssl_context
        self.port = 0
        self.runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.ssl_context else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.runner = web.AppRunner(
            self.app, handler_cancellation=self.handler_cancellation, shutdown_timeout=0.1
        )
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", self.port, ssl_context=self.ssl_context)
        await site.start()
        self.port = self.runner.addresses[0][1]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> pki_module.Pki:
    return pki_module.create(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def fake() -> FakeApiserver:
    return FakeApiserver()


@pytest.fixture
async def apiserver(fake: FakeApiserver) -> AsyncIterator[Served]:
    served = Served(fake.app())
    await served.start()
    yield served
    await served.stop()


@pytest.fixture
async def tls_apiserver(fake: FakeApiserver, pki: pki_module.Pki) -> AsyncIterator[Served]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.serving_cert, pki.serving_key)
    context.load_verify_locations(cafile=str(pki.ca_cert))
    context.verify_mode = ssl.CERT_OPTIONAL
    served = Served(fake.app(), ssl_context=context)
    await served.start()
    yield served
    await served.stop()


def user_kubeconfig(path: Path, *, server: str, user: str) -> Path:
    """A kubeconfig for ``server`` whose one user is ``user``, a YAML flow mapping
    (``{token: t}``)."""
    path.write_text(
        textwrap.dedent(
            f"""\
            apiVersion: v1
            kind: Config
            clusters:
            - name: fake
              cluster: {{server: "{server}"}}
            users:
            - name: sidecar
              user: {user}
            contexts:
            - name: fake
              context: {{cluster: fake, user: sidecar}}
            current-context: fake
            """
        )
    )
    return path


def token_kubeconfig(path: Path, *, server: str, token: str) -> Path:
    return user_kubeconfig(path, server=server, user=f"{{token: {token}}}")


EXEC_PLUGIN = """\
import datetime, json, os, sys
counter_path, expires_in = sys.argv[1], sys.argv[2]
count = int(open(counter_path).read()) + 1 if os.path.exists(counter_path) else 1
open(counter_path, "w").write(str(count))
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
status = {"token": f"exec-token-{count}"}
if expires_in != "none":
    when = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=float(expires_in))
    status["expirationTimestamp"] = when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
print(json.dumps({"apiVersion": info["apiVersion"], "kind": "ExecCredential", "status": status}))
"""


def exec_kubeconfig(path: Path, *, server: str, counter: Path, expires_in: str) -> Path:
    script = path.parent / "exec-plugin.py"
    script.write_text(EXEC_PLUGIN)
    plugin = (
        "{apiVersion: client.authentication.k8s.io/v1beta1, "
        f'command: "{sys.executable}", args: ["{script}", "{counter}", "{expires_in}"]}}'
    )
    return user_kubeconfig(path, server=server, user=f"{{exec: {plugin}}}")


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
async def upstream(apiserver: Served, tmp_path: Path, metrics: Metrics) -> AsyncIterator[Upstream]:
    """The sidecar's connection to the (plain HTTP) fake, with token ``sidecar-token``."""
    kubeconfig = token_kubeconfig(
        tmp_path / "kubeconfig", server=apiserver.url, token="sidecar-token"
    )
    connected = await connect(
        ConnectionSettings(kubeconfig=str(kubeconfig), connect_timeout=2.0, request_timeout=5.0),
        metrics=metrics,
    )
    yield connected
    await connected.close()


class MemoryDiscoveryCache:
    """In-memory DiscoveryCache for tests (the app's lives in SQLite)."""

    def __init__(self) -> None:
        self.documents: dict[str, CachedDocument] = {}

    async def get(self, key: str) -> CachedDocument | None:
        return self.documents.get(key)

    async def put(self, key: str, doc: CachedDocument, *, evict: Sequence[str] = ()) -> None:
        await self.drop(evict)
        self.documents[key] = doc

    async def drop(self, keys: Sequence[str]) -> None:
        for key in keys:
            del self.documents[key]


@dataclass
class Proxy:
    served: Served
    credentials: str
    discovery: MemoryDiscoveryCache

    @property
    def url(self) -> str:
        return self.served.url


async def start_proxy(
    upstream: Upstream,
    *,
    credentials: str,
    discovery: MemoryDiscoveryCache | None = None,
    settings: RelaySettings | None = None,
    breaker: CircuitBreaker | None = None,
    offline: Offline | None = None,
    copies: DiscoveryCopies | None = None,
    discovery_offline: Admit | None = None,
) -> Proxy:
    cache = discovery if discovery is not None else MemoryDiscoveryCache()
    if copies is None:  # stored within the bounds, never answered from
        copies = DiscoveryCopies(settings=DiscoverySettings(max_age=0), metrics=upstream.metrics)

    async def handler(request: web.Request) -> web.StreamResponse:
        return await pass_through_with(
            request,
            upstream=upstream,
            credentials=credentials,  # type: ignore[arg-type]
            discovery=cache,
            copies=copies,
            discovery_offline=discovery_offline,
            breaker=breaker,
            offline=offline,
            settings=settings,
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    # aiohttp's default: handlers are not cancelled when the client leaves (passthrough must
    # notice by itself).
    served = Served(app, handler_cancellation=False)
    await served.start()
    return Proxy(served=served, credentials=credentials, discovery=cache)


@pytest.fixture
async def sidecar_proxy(upstream: Upstream) -> AsyncIterator[Proxy]:
    proxy = await start_proxy(
        upstream, credentials="sidecar", settings=RelaySettings(client_check_interval=0.05)
    )
    yield proxy
    await proxy.served.stop()


@pytest.fixture
async def client_proxy(upstream: Upstream) -> AsyncIterator[Proxy]:
    proxy = await start_proxy(upstream, credentials="client")
    yield proxy
    await proxy.served.stop()
