"""Discovery documents and plain health checks answered to clients: from a copy the apiserver
confirmed lately, else passed through and kept, and from the stored copy, however old, while
the apiserver cannot be reached. The rule, and which copy answers which request, is
``proxy.upstream.discovering``'s (docs/design.md §5), which keeps the copies confirmed.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Final, TypeAlias

from aiohttp import web

from proxy.kube.status import StatusError
from proxy.serve.answers import status_response, unavailable
from proxy.serve.relaying import Collector, Offline, RelaySettings, relay
from proxy.upstream.connecting import Credentials, Upstream
from proxy.upstream.discovering import (
    CachedDocument,
    DiscoveryCache,
    DiscoveryCopies,
    discovery_key,
    document_of,
    keep,
    stored_document,
)
from proxy.upstream.errors import UpstreamUnavailable
from proxy.upstream.forwarding import count, forwarded_request_headers
from proxy.upstream.resilience import CircuitBreaker

logger = logging.getLogger(__name__)

#: Headers a 304 answer repeats (RFC 9110 §15.4.5).
_NOT_MODIFIED_HEADERS: Final = frozenset(
    {"etag", "cache-control", "vary", "expires", "content-location"}
)

Admit: TypeAlias = Callable[[web.BaseRequest], Awaitable[None]]
"""Whether a request may be answered: returns, or raises the StatusError to answer."""


def request_key(request: web.BaseRequest) -> str | None:
    """:func:`discovery_key` of a GET."""
    return discovery_key(
        path=request.path,
        query=request.rel_url.raw_query_string,
        accept=", ".join(request.headers.getall("Accept", [])),
        user_agent=request.headers.get("User-Agent", ""),
    )


async def serve_discovery(
    request: web.Request,
    *,
    key: str,
    upstream: Upstream,
    credentials: Credentials,
    cache: DiscoveryCache,
    copies: DiscoveryCopies,
    breaker: CircuitBreaker | None,
    settings: RelaySettings,
    admit_offline: Admit | None = None,
    offline: Offline | None = None,
) -> web.StreamResponse:
    """Answer a discovery GET (or a plain health check) whose copy is ``key`` from a
    confirmed copy (see ``proxy.upstream.discovering``), or forward it (with the client's
    If-None-Match) and keep a 200 answer. When the apiserver cannot be reached:
    ``offline``'s answer if given, else the stored document."""
    if copies.settings.answering:
        copy = copies.answer(key)
        if copy is not None:
            upstream.metrics.discovery_answers.labels(source="copy").inc()
            return _serve_cached(request, copy)
    headers = forwarded_request_headers(request.headers)
    # Ask for the identity encoding, so the stored document suits every later client.
    headers.popall("Accept-Encoding", None)
    collector = Collector(limit=settings.upstream.discovery_max_bytes)
    try:
        response = await relay(
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
        return await _serve_stored(
            request,
            key,
            error,
            upstream=upstream,
            cache=cache,
            copies=copies,
            admit=admit_offline,
        )
    upstream.metrics.discovery_answers.labels(source="apiserver").inc()
    if collector.complete and collector.status == 200:
        await keep(copies, cache, key, document_of(collector.headers, collector.body))
    else:
        copies.asked(key)
    return response


async def _serve_stored(
    request: web.Request,
    key: str,
    error: UpstreamUnavailable,
    *,
    upstream: Upstream,
    cache: DiscoveryCache,
    copies: DiscoveryCopies,
    admit: Admit | None,
) -> web.StreamResponse:
    """The apiserver is unreachable: the stored document, however old, to an admitted
    client; else the 503 (or the admission's refusal). Without a copy for the client's own
    ``Accept``, a copy asked with another one whose media type the client accepts serves
    too (a typed client-go controller asks for protobuf first and accepts JSON: it starts
    from what a JSON client of the same pod stored)."""
    document = await stored_document(cache, key)
    if document is None:
        document = await _acceptable_variant(request, key, cache=cache, copies=copies)
    if document is None:
        count(upstream, "GET", "error")
        return unavailable(error)
    if admit is not None:
        try:
            await admit(request)
        except StatusError as refused:
            count(upstream, "GET", refused.code)
            return status_response(refused)
    logger.info("apiserver unreachable (%s); serving %s from the discovery cache", error, key)
    upstream.metrics.discovery_answers.labels(source="stored").inc()
    cached = _serve_cached(request, document)
    count(upstream, "GET", cached.status)
    return cached


async def _acceptable_variant(
    request: web.BaseRequest, key: str, *, cache: DiscoveryCache, copies: DiscoveryCopies
) -> CachedDocument | None:
    """The first stored variant of ``key``'s document whose media type matches one of the
    request's ``Accept`` ranges, taken in the client's order."""
    stored = [
        d for d in [await stored_document(cache, k) for k in copies.variants(key)] if d is not None
    ]
    for media_range in ", ".join(request.headers.getall("Accept", [])).split(","):
        wanted = _media_type(media_range)
        for document in stored:
            content_type = next((v for k, v in document.headers if k.lower() == "content-type"), "")
            if _matches(wanted, _media_type(content_type)):
                return document
    return None


def _media_type(text: str) -> tuple[str, dict[str, str]]:
    """A media type and its parameters (lower-cased names), e.g. ``application/json;g=...``."""
    kind, *parameters = text.split(";")
    pairs = (p.partition("=") for p in parameters)
    return kind.strip().lower(), {n.strip().lower(): v.strip().strip('"') for n, _, v in pairs}


def _matches(wanted: tuple[str, dict[str, str]], offered: tuple[str, dict[str, str]]) -> bool:
    """``offered`` (a stored answer's type) satisfies the range ``wanted``: the same type (or
    a wildcard), and the same ``g``, ``v`` and ``as`` (aggregated discovery is a
    transformation: a range without them wants the plain document, and gets no other)."""
    kind, parameters = wanted
    if kind not in ("*/*", offered[0]) and kind != offered[0].split("/")[0] + "/*":
        return False
    return all(offered[1].get(name) == parameters.get(name) for name in ("g", "v", "as"))


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
