"""Forwarding a request to the apiserver and streaming its answer back (passthrough's core).

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
  its own timeout, and controllers requeue what still fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, MultiMapping

from proxy.cache.shapes import Encoding
from proxy.kube import protobuf
from proxy.kube.options import parse_bool
from proxy.kube.status import StatusError
from proxy.upstream.connecting import Credentials, Purpose, Upstream
from proxy.upstream.errors import UpstreamUnavailable
from proxy.upstream.resilience import BreakerState, CircuitBreaker

logger = logging.getLogger(__name__)

Offline: TypeAlias = Callable[[web.Request, UpstreamUnavailable], Awaitable[web.StreamResponse]]
"""A caller's own answer for when the apiserver cannot be reached."""

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

    slow_write_timeout: float = 30.0
    """A client that accepts no write of the answer for this long is disconnected (as the
    cache's LISTs and watches, ``--watch-write-timeout``): it must not hold an upstream
    connection and a buffered chunk for as long as it likes."""

    client_check_interval: float = 1.0
    """How often a long-running passthrough checks that its client is still connected. aiohttp
    only notices a gone client when writing, and a quiet watch writes nothing."""


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


def forwarded_request_headers(
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


def forwarded_response_headers(headers: MultiMapping[str]) -> list[tuple[str, str]]:
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


STATUS: Final = web.ResponseKey("warmwatch.status", StatusError)
"""The StatusError an answer of :func:`status_response` carries: the serving layer writes it
again in the encoding the client negotiated (``serve/routing.statuses``)."""


def status_response(error: StatusError, *, encoding: Encoding = Encoding.JSON) -> web.Response:
    """The Status answer as the apiserver writes it: compact JSON and a newline (or its
    protobuf form), with ``Retry-After`` from ``details.retryAfterSeconds``. The one way
    warmwatch answers an error."""
    if encoding is Encoding.PROTOBUF:
        response = web.Response(
            status=error.code, body=error.to_protobuf(), content_type=protobuf.MEDIA_TYPE
        )
    else:
        response = web.Response(
            status=error.code, body=error.to_http_body(), content_type="application/json"
        )
    if error.retry_after is not None:
        response.headers["Retry-After"] = str(error.retry_after)
    response[STATUS] = error
    return response


def unavailable(error: UpstreamUnavailable) -> web.Response:
    """The answer while the apiserver cannot be reached: 503 with ``Retry-After: 1``."""
    return status_response(StatusError.service_unavailable(str(error), retry_after_seconds=1))


def check_reachable(breaker: CircuitBreaker | None) -> None:
    """Fail at once while the breaker is open (reflectors found the apiserver unreachable)."""
    if breaker is not None and breaker.state is BreakerState.OPEN:
        raise UpstreamUnavailable(
            f"the apiserver is unreachable (circuit breaker open; next probe in "
            f"{breaker.retry_in():.0f}s)"
        )


def count(upstream: Upstream, verb: str, code: int | str) -> None:
    upstream.metrics.passthrough_requests.labels(verb=verb, code=str(code)).inc()


class _ClientGone(Exception):
    """The client disconnected, or stopped reading, while its answer was streamed (not an
    upstream failure)."""

    def __init__(self, message: str, *, reason: str = "disconnected") -> None:
        super().__init__(message)
        self.reason = reason
        """A ``warmwatch_client_errors_total`` reason: disconnected or slow."""


class Collector:
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


async def forward(
    request: web.Request,
    *,
    upstream: Upstream,
    credentials: Credentials,
    breaker: CircuitBreaker | None,
    settings: PassthroughSettings,
    purpose: Purpose,
    headers: CIMultiDict[str] | None = None,
    collector: Collector | None = None,
    counted: Callable[[int], None] | None = None,
) -> web.StreamResponse:
    """Forward and stream the answer back.

    Raises :class:`UpstreamUnavailable` only while nothing has been sent to the client yet;
    later failures abort the client connection. :class:`UpstreamBusy` when no connection of
    ``purpose`` is free (nothing was sent). With ``collector``, a 2xx answer's headers
    and body are also kept there; ``counted`` is told the size of every body chunk sent.
    """
    check_reachable(breaker)
    verb = request.method.upper()
    long_running = is_long_running(request)
    forwarded = headers if headers is not None else forwarded_request_headers(request)
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
            purpose=purpose,
            credentials=credentials,
            verb=verb,
            raw=True,
        ) as upstream_response:
            count(upstream, verb, upstream_response.status)
            response = web.StreamResponse(
                status=upstream_response.status, reason=upstream_response.reason
            )
            kept = forwarded_response_headers(upstream_response.headers)
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
            pump = _pump(
                upstream_response,
                response,
                collector,
                counted,
                timeout=settings.slow_write_timeout,
            )
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
        cut(request)
        return response
    except _ClientGone as gone:
        upstream.metrics.client_errors.labels(reason=gone.reason).inc()
        logger.debug("Passthrough %s %s: client %s", verb, request.path, gone.reason)
        cut(request)
        assert response is not None  # raised only once the answer has begun
        return response


async def _pump(
    source: aiohttp.ClientResponse,
    sink: web.StreamResponse,
    collector: Collector | None,
    counted: Callable[[int], None] | None,
    *,
    timeout: float,
) -> None:
    """Copy the body as it arrives: every chunk is written to the client at once, within
    ``timeout`` (a client that stops reading is given up)."""
    async for chunk in source.content.iter_any():
        if counted is not None:
            counted(len(chunk))
        try:
            async with asyncio.timeout(timeout):
                await sink.write(chunk)
        except TimeoutError:
            raise _ClientGone("stopped reading", reason="slow") from None
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


def cut(request: web.BaseRequest) -> None:
    """Close the client's connection now, discarding what it has not read (a TCP reset).

    ``close()`` would first wait for the client to read our buffer, and even ``abort()`` leaves
    the kernel holding the connection open until the client reads what the socket still has:
    a client that stopped reading would keep it forever.
    """
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
