"""Passthrough: every request the cache does not serve goes to the apiserver unchanged.

Bodies stream both ways without buffering (a ``watch`` or ``logs -f`` passes through as it
arrives), method, path, query and end-to-end headers are kept (``proxy.upstream.forwarding``,
``relaying``), WebSocket upgrades (exec, attach, port-forward) are relayed frame by frame
(``websockets``), and discovery documents are cached so a controller can start while the
apiserver is unreachable, and answered from copies the apiserver confirmed lately, as are
plain health checks (``documents``). This module dispatches a request to them, and tells
read your writes (``read_your_writes``) of each write passed through.

- While the apiserver cannot be reached, the answer is a 503 with ``Retry-After: 1`` at once
  (``answers.unavailable``); a caller may give its own ``offline`` answer instead (the health
  endpoints and single-object GETs do).
- Only WebSocket upgrades are relayed. SPDY/3.1 upgrades (kubectl before 1.30/1.31) are
  answered 400; current kubectl negotiates WebSocket first. Other upgrades (curl's ``h2c``)
  are ignored and the request proceeds as HTTP/1.1.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Final, TypeAlias

from aiohttp import web
from multidict import CIMultiDict

from proxy.kube.resources import RequestPath
from proxy.kube.status import StatusError
from proxy.serve import authorizing, limiting, read_your_writes
from proxy.serve.answers import status_response, unavailable
from proxy.serve.context import Context
from proxy.serve.documents import Admit, request_key, serve_discovery
from proxy.serve.relaying import Collector, Offline, RelaySettings, relay
from proxy.serve.websockets import relay_websocket
from proxy.upstream.connecting import Credentials, Upstream
from proxy.upstream.delegating import Delegation
from proxy.upstream.discovering import DiscoveryCache, DiscoveryCopies, changes_discovery
from proxy.upstream.errors import UpstreamAuthError, UpstreamUnavailable
from proxy.upstream.forwarding import count
from proxy.upstream.resilience import CircuitBreaker

logger = logging.getLogger(__name__)

WriteObserver: TypeAlias = Callable[[web.BaseRequest, CIMultiDict[str], bytes], None]
"""Told of each successful write (POST, PUT, PATCH, DELETE answered 2xx) once its answer was
passed on whole: the request, the answer's headers and its body as sent (still encoded when
it has a Content-Encoding)."""

_WRITE_METHODS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})


# ------------------------------------------------------------------------- the handler


async def pass_through(
    request: web.Request, ctx: Context, *, offline: Offline | None = None
) -> web.StreamResponse:
    """The request, passed through to the apiserver with the context's settings. A short
    request holds one of ``--max-requests`` (long-running ones hold a watch slot already:
    ``dispatching.watch_limits``)."""
    if limiting.is_long_running(request):
        return await _pass_through(request, ctx, offline=offline)
    with ctx.admission.request(limiting.client_of(request)):
        return await _pass_through(request, ctx, offline=offline)


async def _pass_through(
    request: web.Request, ctx: Context, *, offline: Offline | None
) -> web.StreamResponse:
    return await pass_through_with(
        request,
        upstream=ctx.upstream,
        credentials=ctx.credentials,
        discovery=ctx.discovery,
        copies=ctx.discovery_copies,
        discovery_offline=(
            None
            if ctx.delegation is None
            else functools.partial(authenticated_offline, delegation=ctx.delegation)
        ),
        breaker=ctx.breaker,
        offline=offline,
        observe=functools.partial(read_your_writes.record_write, ctx.writes),
        settings=RelaySettings(slow_write_timeout=ctx.settings.slow_write_timeout),
    )


async def authenticated_offline(request: web.BaseRequest, *, delegation: Delegation) -> None:
    """``--client-auth delegated``, the apiserver unreachable: a stored discovery document
    is answered to a client whose token was accepted within the offline window (discovery is
    readable by every authenticated user: ``system:discovery``), and refused otherwise, as
    every other decision that cannot be made then."""
    token = authorizing.bearer_token(request)
    if token is None or authorizing.impersonates(request):
        raise StatusError.service_unavailable(
            "the apiserver is unreachable: this request cannot be authenticated now",
            retry_after_seconds=1,
        )
    await authorizing.authenticate(request, delegation, token)


async def pass_through_with(
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
    settings: RelaySettings | None = None,
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
    settings = settings or RelaySettings()
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
    settings: RelaySettings,
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
        collector = Collector(limit=settings.upstream.write_body_max)
    try:
        response = await relay(
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
