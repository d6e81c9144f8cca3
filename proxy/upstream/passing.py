"""Passthrough: every request the cache does not serve goes to the apiserver unchanged.

Bodies stream both ways without buffering (a ``watch`` or ``logs -f`` passes through as it
arrives), method, path, query and end-to-end headers are kept, WebSocket upgrades (exec,
attach, port-forward) are relayed frame by frame, and discovery documents are cached so a
controller can start while the apiserver is unreachable.

Credentials (docs/design.md §6):

- ``"sidecar"``: the client's ``Authorization`` is dropped and the sidecar's own credentials
  are used, as ``kubectl proxy`` does;
- ``"client"``: the client's ``Authorization`` (and impersonation headers) are forwarded
  unchanged and the sidecar adds nothing — not its token, and not its client certificate
  (such requests use a session without it).

Protocol quirks handled here:

- Hop-by-hop headers (RFC 9110 §7.6.1) and those named in ``Connection`` are not forwarded;
  neither is ``Host`` (aiohttp writes the apiserver's) nor ``Expect`` (aiohttp's server
  already answered ``100-continue`` to the client). ``Content-Length`` is kept, so a body
  with a known length is not re-chunked.
- Content encodings are passed through untouched (no decompression, no ``Accept-Encoding``
  of our own), so ``Content-Length`` and ``Content-Encoding`` stay true.
- Long-running requests (watches, ``follow``ing logs, exec/attach/portforward/proxy) get no
  read timeout; a watchdog ends the upstream request when the client goes away even while
  the upstream is silent.
- A failure after the response headers were sent cannot become a Status any more; the client
  connection is aborted so the truncation is visible (a clean end of a chunked body would
  pass a cut JSON document off as complete).
- While the apiserver cannot be reached (no connection, or the circuit breaker is open: then
  without even trying, so nothing waits for a connect timeout), the answer is at once a 503
  ServiceUnavailable Status with ``Retry-After: 1``: client-go retries such a request within
  its own timeout, and controllers requeue what still fails. Lease renewals and status
  updates therefore fail fast while the apiserver is down. Discovery is then served from its
  cache; a caller may give its own ``offline`` answer (the health endpoints do).
- Only WebSocket upgrades are relayed. SPDY/3.1 upgrades (kubectl before 1.30/1.31) are
  answered 400; current kubectl negotiates WebSocket first. Other upgrades (curl's ``h2c``)
  are ignored and the request proceeds as HTTP/1.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeAlias

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, MultiMapping

from proxy.kube.options import parse_bool
from proxy.kube.status import StatusError
from proxy.upstream.connecting import Credentials, Upstream
from proxy.upstream.errors import UpstreamAuthError, UpstreamStatusError, UpstreamUnavailable
from proxy.upstream.resilience import BreakerState, CircuitBreaker

__all__ = [
    "CachedDocument",
    "DiscoveryCache",
    "Offline",
    "PassthroughSettings",
    "WriteObserver",
    "discovery_key",
    "is_discovery_path",
    "is_long_running",
    "pass_through",
    "unavailable",
]

logger = logging.getLogger(__name__)

#: RFC 9110 §7.6.1 connection-specific headers (``Proxy-*`` is matched by prefix).
HOP_BY_HOP: Final = frozenset(
    {"connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade"}
)

#: Request headers that are never forwarded besides the hop-by-hop ones.
_REQUEST_DROPPED: Final = frozenset({"host", "expect"})

#: Headers of the WebSocket handshake; aiohttp's client writes its own.
_WEBSOCKET_HANDSHAKE: Final = frozenset(
    {
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-extensions",
        "sec-websocket-protocol",
        "sec-websocket-accept",
    }
)

#: Response headers of a cached discovery document that describe that one answer, not the
#: document: they are not stored.
_NOT_CACHED: Final = frozenset(
    {"content-length", "date", "audit-id", "set-cookie", "content-encoding"}
)

#: Headers a 304 answer repeats (RFC 9110 §15.4.5).
_NOT_MODIFIED_HEADERS: Final = frozenset(
    {"etag", "cache-control", "vary", "expires", "content-location"}
)

#: Subresources the apiserver treats as long-running (``LongRunningRequestCheck``).
_LONG_RUNNING_SUBRESOURCES: Final = frozenset({"exec", "attach", "portforward", "proxy", "log"})


@dataclass(frozen=True, kw_only=True)
class PassthroughSettings:
    idle_timeout: float = 60.0
    """Read-idle limit for ordinary (not long-running) requests: the apiserver itself gives up
    on such a request after 60 s (``--request-timeout``), so a longer silence means trouble.
    There is no total limit: a big LIST to a slow reader may take longer than that."""

    discovery_max_bytes: int = 64 * 2**20
    """Discovery documents larger than this are passed through but not cached. The largest
    real one, ``/openapi/v2`` of a cluster with many CRDs, is tens of MiB; the limit bounds
    the memory a document held for storing may take."""

    write_body_max: int = 4 * 2**20
    """Answers to writes up to this size are kept for the write observer (read your writes
    needs the written resourceVersion). An object is at most ~1.5 MiB (etcd's request
    limit), so only answers that are not one object are larger."""

    client_check_interval: float = 1.0
    """How often a long-running passthrough checks that its client is still connected. aiohttp
    only notices a gone client when writing, and a quiet watch writes nothing."""


# ------------------------------------------------------------------------- discovery


@dataclass(frozen=True, kw_only=True, slots=True)
class CachedDocument:
    """A discovery answer as stored for offline start."""

    status: int
    headers: tuple[tuple[str, str], ...]
    """End-to-end headers of the answer (Content-Type, ETag, Cache-Control, Vary, ...),
    without those describing one delivery (Date, Content-Length, Audit-Id)."""
    body: bytes
    etag: str | None


class DiscoveryCache(Protocol):
    """Where discovery documents are kept (SQLite in proxy.cache; in memory in tests)."""

    async def get(self, key: str) -> CachedDocument | None: ...

    async def put(self, key: str, doc: CachedDocument) -> None: ...


def is_discovery_path(path: str) -> bool:
    """``/version``, ``/api``, ``/api/V``, ``/apis``, ``/apis/G``, ``/apis/G/V``,
    ``/openapi/v2``, ``/openapi/v3`` and everything below ``/openapi/v3/``."""
    if path in ("/version", "/api", "/apis", "/openapi/v2", "/openapi/v3"):
        return True
    if path.startswith("/openapi/v3/"):
        return True
    parts = path.split("/")  # ["", "api", "v1"]
    if len(parts) == 3 and parts[1] == "api":
        return bool(parts[2])
    if len(parts) in (3, 4) and parts[1] == "apis":
        return all(parts[2:])
    return False


def discovery_key(*, path: str, query: Iterable[tuple[str, str]], accept: str) -> str:
    """``path?sorted-query|Accept``: the answer depends on exactly these (aggregated
    discovery and the openapi documents are negotiated by Accept)."""
    encoded = urllib.parse.urlencode(sorted(query), quote_via=urllib.parse.quote)
    return f"{path}?{encoded}|{accept}"


def _etag_matches(if_none_match: str | None, etag: str | None) -> bool:
    """Weak comparison (RFC 9110 §13.1.2), as Go's ``checkIfNoneMatch``."""
    if not if_none_match or not etag:
        return False
    if if_none_match.strip() == "*":
        return True
    ours = etag.strip().removeprefix("W/")
    return any(
        candidate.strip().removeprefix("W/") == ours for candidate in if_none_match.split(",")
    )


# ------------------------------------------------------------------------- classifying


def is_long_running(request: web.BaseRequest) -> bool:
    """Watches, followed logs, exec/attach/portforward/proxy: requests with no natural end."""
    if "watch" in request.query and parse_bool(request.query["watch"]):
        return True
    parts = [p for p in request.path.split("/") if p]
    # /api/v1/watch/... and /apis/G/V/watch/... (deprecated watch prefix)
    if len(parts) > 2 and parts[0] == "api" and parts[2] == "watch":
        return True
    if len(parts) > 3 and parts[0] == "apis" and parts[3] == "watch":
        return True
    return any(part in _LONG_RUNNING_SUBRESOURCES for part in parts[2:])


def _forwarded_request_headers(
    request: web.BaseRequest, *, websocket: bool = False
) -> CIMultiDict[str]:
    named = _connection_tokens(request.headers.getall("Connection", []))
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in request.headers.items():
        lower = name.lower()
        if (
            lower in HOP_BY_HOP
            or lower in _REQUEST_DROPPED
            or lower in named
            or lower.startswith("proxy-")
            or (websocket and lower in _WEBSOCKET_HANDSHAKE)
        ):
            continue
        out.add(name, value)
    return out


def _forwarded_response_headers(headers: MultiMapping[str]) -> list[tuple[str, str]]:
    named = _connection_tokens(headers.getall("Connection", []))
    return [
        (name, value)
        for name, value in headers.items()
        if name.lower() not in HOP_BY_HOP
        and name.lower() not in named
        and not name.lower().startswith("proxy-")
    ]


def _connection_tokens(values: Iterable[str]) -> frozenset[str]:
    return frozenset(
        token.strip().lower() for value in values for token in value.split(",") if token.strip()
    )


def status_response(error: StatusError) -> web.Response:
    """The Status answer as the apiserver writes it: compact JSON and a newline, with
    ``Retry-After`` from ``details.retryAfterSeconds``. The one way warmwatch answers an error."""
    response = web.Response(
        status=error.code,
        body=error.to_http_body(),
        content_type="application/json",
    )
    if error.retry_after is not None:
        response.headers["Retry-After"] = str(error.retry_after)
    return response


def unavailable(error: UpstreamUnavailable) -> web.Response:
    """The answer while the apiserver cannot be reached: 503 with ``Retry-After: 1``."""
    return status_response(StatusError.service_unavailable(str(error), retry_after_seconds=1))


Offline: TypeAlias = Callable[[web.Request, UpstreamUnavailable], Awaitable[web.StreamResponse]]
"""A caller's own answer for when the apiserver cannot be reached."""

WriteObserver: TypeAlias = Callable[[web.BaseRequest, CIMultiDict[str], bytes], None]
"""Told of each successful write (POST, PUT, PATCH, DELETE answered 2xx) once its answer was
passed on whole: the request, the answer's headers and its body as sent (still encoded when
it has a Content-Encoding)."""

_WRITE_METHODS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _check_reachable(breaker: CircuitBreaker | None) -> None:
    """Fail at once while the breaker is open (reflectors found the apiserver unreachable)."""
    if breaker is not None and breaker.state is BreakerState.OPEN:
        raise UpstreamUnavailable(
            f"the apiserver is unreachable (circuit breaker open; next probe in "
            f"{breaker.retry_in():.0f}s)"
        )


# ------------------------------------------------------------------------- the handler


async def pass_through(
    request: web.Request,
    *,
    upstream: Upstream,
    credentials: Credentials,
    discovery: DiscoveryCache | None = None,
    breaker: CircuitBreaker | None = None,
    offline: Offline | None = None,
    observe: WriteObserver | None = None,
    settings: PassthroughSettings | None = None,
) -> web.StreamResponse:
    """Answer ``request`` with the apiserver's answer (see the module docstring).

    ``discovery``: where discovery GETs are stored and, when the apiserver is unreachable,
    served from; None disables that. ``breaker``: while it is open, the apiserver counts as
    unreachable without a try. ``offline``: the answer when the apiserver is unreachable;
    by default (and when nothing is cached) a 503 ServiceUnavailable Status with
    ``Retry-After``. ``observe``: told of each successful write (see WriteObserver).
    """
    settings = settings or PassthroughSettings()
    try:
        return await _dispatch(
            request,
            upstream=upstream,
            credentials=credentials,
            discovery=discovery,
            breaker=breaker,
            offline=offline,
            observe=observe,
            settings=settings,
        )
    except UpstreamAuthError as error:
        # The sidecar's own credentials failed to load or refresh: not the apiserver's
        # answer, and not something the client can fix.
        logger.error("Passthrough %s %s: %s", request.method, request.path, error)
        _count(upstream, request.method.upper(), "error")
        return status_response(StatusError.internal_error(error))


async def _dispatch(
    request: web.Request,
    *,
    upstream: Upstream,
    credentials: Credentials,
    discovery: DiscoveryCache | None,
    breaker: CircuitBreaker | None,
    offline: Offline | None,
    observe: WriteObserver | None,
    settings: PassthroughSettings,
) -> web.StreamResponse:
    verb = request.method.upper()
    upgrade = request.headers.get("Upgrade", "").lower()
    if "websocket" in upgrade:
        return await _relay_websocket(request, upstream=upstream, credentials=credentials)
    if upgrade.startswith("spdy/"):
        refused = status_response(
            StatusError.bad_request(
                f"upgrade to {request.headers['Upgrade']!r} is not supported by warmwatch; "
                "use WebSocket (kubectl 1.30+ does by default)"
            )
        )
        _count(upstream, verb, refused.status)
        return refused
    # Any other Upgrade (e.g. curl's h2c) is ignored, as a server may: it is hop-by-hop and
    # not forwarded, and the request proceeds as HTTP/1.1.
    if discovery is not None and verb == "GET" and is_discovery_path(request.path):
        return await _discovery(
            request,
            upstream=upstream,
            credentials=credentials,
            cache=discovery,
            breaker=breaker,
            settings=settings,
        )
    collector = None
    if observe is not None and verb in _WRITE_METHODS:
        collector = _Collector(limit=settings.write_body_max)
    try:
        response = await _forward(
            request,
            upstream=upstream,
            credentials=credentials,
            breaker=breaker,
            settings=settings,
            collector=collector,
        )
    except UpstreamUnavailable as error:
        _count(upstream, verb, "error")
        if offline is not None:
            return await offline(request, error)
        return unavailable(error)
    if observe is not None and collector is not None and collector.complete:
        try:
            observe(request, CIMultiDict(collector.headers), collector.body)
        except Exception:  # the client has its answer; an observer must not change it
            logger.exception("Observing %s %s failed", verb, request.path)
    return response


def _count(upstream: Upstream, verb: str, code: int | str) -> None:
    upstream.metrics.passthrough_requests.labels(verb=verb, code=str(code)).inc()


class _ClientGone(Exception):
    """The client disconnected while its answer was streamed (not an upstream failure)."""


class _Collector:
    """Keeps a copy of a 2xx answer's body (for the discovery cache, or a write's observer),
    up to a limit."""

    def __init__(self, *, limit: int) -> None:
        self.limit = limit
        self.status = 0
        self.chunks: list[bytes] = []
        self.size = 0
        self.overflow = False
        self.complete = False
        self.headers: list[tuple[str, str]] = []

    def add(self, chunk: bytes) -> None:
        if self.overflow:
            return
        self.size += len(chunk)
        if self.size > self.limit:
            self.overflow = True
            self.chunks.clear()
        else:
            self.chunks.append(chunk)

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


async def _request_body(request: web.BaseRequest) -> AsyncIterator[bytes]:
    """The client's body as it arrives (aiohttp de-chunks it; the upstream request re-chunks
    it, or keeps the client's Content-Length)."""
    async for chunk in request.content.iter_any():
        yield chunk


async def _forward(
    request: web.Request,
    *,
    upstream: Upstream,
    credentials: Credentials,
    breaker: CircuitBreaker | None,
    settings: PassthroughSettings,
    headers: CIMultiDict[str] | None = None,
    collector: _Collector | None = None,
) -> web.StreamResponse:
    """Forward and stream the answer back.

    Raises :class:`UpstreamUnavailable` only while nothing has been sent to the client yet;
    later failures abort the client connection. With ``collector``, a 2xx answer's headers
    and body are also kept there.
    """
    _check_reachable(breaker)
    verb = request.method.upper()
    long_running = is_long_running(request)
    forwarded = headers if headers is not None else _forwarded_request_headers(request)
    data = _request_body(request) if request.body_exists else None
    response: web.StreamResponse | None = None
    try:
        async with upstream.request(
            request.method,
            request.raw_path,
            headers=forwarded,
            data=data,
            stream=True,
            timeout=math.inf if long_running else settings.idle_timeout,
            credentials=credentials,
            verb=verb,
            raw=True,
        ) as upstream_response:
            _count(upstream, verb, upstream_response.status)
            response = web.StreamResponse(
                status=upstream_response.status, reason=upstream_response.reason
            )
            kept = _forwarded_response_headers(upstream_response.headers)
            for name, value in kept:
                response.headers.add(name, value)
            if collector is not None and 200 <= upstream_response.status < 300:
                collector.status = upstream_response.status
                collector.headers = kept
            else:
                collector = None
            try:
                await response.prepare(request)
            except ConnectionError as error:
                raise _ClientGone(str(error)) from error
            pump = _pump(upstream_response, response, collector)
            if long_running:
                await _until_client_leaves(request, pump, settings=settings)
            else:
                await pump
            if collector is not None:
                collector.complete = not collector.overflow
            return response
    except UpstreamUnavailable as error:
        if response is None or not response.prepared:
            raise
        # Headers are out: a Status is no longer possible. Make the cut visible.
        logger.info("Passthrough %s %s cut by the apiserver side: %s", verb, request.path, error)
        _abort(request)
        return response
    except _ClientGone:
        logger.debug("Passthrough %s %s: client disconnected", verb, request.path)
        _abort(request)
        assert response is not None  # raised only once the answer has begun
        return response


async def _pump(
    source: aiohttp.ClientResponse,
    sink: web.StreamResponse,
    collector: _Collector | None,
) -> None:
    """Copy the body as it arrives: every chunk is written to the client at once."""
    async for chunk in source.content.iter_any():
        try:
            await sink.write(chunk)
        except ConnectionError as error:
            # aiohttp raises ClientConnectionResetError, which is also an aiohttp
            # ClientError: re-raised as is, it would pass for an upstream failure.
            raise _ClientGone(str(error)) from error
        if collector is not None:
            collector.add(chunk)
    try:
        await sink.write_eof()
    except ConnectionError as error:
        raise _ClientGone(str(error)) from error


async def _until_client_leaves(
    request: web.BaseRequest,
    pump: Coroutine[Any, Any, None],
    *,
    settings: PassthroughSettings,
) -> None:
    """Run ``pump`` until it ends, or until the client disconnects (then cancel it and raise
    _ClientGone). aiohttp tells a handler about a gone client only when it writes,
    and a quiet watch does not write: without this, the upstream watch would stay open until
    its own timeout."""
    task = asyncio.create_task(pump, name=f"passthrough {request.method} {request.path}")
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=settings.client_check_interval)
            if not task.done() and request.transport is None:
                raise _ClientGone("client disconnected")
        task.result()
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _abort(request: web.BaseRequest) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()


# ------------------------------------------------------------------------- discovery


async def _discovery(
    request: web.Request,
    *,
    upstream: Upstream,
    credentials: Credentials,
    cache: DiscoveryCache,
    breaker: CircuitBreaker | None,
    settings: PassthroughSettings,
) -> web.StreamResponse:
    """Forward a discovery GET (with the client's If-None-Match) and store a 200 answer;
    serve the stored document when the apiserver cannot be reached."""
    key = discovery_key(
        path=request.path,
        query=request.query.items(),
        accept=", ".join(request.headers.getall("Accept", [])),
    )
    headers = _forwarded_request_headers(request)
    # Ask for the identity encoding, so the stored document suits every later client.
    headers.popall("Accept-Encoding", None)
    collector = _Collector(limit=settings.discovery_max_bytes)
    try:
        response = await _forward(
            request,
            upstream=upstream,
            credentials=credentials,
            breaker=breaker,
            settings=settings,
            headers=headers,
            collector=collector,
        )
    except UpstreamUnavailable as error:
        document = await _cached(cache, key)
        if document is None:
            _count(upstream, "GET", "error")
            return unavailable(error)
        logger.info("apiserver unreachable (%s); serving %s from the discovery cache", error, key)
        cached = _serve_cached(request, document)
        _count(upstream, "GET", cached.status)
        return cached
    if collector.complete and collector.status == 200:
        etag = next((v for k, v in collector.headers if k.lower() == "etag"), None)
        document = CachedDocument(
            status=200,
            headers=tuple((k, v) for k, v in collector.headers if k.lower() not in _NOT_CACHED),
            body=collector.body,
            etag=etag,
        )
        try:
            await cache.put(key, document)
        except Exception:  # the client has its answer; a cache failure must not matter
            logger.exception("Cannot store discovery document %s", key)
    return response


async def _cached(cache: DiscoveryCache, key: str) -> CachedDocument | None:
    try:
        return await cache.get(key)
    except Exception:
        logger.exception("Cannot read discovery document %s", key)
        return None


def _serve_cached(request: web.BaseRequest, document: CachedDocument) -> web.Response:
    if _etag_matches(request.headers.get("If-None-Match"), document.etag):
        not_modified = web.Response(status=304)
        for name, value in document.headers:
            if name.lower() in _NOT_MODIFIED_HEADERS:
                not_modified.headers.add(name, value)
        return not_modified
    response = web.Response(status=document.status, body=document.body)
    for name, value in document.headers:
        response.headers.add(name, value)
    return response


# ------------------------------------------------------------------------- websockets


def _offered_protocols(request: web.BaseRequest) -> list[str]:
    return [
        token.strip()
        for value in request.headers.getall("Sec-WebSocket-Protocol", [])
        for token in value.split(",")
        if token.strip()
    ]


async def _relay_websocket(
    request: web.Request, *, upstream: Upstream, credentials: Credentials
) -> web.StreamResponse:
    """Open the WebSocket upstream first (offering the client's subprotocols), then accept the
    client's with the subprotocol the apiserver chose, and relay frames both ways."""
    verb = request.method.upper()
    if not web.WebSocketResponse().can_prepare(request).ok:
        refused = status_response(StatusError.bad_request("invalid WebSocket handshake"))
        _count(upstream, verb, refused.status)
        return refused
    headers = _forwarded_request_headers(request, websocket=True)
    try:
        async with upstream.websocket(
            request.raw_path,
            headers=headers,
            protocols=_offered_protocols(request),
            credentials=credentials,
        ) as upstream_ws:
            chosen = upstream_ws.protocol
            client_ws = web.WebSocketResponse(
                protocols=(chosen,) if chosen else (),
                # Frames are relayed as they are, pings and closes included.
                autoping=False,
                autoclose=False,
                max_msg_size=0,
            )
            await client_ws.prepare(request)
            _count(upstream, verb, 101)
            await _relay(client_ws, upstream_ws, label=request.path)
            return client_ws
    except UpstreamUnavailable as error:
        _count(upstream, verb, "error")
        return unavailable(error)
    except UpstreamStatusError as error:
        _count(upstream, verb, error.code)
        return status_response(error.to_status_error())


_Socket = web.WebSocketResponse | aiohttp.ClientWebSocketResponse


async def _relay(
    client_ws: web.WebSocketResponse, upstream_ws: aiohttp.ClientWebSocketResponse, *, label: str
) -> None:
    to_upstream = asyncio.create_task(
        _relay_frames(client_ws, upstream_ws), name=f"websocket relay client->apiserver {label}"
    )
    to_client = asyncio.create_task(
        _relay_frames(upstream_ws, client_ws), name=f"websocket relay apiserver->client {label}"
    )
    tasks = {to_upstream, to_client}
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        # One direction ended (a close was relayed, or a side vanished): end both.
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        with contextlib.suppress(Exception):
            await upstream_ws.close()
        with contextlib.suppress(Exception):
            await client_ws.close()


async def _relay_frames(source: _Socket, sink: _Socket) -> None:
    while True:
        message = await source.receive()
        kind = message.type
        if kind is aiohttp.WSMsgType.BINARY:
            await sink.send_bytes(message.data)
        elif kind is aiohttp.WSMsgType.TEXT:
            await sink.send_str(message.data)
        elif kind is aiohttp.WSMsgType.PING:
            await sink.ping(message.data)
        elif kind is aiohttp.WSMsgType.PONG:
            await sink.pong(message.data)
        elif kind is aiohttp.WSMsgType.CLOSE:
            code = message.data if isinstance(message.data, int) and message.data else 1000
            if code in (1005, 1006, 1015):  # reserved: never sent in a close frame
                code = 1000
            reason = (message.extra or "").encode()
            await sink.close(code=code, message=reason)
            return
        else:  # CLOSING, CLOSED, ERROR: the source is gone
            return
