"""Bounds on what clients may hold: watches, cache snapshots (docs/design.md §9).

A client over a limit gets what the apiserver's max-in-flight filter answers
(``k8s.io/apiserver/pkg/server/filters/maxinflight.go``): 429 with ``Retry-After: 1`` and the
plain-text body ``Too many requests, please try again later.`` (Go's ``http.Error``, not a
Status). client-go retries a 429 with ``Retry-After`` by itself (up to 10 times), so a
controller that briefly meets a limit only waits.

A *client* is its remote address and a hash of its ``Authorization`` header: on a loopback
listener every process has the same address, and the token tells them apart. The hash is never
logged.

Connections and the time and size of request headers are bounded below HTTP
(``serve.connections``).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Final

from aiohttp import web

from proxy.kube import options
from proxy.kube.gocompat import parse_query
from proxy.kube.options import parse_bool
from proxy.kube.resources import RequestPath

RETRY_AFTER: Final = "1"
"""maxinflight.go's ``retryAfter``."""

TOO_MANY_REQUESTS: Final = "Too many requests, please try again later.\n"
"""maxinflight.go's message, with the newline Go's ``http.Error`` adds."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Limits:
    """``--max-*`` and ``--header-*`` flags. Each default leaves a real controller far from the
    limit and bounds what a hostile or broken local client can pin."""

    max_connections: int = 2048
    """Open client connections. warmwatch speaks HTTP/1.1, so each watch is a connection:
    this must exceed ``max_watches`` plus the requests in flight. An idle connection costs
    tens of KiB. Over it, a connection gets 429 to its first request and is closed; over
    twice the limit it is closed at once, unread."""
    max_watches: int = 1024
    """Watches and other long-running requests at once (cached and passed through; followed
    logs, exec, attach, port-forward and proxy count as watches, as in the apiserver's
    long-running check). kube-controller-manager, which watches every resource type for its
    garbage collector and quota, needs a watch or two per resource type: about 60 on a bare
    cluster, 200-odd with 150 CRDs; a controller-runtime manager a few dozen. Each passed-through
    one holds an upstream connection (``upstream.connecting.ConnectionBudget``)."""
    max_client_watches: int = 512
    """Watches of one client (address and credentials): half the total, so one runaway client
    cannot take every slot while a well-behaved one still gets its few."""
    max_requests: int = 256
    """Short requests passed through to the apiserver at once (everything but watches and
    long-running requests: writes, GETs, discovery, uncached LISTs). Each holds an upstream
    connection until its answer is read. A controller has a handful in flight (client-go's
    default QPS is 5, kube-controller-manager's 20); the apiserver's own default in-flight
    limits are 400 reads and 200 writes for the whole cluster."""
    max_client_requests: int = 128
    """Short passed-through requests of one client: half the total, as for watches."""
    max_list_streams: int = 16
    """Cache snapshots streamed at once (LISTs and the initial state of watches from RV unset
    or "0"). Each holds a SQLite reader and its read transaction until the client has read the
    answer (at most ``--watch-write-timeout`` when it stops reading); the cache keeps this many
    readers plus 4 for short reads, so a watch resume or a quick LIST never waits behind
    clients that stopped reading."""
    list_stream_wait: float = 5.0
    """How long a LIST or initial state waits for a free snapshot slot before its 429. A
    controller starts its informers all at once (kube-controller-manager about 60): most
    collections are small and their slots come free within milliseconds, so the burst queues,
    as the apiserver's priority and fairness queues requests, instead of being sent away for
    client-go's one-second retry. Only slots held for longer — by clients that stopped
    reading — turn requests away."""
    header_timeout: float = 32.0
    """Seconds a connection may take to send a request's headers (slowloris). The
    kube-apiserver's ``ReadHeaderTimeout`` (32 s, "just shy of requestTimeoutUpperBound")."""
    idle_timeout: float = 90.0
    """Seconds an idle keep-alive connection is kept: the kube-apiserver's ``IdleTimeout``
    (90 s, which matches Go's ``http.DefaultTransport`` keep-alive)."""
    max_header_bytes: int = 1 << 20
    """Bytes of a request line and headers together: the kube-apiserver's ``MaxHeaderBytes``
    (1 MiB; Go allows 4 KiB more). Over it: 431, as Go's server answers."""
    header_budget: int = 64 << 20
    """Header bytes of requests still being received, all connections together: aiohttp
    holds them until the headers are complete, so ``max_connections`` clients each sending
    nearly ``max_header_bytes`` could pin gigabytes. Past this budget a connection whose
    headers exceed 64 KiB is refused (431); smaller ones, every real request, go on."""

    def __post_init__(self) -> None:
        for name in (
            "max_connections",
            "max_watches",
            "max_client_watches",
            "max_requests",
            "max_client_requests",
            "max_list_streams",
            "header_timeout",
            "idle_timeout",
            "max_header_bytes",
            "header_budget",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive")


class LimitReached(Exception):
    """A request over a limit; ``limit`` names it (a ``warmwatch_rejected_total`` label)."""

    def __init__(self, limit: str) -> None:
        super().__init__(limit)
        self.limit = limit


def too_many_requests() -> web.Response:
    """The answer over a limit, as maxinflight.go's ``tooManyRequests`` writes it."""
    response = web.Response(status=429, text=TOO_MANY_REQUESTS)
    response.headers["Content-Type"] = "text/plain; charset=utf-8"
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Retry-After"] = RETRY_AFTER
    return response


def client_of(request: web.BaseRequest) -> str:
    """The client a request counts against: remote address and a hash of its credentials."""
    credentials = request.headers.get("Authorization", "")
    digest = hashlib.sha256(credentials.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return f"{request.remote or ''}|{digest}"


def is_long_running(request: web.BaseRequest) -> bool:
    """A request that holds a watch slot: a watch, or what the apiserver's long-running check
    names (followed logs, exec, attach, port-forward, proxy)."""
    long_running = options.is_long_running(request.path, request.query)
    return (request.method == "GET" and is_watch(request)) or long_running


def is_watch(request: web.BaseRequest) -> bool:
    """A watch as the apiserver decides it: ``watch`` true in the query (Go's decoding), or
    the deprecated ``/watch/`` path prefix."""
    path = RequestPath.parse(request.path)
    if path is not None and path.watch_prefix:
        return True
    values = [v for k, v in parse_query(request.raw_path.partition("?")[2]) if k == "watch"]
    return bool(values) and parse_bool(values[0])


class Admission:
    """Counts what is held and refuses what is over a limit. Synchronous: each acquire and
    release happens on the event loop's one thread."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.watches = 0
        self.client_watches: Counter[str] = Counter()
        self.requests = 0
        self.client_requests: Counter[str] = Counter()
        self.list_streams = 0
        self._stream_slots = asyncio.Semaphore(limits.max_list_streams)

    @contextmanager
    def watch(self, client: str) -> Iterator[None]:
        """Hold a watch slot for ``client``; :class:`LimitReached` when none is free."""
        if self.watches >= self.limits.max_watches:
            raise LimitReached("watches")
        if self.client_watches[client] >= self.limits.max_client_watches:
            raise LimitReached("client_watches")
        self.watches += 1
        self.client_watches[client] += 1
        try:
            yield
        finally:
            self.watches -= 1
            _release(self.client_watches, client)

    @contextmanager
    def request(self, client: str) -> Iterator[None]:
        """Hold a slot of a short passed-through request for ``client``; :class:`LimitReached`
        when none is free."""
        if self.requests >= self.limits.max_requests:
            raise LimitReached("requests")
        if self.client_requests[client] >= self.limits.max_client_requests:
            raise LimitReached("client_requests")
        self.requests += 1
        self.client_requests[client] += 1
        try:
            yield
        finally:
            self.requests -= 1
            _release(self.client_requests, client)

    @asynccontextmanager
    async def list_stream(self) -> AsyncIterator[None]:
        """Hold one of the cache snapshots streamed at once, waiting for one at most
        ``list_stream_wait``; :class:`LimitReached` when none came free (FIFO: the
        semaphore's waiters are served in order)."""
        try:
            async with asyncio.timeout(self.limits.list_stream_wait):
                await self._stream_slots.acquire()
        except TimeoutError:
            raise LimitReached("list_streams") from None
        self.list_streams += 1
        try:
            yield
        finally:
            self.list_streams -= 1
            self._stream_slots.release()


def _release(held: Counter[str], client: str) -> None:
    held[client] -= 1
    if not held[client]:
        del held[client]
