"""Passthrough: every request the cache does not serve goes to the apiserver unchanged.

Bodies stream both ways without buffering (a ``watch`` or ``logs -f`` passes through as it
arrives), method, path, query and end-to-end headers are kept (``forwarding``), WebSocket
upgrades (exec, attach, port-forward) are relayed frame by frame (``relaying``), and discovery
documents are cached so a controller can start while the apiserver is unreachable, and
answered from copies the apiserver confirmed lately, as are plain health checks
(``discovering``). This module dispatches a request to them.

- While the apiserver cannot be reached, the answer is a 503 with ``Retry-After: 1`` at once
  (see ``forwarding``); a caller may give its own ``offline`` answer instead (the health
  endpoints and single-object GETs do).
- Only WebSocket upgrades are relayed. SPDY/3.1 upgrades (kubectl before 1.30/1.31) are
  answered 400; current kubectl negotiates WebSocket first. Other upgrades (curl's ``h2c``)
  are ignored and the request proceeds as HTTP/1.1.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final, TypeAlias

from aiohttp import web
from multidict import CIMultiDict

from proxy.kube.resources import RequestPath
from proxy.kube.status import StatusError
from proxy.upstream.connecting import Credentials, Upstream
from proxy.upstream.discovering import (
    Admit,
    CachedDocument,
    DiscoveryCache,
    DiscoveryCopies,
    changes_discovery,
    discovery_key,
    request_key,
    serve_discovery,
)
from proxy.upstream.errors import UpstreamAuthError, UpstreamUnavailable
from proxy.upstream.forwarding import (
    Collector,
    Offline,
    PassthroughSettings,
    count,
    forward,
    is_long_running,
    status_response,
    unavailable,
)
from proxy.upstream.relaying import relay_websocket
from proxy.upstream.resilience import CircuitBreaker

__all__ = [
    "CachedDocument",
    "DiscoveryCache",
    "DiscoveryCopies",
    "Offline",
    "PassthroughSettings",
    "WriteObserver",
    "discovery_key",
    "is_long_running",
    "pass_through",
    "status_response",
    "unavailable",
]

logger = logging.getLogger(__name__)

WriteObserver: TypeAlias = Callable[[web.BaseRequest, CIMultiDict[str], bytes], None]
"""Told of each successful write (POST, PUT, PATCH, DELETE answered 2xx) once its answer was
passed on whole: the request, the answer's headers and its body as sent (still encoded when
it has a Content-Encoding)."""

_WRITE_METHODS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})


# ------------------------------------------------------------------------- the handler


async def pass_through(
    request: web.Request,
    *,
    upstream: Upstream,
    credentials: Credentials,
    discovery: DiscoveryCache | None = None,
    copies: DiscoveryCopies | None = None,
    discovery_offline: Admit | None = None,
    breaker: CircuitBreaker | None = None,
    offline: Offline | None = None,
    observe: WriteObserver | None = None,
    settings: PassthroughSettings | None = None,
) -> web.StreamResponse:
    """Answer ``request`` with the apiserver's answer (see the module docstring).

    ``discovery``: where discovery GETs are stored and, when the apiserver is unreachable,
    served from, with ``copies``, the account of what is stored (within its bounds) and may
    be answered without asking the apiserver (``discovering``); without both discovery is
    passed through like any request. ``discovery_offline``: who
    may be answered a stored document while the apiserver is unreachable (None: anyone).
    ``breaker``: while it is open, the apiserver counts as
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
            copies=copies,
            discovery_offline=discovery_offline,
            breaker=breaker,
            offline=offline,
            observe=observe,
            settings=settings,
        )
    except UpstreamAuthError as error:
        # The sidecar's own credentials failed to load or refresh: not the apiserver's
        # answer, and not something the client can fix.
        logger.error("Passthrough %s %s: %s", request.method, request.path, error)
        count(upstream, request.method.upper(), "error")
        return status_response(StatusError.internal_error(error))


async def _dispatch(
    request: web.Request,
    *,
    upstream: Upstream,
    credentials: Credentials,
    discovery: DiscoveryCache | None,
    copies: DiscoveryCopies | None,
    discovery_offline: Admit | None,
    breaker: CircuitBreaker | None,
    offline: Offline | None,
    observe: WriteObserver | None,
    settings: PassthroughSettings,
) -> web.StreamResponse:
    verb = request.method.upper()
    upgrade = request.headers.get("Upgrade", "").lower()
    if "websocket" in upgrade:
        return await relay_websocket(request, upstream=upstream, credentials=credentials)
    if upgrade.startswith("spdy/"):
        refused = status_response(
            StatusError.bad_request(
                f"upgrade to {request.headers['Upgrade']!r} is not supported by warmwatch; "
                "use WebSocket (kubectl 1.30+ does by default)"
            )
        )
        count(upstream, verb, refused.status)
        return refused
    # Any other Upgrade (e.g. curl's h2c) is ignored, as a server may: it is hop-by-hop and
    # not forwarded, and the request proceeds as HTTP/1.1.
    key = request_key(request) if verb == "GET" else None
    if key is not None and discovery is not None and copies is not None:
        return await serve_discovery(
            request,
            key=key,
            upstream=upstream,
            credentials=credentials,
            cache=discovery,
            copies=copies,
            breaker=breaker,
            settings=settings,
            admit_offline=discovery_offline,
            offline=offline,
        )
    started = time.monotonic()
    listed = _listed_resource(request) if verb == "GET" else None
    collector = None
    if observe is not None and verb in _WRITE_METHODS:
        collector = Collector(limit=settings.write_body_max)
    try:
        response = await forward(
            request,
            upstream=upstream,
            credentials=credentials,
            breaker=breaker,
            settings=settings,
            purpose="passthrough",
            collector=collector,
            counted=(
                upstream.metrics.list_bytes.labels(resource=listed, source="passthrough").inc
                if listed is not None
                else None
            ),
        )
    except UpstreamUnavailable as error:
        count(upstream, verb, "error")
        if offline is not None:
            return await offline(request, error)
        return unavailable(error)
    wrote = verb in _WRITE_METHODS and 200 <= response.status < 300
    if copies is not None and wrote and changes_discovery(request.path):
        copies.api_changed()
    if listed is not None:  # beside the cache's own LISTs: the dashboard compares the two
        upstream.metrics.list_duration.labels(resource=listed, source="passthrough").observe(
            time.monotonic() - started
        )
    if observe is not None and collector is not None and collector.complete:
        try:
            observe(request, CIMultiDict(collector.headers), collector.body)
        except Exception:  # the client has its answer; an observer must not change it
            logger.exception("Observing %s %s failed", verb, request.path)
    return response


def _listed_resource(request: web.Request) -> str | None:
    """The ``resource`` label of a passed-through LIST (a GET of a collection, not a watch),
    else None."""
    path = RequestPath.parse(request.path)
    if path is None or path.name is not None or path.watch_prefix:
        return None
    if request.query.get("watch", "").lower() in ("1", "true"):
        return None
    return str(path.gvr)
