"""Discovery documents (``/api``, ``/apis``, ``/version``, ``/openapi/...``): passed through
and kept, so a controller can start while the apiserver is unreachable."""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Protocol

from aiohttp import web

from proxy.upstream.connecting import Credentials, Upstream
from proxy.upstream.errors import UpstreamUnavailable
from proxy.upstream.forwarding import (
    Collector,
    PassthroughSettings,
    count,
    forward,
    forwarded_request_headers,
    unavailable,
)
from proxy.upstream.resilience import CircuitBreaker

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


# ------------------------------------------------------------------------- discovery


async def serve_discovery(
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
            headers=headers,
            collector=collector,
        )
    except UpstreamUnavailable as error:
        document = await _cached(cache, key)
        if document is None:
            count(upstream, "GET", "error")
            return unavailable(error)
        logger.info("apiserver unreachable (%s); serving %s from the discovery cache", error, key)
        cached = _serve_cached(request, document)
        count(upstream, "GET", cached.status)
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
