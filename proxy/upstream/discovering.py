"""Discovery documents (``/api``, ``/apis``, ``/version``, ``/openapi/...``): kept, so a
controller can start while the apiserver is unreachable, and answered from warmwatch's copy
while the apiserver confirmed that copy recently (docs/design.md §5).

The rule a client sees (written in the README too):

- A document the apiserver confirmed within ``DiscoverySettings.max_age`` is answered from the
  copy, with no round trip: a warm restart of a controller does not wait on the upstream link
  for its discovery. A background task (``keep_confirmed``) re-asks the apiserver for every
  kept document well within that age, conditionally (``If-None-Match``) where the document has
  an ETag, so the copies stay confirmed while clients are quiet.
- Otherwise (never asked, not confirmed lately, too large to keep confirmed) the request is
  passed through and its 200 answer stored and confirmed.
- A write through warmwatch to CustomResourceDefinitions or APIServices changes what discovery
  says: for ``DiscoverySettings.quiet_after_change`` afterwards every discovery request is
  passed through, so a controller that installs its CRD and then looks it up sees it as soon as
  the apiserver does. A CRD installed by someone else appears at most ``max_age`` late.
- While the apiserver cannot be reached the stored document is answered, however old.

The plain health checks (``/healthz``, ``/livez``, ``/readyz``, no query: what controllers
poll before they start) follow the same rule, so a warm restart makes no round trip for them
either: a ``200 ok`` the apiserver gave within ``max_age`` is answered again, and kept
confirmed. Any other answer is not kept (the next check is passed through and sees it), and
while the apiserver cannot be reached the caller's own answer (``proxy.serve.health``)
stands, never a stored one.
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Final, Protocol, TypeAlias

from aiohttp import web

from proxy.kube.status import StatusError
from proxy.upstream.connecting import Credentials, Upstream
from proxy.upstream.errors import UpstreamUnavailable
from proxy.upstream.forwarding import (
    Collector,
    Offline,
    PassthroughSettings,
    count,
    forward,
    forwarded_request_headers,
    forwarded_response_headers,
    status_response,
    unavailable,
)
from proxy.upstream.resilience import BreakerState, CircuitBreaker

logger = logging.getLogger(__name__)

#: Response headers of a cached discovery document that describe that one answer, not the
#: document: they are not stored.
_NOT_CACHED: Final = frozenset(
    {"content-length", "date", "audit-id", "set-cookie", "content-encoding"}
)

#: Headers a 304 answer repeats (RFC 9110 §15.4.5).
_NOT_MODIFIED_HEADERS: Final = frozenset(
    {"etag", "cache-control", "vary", "expires", "content-location"}
)


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


Admit: TypeAlias = Callable[[web.BaseRequest], Awaitable[None]]
"""Whether a request may be answered: returns, or raises the StatusError to answer."""


class DiscoveryCache(Protocol):
    """Where discovery documents are kept (SQLite in proxy.cache; in memory in tests)."""

    async def get(self, key: str) -> CachedDocument | None: ...

    async def put(self, key: str, doc: CachedDocument) -> None: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class DiscoverySettings:
    max_age: float = 10.0
    """A copy confirmed by the apiserver within this many seconds is answered without asking
    it. 10 s is the TTL of the apiserver's own delegating authn/authz caches: a new CRD or
    aggregated API made by someone else reaches clients at most this much later than through
    the apiserver, and client-go re-reads discovery when it misses a kind anyway. 0 turns
    answering from copies off (they are still kept for an offline start)."""

    quiet_after_change: float = 60.0
    """After a write to CRDs or APIServices through warmwatch, discovery is passed through for
    this long: a CRD becomes Established, and the apiserver's aggregated discovery shows it,
    within seconds of its creation."""

    keep_for: float = 7 * 24 * 3600.0
    """Copies some client asked for within this window are kept confirmed in the background;
    a controller restarted after a longer quiet has its first discovery passed through."""

    keep_max_bytes: int = 2 * 2**20
    """Copies larger than this without an ETag are not kept confirmed (re-reading them every
    few seconds would cost the link more than it saves); they are passed through each time.
    Documents with an ETag are revalidated with a 304 of a few bytes, whatever their size."""

    concurrency: int = 4
    """Revalidations in flight at once."""


@dataclass(slots=True)
class _Copy:
    document: CachedDocument | None
    """None until it was read from the store (kept from an earlier run)."""
    confirmed_at: float = -float("inf")
    asked_at: float = 0.0
    revalidating: bool = False


@dataclass(kw_only=True)
class DiscoveryCopies:
    """Which discovery documents may be answered from warmwatch's copy (the module's rule).

    Synchronous bookkeeping with an injectable clock; the I/O is in :func:`serve_discovery`
    and :func:`keep_confirmed`.
    """

    settings: DiscoverySettings = field(default_factory=DiscoverySettings)
    clock: Callable[[], float] = time.monotonic
    _copies: dict[str, _Copy] = field(default_factory=dict)
    _quiet_until: float = -float("inf")

    def answer(self, key: str) -> CachedDocument | None:
        """The copy to answer ``key`` with, if it is confirmed recently enough."""
        now = self.clock()
        copy = self._copies.get(key)
        if copy is None or copy.document is None or now < self._quiet_until:
            if copy is not None:
                copy.asked_at = now
            return None
        copy.asked_at = now
        if now - copy.confirmed_at > self.settings.max_age:
            return None
        return copy.document

    def confirmed(self, key: str, document: CachedDocument) -> None:
        """The apiserver just answered ``key`` with ``document`` (200, or 304 to its ETag)."""
        now = self.clock()
        copy = self._copies.setdefault(key, _Copy(document=document, asked_at=now))
        copy.document = document
        copy.confirmed_at = now

    def asked(self, key: str) -> None:
        """``key`` was asked and passed through, with no document to keep (not a 200)."""
        copy = self._copies.get(key)
        if copy is not None:
            copy.asked_at = self.clock()

    def forget(self, key: str) -> None:
        self._copies.pop(key, None)

    def remember(self, keys: Iterable[str]) -> None:
        """Keys stored by an earlier run: kept confirmed from now on (their documents are
        read from the store by the first revalidation)."""
        now = self.clock()
        for key in keys:
            self._copies.setdefault(key, _Copy(document=None, asked_at=now))

    def api_changed(self) -> None:
        """A write changed which APIs are served (:func:`changes_discovery`)."""
        self._quiet_until = self.clock() + self.settings.quiet_after_change

    def due(self) -> list[tuple[str, CachedDocument | None]]:
        """Copies to revalidate now: asked within ``keep_for``, confirmed more than half of
        ``max_age`` ago, not too large without an ETag, not being revalidated already.
        Copies nobody asked for within ``keep_for`` are dropped."""
        now = self.clock()
        settings = self.settings
        due: list[tuple[str, CachedDocument | None]] = []
        for key, copy in list(self._copies.items()):
            if now - copy.asked_at > settings.keep_for:
                del self._copies[key]
                continue
            document = copy.document
            if copy.revalidating or now - copy.confirmed_at <= settings.max_age / 2:
                continue
            large = document is not None and len(document.body) > settings.keep_max_bytes
            if large and document is not None and document.etag is None:
                continue
            due.append((key, document))
        return due

    def revalidating(self, key: str, *, busy: bool) -> None:
        copy = self._copies.get(key)
        if copy is not None:
            copy.revalidating = busy


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


def is_plain_health_check(path: str, query: str) -> bool:
    """``/healthz``, ``/livez`` or ``/readyz`` without a query (``?verbose``, named checks
    and ``?exclude=`` are always passed through)."""
    return path in ("/healthz", "/livez", "/readyz") and not query


def discovery_key(*, path: str, query: Iterable[tuple[str, str]], accept: str) -> str:
    """``path?sorted-query|Accept``: the answer depends on exactly these (aggregated
    discovery and the openapi documents are negotiated by Accept)."""
    encoded = urllib.parse.urlencode(sorted(query), quote_via=urllib.parse.quote)
    return f"{path}?{encoded}|{accept}"


def parse_discovery_key(key: str) -> tuple[str, str]:
    """``(path?query, Accept)`` of a :func:`discovery_key`: what to ask the apiserver to
    revalidate it."""
    target, _, accept = key.partition("|")
    return target.removesuffix("?"), accept


def changes_discovery(path: str) -> bool:
    """A write to this path changes what discovery says: CustomResourceDefinitions and
    APIServices (and their status, which makes them Established / Available)."""
    return path.startswith(
        (
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            "/apis/apiregistration.k8s.io/v1/apiservices",
        )
    )


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


# ------------------------------------------------------------------------- discovery


async def serve_discovery(
    request: web.Request,
    *,
    upstream: Upstream,
    credentials: Credentials,
    cache: DiscoveryCache,
    breaker: CircuitBreaker | None,
    settings: PassthroughSettings,
    copies: DiscoveryCopies | None = None,
    admit_offline: Admit | None = None,
    offline: Offline | None = None,
) -> web.StreamResponse:
    """Answer a discovery GET (or a plain health check) from a confirmed copy (``copies``, see
    the module docstring), or forward it (with the client's If-None-Match) and store a 200
    answer. When the apiserver cannot be reached: ``offline``'s answer if given, else the
    stored document."""
    key = discovery_key(
        path=request.path,
        query=request.query.items(),
        accept=", ".join(request.headers.getall("Accept", [])),
    )
    if copies is not None and copies.settings.max_age > 0:
        copy = copies.answer(key)
        if copy is not None:
            upstream.metrics.discovery_answers.labels(source="copy").inc()
            return _serve_cached(request, copy)
    headers = forwarded_request_headers(request)
    # Ask for the identity encoding, so the stored document suits every later client.
    headers.popall("Accept-Encoding", None)
    collector = Collector(limit=settings.discovery_max_bytes)
    try:
        response = await forward(
            request,
            upstream=upstream,
            credentials=credentials,
            breaker=breaker,
            settings=settings,
            purpose="discovery",
            headers=headers,
            collector=collector,
        )
    except UpstreamUnavailable as error:
        if offline is not None:
            count(upstream, "GET", "error")
            return await offline(request, error)
        document = await _cached(cache, key)
        if document is None:
            count(upstream, "GET", "error")
            return unavailable(error)
        if admit_offline is not None:
            try:
                await admit_offline(request)
            except StatusError as refused:
                count(upstream, "GET", refused.code)
                return status_response(refused)
        logger.info("apiserver unreachable (%s); serving %s from the discovery cache", error, key)
        upstream.metrics.discovery_answers.labels(source="stored").inc()
        cached = _serve_cached(request, document)
        count(upstream, "GET", cached.status)
        return cached
    upstream.metrics.discovery_answers.labels(source="apiserver").inc()
    if collector.complete and collector.status == 200:
        document = _document(collector.headers, collector.body)
        await _store(cache, key, document)
        if copies is not None:
            copies.confirmed(key, document)
    elif copies is not None:
        copies.asked(key)
    return response


def _document(headers: Iterable[tuple[str, str]], body: bytes) -> CachedDocument:
    kept = tuple((k, v) for k, v in headers if k.lower() not in _NOT_CACHED)
    etag = next((v for k, v in kept if k.lower() == "etag"), None)
    return CachedDocument(status=200, headers=kept, body=body, etag=etag)


async def _store(cache: DiscoveryCache, key: str, document: CachedDocument) -> None:
    try:
        await cache.put(key, document)
    except Exception:  # the client has its answer; a cache failure must not matter
        logger.exception("Cannot store discovery document %s", key)


# ------------------------------------------------------------------------- keeping copies


async def keep_confirmed(
    copies: DiscoveryCopies,
    *,
    upstream: Upstream,
    cache: DiscoveryCache,
    breaker: CircuitBreaker | None,
    settings: PassthroughSettings,
) -> None:
    """Revalidate due copies (``DiscoveryCopies.due``) with warmwatch's own credentials until
    cancelled. Does nothing while answering from copies is off or the breaker is open: copies
    then go unconfirmed and requests are passed through (or answered from the store)."""
    period = max(copies.settings.max_age / 4, 0.25)
    gate = asyncio.Semaphore(copies.settings.concurrency)

    async def one(key: str, document: CachedDocument | None) -> None:
        async with gate:
            copies.revalidating(key, busy=True)
            try:
                await revalidate(
                    copies, key, document, upstream=upstream, cache=cache, settings=settings
                )
            except UpstreamUnavailable as error:
                logger.debug("Revalidating discovery %s: %s", key, error)
                upstream.metrics.discovery_revalidations.labels(result="error").inc()
            finally:
                copies.revalidating(key, busy=False)

    while True:
        await asyncio.sleep(period)
        if copies.settings.max_age <= 0:
            continue
        if breaker is not None and breaker.state is BreakerState.OPEN:
            continue
        due = copies.due()
        if due:
            await asyncio.gather(*(one(key, document) for key, document in due))


async def revalidate(
    copies: DiscoveryCopies,
    key: str,
    document: CachedDocument | None,
    *,
    upstream: Upstream,
    cache: DiscoveryCache,
    settings: PassthroughSettings,
) -> None:
    """Ask the apiserver for ``key`` again (conditionally when the copy has an ETag): the
    same answer confirms the copy, a new one replaces it (in the store too), anything but
    200/304 forgets it, so the next client request is passed through and gets that answer."""
    if document is None:
        document = await _cached(cache, key)
    target, accept = parse_discovery_key(key)
    headers = {"Accept": accept} if accept else {}
    if document is not None and document.etag:
        headers["If-None-Match"] = document.etag
    metric = upstream.metrics.discovery_revalidations
    async with upstream.request(
        "GET",
        target,
        headers=headers,
        timeout=settings.idle_timeout,
        stream=True,
        purpose="discovery",
    ) as response:
        if response.status == 304 and document is not None:
            copies.confirmed(key, document)
            metric.labels(result="unchanged").inc()
            return
        if response.status != 200:
            copies.forget(key)
            metric.labels(result="gone").inc()
            return
        body = bytearray()
        async for chunk in response.content.iter_any():
            body += chunk
            if len(body) > settings.discovery_max_bytes:
                copies.forget(key)
                metric.labels(result="too large").inc()
                return
        fresh = _document(forwarded_response_headers(response.headers), bytes(body))
    if document is not None and fresh.body == document.body:
        copies.confirmed(key, document)
        metric.labels(result="unchanged").inc()
        return
    await _store(cache, key, fresh)
    copies.confirmed(key, fresh)
    metric.labels(result="changed").inc()


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
