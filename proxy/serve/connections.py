"""Client connections below HTTP, and what aiohttp reports about bad clients (docs/design.md §9).

aiohttp bounds neither the number of connections nor the time a client may take to send its
headers, and it logs every malformed request at ERROR with a traceback whose message quotes
the offending line (which may be an ``Authorization`` header). Here:

- :class:`GuardedSite` listens like ``web.TCPSite`` but wraps each connection's aiohttp
  handler in a :class:`GuardedConnection`, which counts the open connections, closes one whose
  request headers did not arrive within ``header_timeout`` (armed when the connection opens
  and when the first byte of a further request arrives; an idle keep-alive connection is
  aiohttp's ``keepalive_timeout``), and refuses headers over ``max_header_bytes`` with Go's
  431. It sees where headers end in the bytes (the blank line), and from :func:`middleware`
  (a request reaching the application has had its headers read; its end makes the
  connection idle). Over ``max_connections`` a connection's first request is answered 429.
  Its socket (set on the listener, inherited) takes at most :data:`UNSENT_LOW_WATER` of an
  answer not yet sent, so a client that stops reading holds little kernel memory and meets
  the write deadline soon.
- :class:`ClientErrorLog` is the logger aiohttp's handler reports to: a client's fault
  (malformed HTTP, a disconnect, a client that stopped reading) is counted in
  ``warmwatch_client_errors_total{reason}`` and logged as one line naming the reason and the
  error's class, never its message; anything else is warmwatch's own failure and is logged
  as aiohttp reports it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from typing import Final, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler

from proxy.metrics import Metrics
from proxy.serve.limiting import Limits, too_many_requests
from proxy.serve.streaming import ClientGone, SlowClient

logger = logging.getLogger(__name__)

HEADER_TOO_LARGE: Final = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
    b"431 Request Header Fields Too Large"
)
"""What Go's HTTP server writes (then closes) when the headers exceed ``MaxHeaderBytes``."""

QUIET: Final = 10.0
"""Seconds between two INFO lines about malformed requests."""

HEADER_SHARE: Final = 64 * 1024
"""Headers this large or smaller are never refused for the shared ``header_budget``: real
requests' headers are a few KiB."""

HEADER_SLACK: Final = 4096
"""Go reads ``MaxHeaderBytes`` plus 4 KiB before it refuses (``http.Server`` ``initialReadLimitSize``)."""

UNSENT_LOW_WATER: Final = 128 * 1024
"""``TCP_NOTSENT_LOWAT`` of every client connection: the kernel takes more of an answer only
while less than this is waiting to be sent. Without it Linux grows a socket's send buffer up
to ``net.ipv4.tcp_wmem``'s maximum (4 MiB) for a client that stops reading, and holds that
much per connection (kernel memory, charged to the container's under cgroup v2) before a
write waits and the write deadline can see it: 300 such watchers held 0.8-1.1 GiB. It bounds only
what is not yet sent, so data in flight still grows with the link (a long fat network keeps
its throughput); 128 KiB is what a watcher catching up reads per step."""


def client_fault(error: BaseException | None) -> str | None:
    """The ``client_errors`` reason when ``error`` is the client's doing, else None."""
    if isinstance(error, HttpProcessingError):
        return "malformed"
    if isinstance(error, SlowClient):
        return "slow"
    if isinstance(error, ConnectionError | ClientGone):
        return "disconnected"
    return None


class ClientErrorLog(logging.Logger):
    """The logger given to aiohttp's connection handler (``AppRunner(logger=...)``).

    Every report reaches :meth:`handle` (so a client error is counted whatever the log level);
    a client's fault becomes one line at DEBUG, and malformed HTTP one at INFO at most every
    :data:`QUIET` seconds (saying how many it stands for), so garbage sent in a loop does
    not flood the log; the rest goes to this module's logger as reported."""

    def __init__(self, *, metrics: Metrics) -> None:
        super().__init__(logger.name)
        self.metrics = metrics
        self._said_at = -QUIET
        self._unsaid = 0

    def isEnabledFor(self, level: int) -> bool:
        return True

    def handle(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        reason = client_fault(error)
        if reason is None:
            if logger.isEnabledFor(record.levelno):
                logger.handle(record)
            return
        self.metrics.client_errors.labels(reason=reason).inc()
        now = time.monotonic()
        if reason != "malformed" or now - self._said_at < QUIET:
            self._unsaid += reason == "malformed"
            logger.debug("client error: %s (%s)", reason, type(error).__name__)
            return
        logger.info(
            "client error: malformed (%s); %d more since the last such line "
            "(warmwatch_client_errors_total counts them all)",
            type(error).__name__,
            self._unsaid,
        )
        self._said_at, self._unsaid = now, 0


class ConnectionGuard:
    """The state of one listener's connections."""

    def __init__(self, *, limits: Limits, metrics: Metrics) -> None:
        self.limits = limits
        self.metrics = metrics
        self.open = 0
        self.buffered = 0
        """Header bytes of requests still being received, all connections together."""


def headers_end(data: bytes) -> int:
    """The index just past the blank line that ends a request's headers, or -1. A bare LF
    line end counts too (aiohttp's parser accepts it)."""
    ends = [i for i in (data.find(b"\n\r\n"), data.find(b"\n\n")) if i >= 0]
    if not ends:
        return -1
    first = min(ends)
    return first + (3 if data.startswith(b"\n\r\n", first) else 2)


class GuardedConnection(asyncio.Protocol):
    """aiohttp's per-connection handler, with the limits of :class:`ConnectionGuard` around
    it. Every protocol callback is passed on to the handler.

    A connection is reading a request's headers (its deadline armed, their bytes counted),
    in a request (headers complete: seen in the bytes, or the handler started), or idle
    between requests (the next byte starts the headers of the next one)."""

    def __init__(self, handler: asyncio.Protocol, guard: ConnectionGuard) -> None:
        self.handler = handler
        self.guard = guard
        self.transport: asyncio.Transport | None = None
        self.over_limit = False
        """Past ``max_connections``: its first request is answered 429 and it is closed."""
        self.reading_headers = False
        self.idle = False
        """Between requests: the next byte starts a request's headers."""
        self.header_bytes = 0
        self._tail = b""
        self._deadline: asyncio.TimerHandle | None = None
        self._attached = False
        """The handler saw ``connection_made`` and waits for ``connection_lost``."""
        self._refused = False
        self._counted = False

    # -- protocol callbacks ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        guard = self.guard
        guard.open += 1
        self._counted = True
        guard.metrics.connections.set(guard.open)
        if guard.open > 2 * guard.limits.max_connections:
            guard.metrics.rejected.labels(limit="connections").inc()
            self._refused = True
            transport.abort()
            return
        self.over_limit = guard.open > guard.limits.max_connections
        self._attached = True
        self.handler.connection_made(transport)
        self._start_headers()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if (self.reading_headers or self.idle) and not self._count_headers(data):
            return
        self.handler.data_received(data)

    def eof_received(self) -> bool | None:
        if self._refused:
            return None
        return self.handler.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._headers_done()
        if self._counted:
            self._counted = False
            self.guard.open -= 1
            self.guard.metrics.connections.set(self.guard.open)
        if self._attached:
            self._attached = False
            self.handler.connection_lost(exc)
        self.transport = None

    def pause_writing(self) -> None:
        self.handler.pause_writing()

    def resume_writing(self) -> None:
        self.handler.resume_writing()

    # -- requests ----------------------------------------------------------------------------

    def request_started(self) -> None:
        """A request's handler runs: its headers are in."""
        self._headers_done()

    def request_finished(self) -> None:
        """The handler ended: the next byte starts another request's headers."""
        self._headers_done()
        self.idle = True

    def _start_headers(self) -> None:
        self._headers_done()
        self.idle = False
        self.reading_headers = True
        loop = asyncio.get_running_loop()
        self._deadline = loop.call_later(self.guard.limits.header_timeout, self._headers_late)

    def _headers_done(self) -> None:
        self.reading_headers = False
        self.guard.buffered -= self.header_bytes
        self.header_bytes = 0
        self._tail = b""
        self._disarm()

    def _count_headers(self, data: bytes) -> bool:
        """Count header bytes; False when they are over the limit (the connection is refused)."""
        if self.idle:
            self._start_headers()
        counted = len(data)
        if not self._tail:  # before the request line: empty lines are skipped (RFC 9112 §2.2)
            data = data.lstrip(b"\r\n")
        end = headers_end(self._tail + data) if data else -1
        if end >= 0:  # what follows the headers (a body, a pipelined request) is not theirs
            counted -= len(self._tail) + len(data) - end
        self.header_bytes += counted
        guard = self.guard
        guard.buffered += counted
        limits = guard.limits
        if self.header_bytes > limits.max_header_bytes + HEADER_SLACK or (
            guard.buffered > limits.header_budget and self.header_bytes > HEADER_SHARE
        ):
            self._refuse_headers()
            return False
        if end >= 0:
            self._headers_done()
        elif data:
            self._tail = (self._tail + data)[-3:]  # never empty once the request line began
        return True

    # -- deadlines ---------------------------------------------------------------------------

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_late(self) -> None:
        self._deadline = None
        if not self.reading_headers or self.transport is None:
            return
        self.guard.metrics.client_errors.labels(reason="header_timeout").inc()
        logger.debug("client error: header_timeout")
        self.transport.abort()

    def _refuse_headers(self) -> None:
        self._headers_done()
        self._refused = True
        self.guard.metrics.client_errors.labels(reason="header_too_large").inc()
        logger.debug("client error: header_too_large")
        assert self.transport is not None
        self.transport.write(HEADER_TOO_LARGE)
        self.transport.close()


def guarded(request: web.BaseRequest) -> GuardedConnection | None:
    transport = request.transport
    protocol = transport.get_protocol() if transport is not None else None
    return protocol if isinstance(protocol, GuardedConnection) else None


@web.middleware
async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Tell the connection that a request's headers are in (its header deadline stops) and
    when its handler ended; a connection over the limit gets 429 and is closed."""
    connection = guarded(request)
    if connection is None:
        return await handler(request)
    connection.request_started()
    try:
        if connection.over_limit:
            connection.guard.metrics.rejected.labels(limit="connections").inc()
            response = too_many_requests()
            response.force_close()
            return response
        return await handler(request)
    finally:
        connection.request_finished()


class GuardedSite(web.BaseSite):
    """``web.TCPSite`` whose connections are :class:`GuardedConnection` s (over TLS with
    ``ssl_context``: the guard then sees the decrypted stream)."""

    def __init__(
        self,
        runner: web.BaseRunner,
        *,
        host: str,
        port: int,
        guard: ConnectionGuard,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self._host = host
        self._port = port
        self.guard = guard

    @property
    def name(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        guard = self.guard
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: GuardedConnection(server(), guard),
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=True,
            start_serving=False,
        )
        if hasattr(socket, "TCP_NOTSENT_LOWAT"):  # Linux; elsewhere the system's default
            for listener in self._server.sockets:  # accepted connections inherit it
                listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, UNSENT_LOW_WATER)
        await self._server.start_serving()

    @property
    def port(self) -> int:
        """The port listened on (the one chosen, when started with port 0)."""
        assert isinstance(self._server, asyncio.Server)
        return int(self._server.sockets[0].getsockname()[1])


async def serve(
    app: web.Application,
    *,
    address: tuple[str, int],
    limits: Limits,
    metrics: Metrics,
    shutdown_timeout: float,
    ssl_context: ssl.SSLContext | None = None,
) -> tuple[web.AppRunner, GuardedSite]:
    """Serve ``app`` on ``address`` as warmwatch serves its listeners: connections bounded
    (:class:`GuardedSite`; ``app`` has :func:`middleware` first), header sizes the
    apiserver's, idle keep-alive connections closed after ``idle_timeout``, and aiohttp's
    reports about bad clients sent to :class:`ClientErrorLog`."""
    header_bytes = limits.max_header_bytes + HEADER_SLACK
    runner = web.AppRunner(
        app,
        shutdown_timeout=shutdown_timeout,
        handle_signals=False,
        access_log=None,
        logger=ClientErrorLog(metrics=metrics),
        keepalive_timeout=limits.idle_timeout,
        max_line_size=header_bytes,
        max_field_size=header_bytes,
    )
    await runner.setup()
    guard = ConnectionGuard(limits=limits, metrics=metrics)
    site = GuardedSite(
        runner, host=address[0], port=address[1], guard=guard, ssl_context=ssl_context
    )
    await site.start()
    return runner, site
