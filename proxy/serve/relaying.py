"""Relaying the apiserver's answer to a passed-through request to its client.

The upstream half (``proxy.upstream.forwarding``) hands over the answer's status, headers
and body as they arrive; this module writes them to the client:

- Every chunk is written at once, within the slow-client deadline of
  ``streaming.write_within`` (``RelaySettings.slow_write_timeout``): a client that
  stops reading is cut, as the cache's own LISTs and watches are.
- Long-running requests (watches, ``follow``ing logs, exec/attach/portforward/proxy) get no
  read timeout; a watchdog ends the upstream request when the client goes away even while
  the upstream is silent.
- A failure after the response headers were sent cannot become a Status any more; the client
  connection is aborted so the truncation is visible (a clean end of a chunked body would
  pass a cut JSON document off as complete).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from aiohttp import web
from multidict import CIMultiDict

from proxy.kube.options import is_long_running
from proxy.serve.streaming import ClientGone, SlowClient, cut, write_within
from proxy.upstream.connecting import Credentials, Purpose, Upstream
from proxy.upstream.errors import UpstreamUnavailable
from proxy.upstream.forwarding import (
    Answer,
    PassthroughSettings,
    forwarded,
    forwarded_request_headers,
)
from proxy.upstream.resilience import CircuitBreaker

logger = logging.getLogger(__name__)

Offline: TypeAlias = Callable[[web.Request, UpstreamUnavailable], Awaitable[web.StreamResponse]]
"""A caller's own answer for when the apiserver cannot be reached."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RelaySettings:
    """A passed-through request's settings: the upstream half's, and the client's."""

    upstream: PassthroughSettings = field(default_factory=PassthroughSettings)
    """Forwarding the request and keeping copies of answers (``proxy.upstream.forwarding``)."""
    slow_write_timeout: float = 30.0
    """A client that accepts no write of the answer for this long is disconnected (as the
    cache's LISTs and watches, ``--watch-write-timeout``): it must not hold an upstream
    connection and a buffered chunk for as long as it likes."""
    client_check_interval: float = 1.0
    """How often a long-running passthrough checks that its client is still connected. aiohttp
    only notices a gone client when writing, and a quiet watch writes nothing."""


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


async def relay(
    request: web.Request,
    *,
    upstream: Upstream,
    credentials: Credentials,
    breaker: CircuitBreaker | None,
    settings: RelaySettings,
    purpose: Purpose,
    headers: CIMultiDict[str] | None = None,
    collector: Collector | None = None,
    counted: Callable[[int], None] | None = None,
) -> web.StreamResponse:
    """Forward ``request`` and write the answer to its client as it arrives.

    Raises :class:`UpstreamUnavailable` only while nothing has been sent to the client yet;
    later failures abort the client connection. :class:`UpstreamBusy` when no connection of
    ``purpose`` is free (nothing was sent). With ``collector``, a 2xx answer's headers
    and body are also kept there; ``counted`` is told the size of every body chunk sent.
    """
    response: web.StreamResponse | None = None
    long_running = is_long_running(request.path, request.query)
    try:
        async with forwarded(
            upstream=upstream,
            method=request.method,
            target=request.raw_path,
            headers=headers if headers is not None else forwarded_request_headers(request.headers),
            body=_request_body(request) if request.body_exists else None,
            long_running=long_running,
            credentials=credentials,
            breaker=breaker,
            settings=settings.upstream,
            purpose=purpose,
        ) as answer:
            response = _response(answer)
            await _send_headers(request, response)
            if collector is not None and 200 <= answer.status < 300:
                collector.status, collector.headers = answer.status, answer.headers
            else:
                collector = None
            body = _write_body(request, answer, response, collector, counted, settings=settings)
            if long_running:
                await _until_client_leaves(request, body, settings=settings)
            else:
                await body
            if collector is not None:
                collector.complete = not collector.overflow
            return response
    except UpstreamUnavailable as error:
        if response is None or not response.prepared:
            raise
        # Headers are out: a Status is no longer possible. Make the cut visible.
        logger.info(
            "Passthrough %s %s cut by the apiserver side: %s", request.method, request.path, error
        )
        cut(request)
        return response
    except (ClientGone, SlowClient) as gone:
        reason = "slow" if isinstance(gone, SlowClient) else "disconnected"
        upstream.metrics.client_errors.labels(reason=reason).inc()
        logger.debug("Passthrough %s %s: client %s", request.method, request.path, reason)
        cut(request)
        assert response is not None  # raised only once the answer was made
        return response


def _response(answer: Answer) -> web.StreamResponse:
    """The client's answer: the apiserver's status and headers."""
    response = web.StreamResponse(status=answer.status, reason=answer.reason)
    for name, value in answer.headers:
        response.headers.add(name, value)
    return response


async def _send_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Send the status and headers; a client already gone is :class:`ClientGone` (the
    caller holds ``response``, which the handler still returns)."""
    try:
        await response.prepare(request)
    except ConnectionError as error:
        raise ClientGone(str(error)) from error


async def _write_body(
    request: web.BaseRequest,
    answer: Answer,
    response: web.StreamResponse,
    collector: Collector | None,
    counted: Callable[[int], None] | None,
    *,
    settings: RelaySettings,
) -> None:
    """Copy the body as it arrives: every chunk is written to the client at once, within
    ``slow_write_timeout`` (:func:`streaming.write_within`)."""
    async for chunk in answer.body:
        if counted is not None:
            counted(len(chunk))
        try:
            await write_within(
                response, chunk, timeout=settings.slow_write_timeout, transport=request.transport
            )
        except ConnectionError as error:
            raise ClientGone(str(error)) from error
        if collector is not None:
            collector.add(chunk)
    try:
        await response.write_eof()
    except ConnectionError as error:
        raise ClientGone(str(error)) from error


async def _until_client_leaves(
    request: web.BaseRequest,
    body: Coroutine[Any, Any, None],
    *,
    settings: RelaySettings,
) -> None:
    """Run ``body`` until it ends, or until the client disconnects (then cancel it and raise
    :class:`ClientGone`). aiohttp tells a handler about a gone client only when it writes,
    and a quiet watch does not write: without this, the upstream watch would stay open until
    its own timeout."""
    task = asyncio.create_task(body, name=f"passthrough {request.method} {request.path}")
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=settings.client_check_interval)
            if not task.done() and request.transport is None:
                raise ClientGone("client disconnected")
        task.result()
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
