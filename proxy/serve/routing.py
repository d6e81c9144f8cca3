"""The aiohttp applications: the API listener, the metrics/health listener and the seeding
listener.

Every request on the API listener passes this module's middlewares (the request target, then
Status answers around everything after), the client's authentication (``authenticating``),
and then ``dispatching``, whose one handler chooses between a cached read and passthrough.
Errors become Kubernetes ``Status`` answers, never tracebacks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import yarl
from aiohttp import web
from aiohttp.typedefs import Handler

from proxy.cache.shapes import Encoding
from proxy.kube.gocompat import origin_form, valid_escapes
from proxy.kube.resources import RequestPath
from proxy.kube.status import StatusError
from proxy.metrics import Metrics
from proxy.serve import authenticating, connections, health, limiting, seeding
from proxy.serve.answers import BARE, STATUS, apiserver_headers, status_response
from proxy.serve.context import CONTEXT, Context
from proxy.serve.dispatching import handle, watch_limits
from proxy.serve.negotiating import status_encoding
from proxy.serve.streaming import cut
from proxy.upstream.discovering import HEALTH_ENDPOINTS
from proxy.upstream.errors import UpstreamBusy
from proxy.upstream.seeding import SEED_PATH

logger = logging.getLogger(__name__)

METRICS: web.AppKey[Metrics] = web.AppKey("metrics", Metrics)


@web.middleware
async def request_target(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A path with a bad ``%`` escape is refused before anything else, as Go's HTTP server
    does for the apiserver (plain text, and the connection is closed). An absolute-form
    target (``GET http://host/path?query``) is routed by its path and query, as Go's server
    routes it: every handler after this one sees the origin form, and the URL's host as the
    request's host (Go's ``Request.Host``, which the loopback Host check then checks)."""
    if not valid_escapes(request.raw_path.partition("?")[0]):
        response = web.Response(status=400, text="400 Bad Request")
        response[BARE] = True
        response.force_close()
        return response
    relative = origin_form(request.raw_path)
    if relative is not None:
        if not relative.partition("?")[0]:
            return _not_found()  # no path to route (``http://host``): the apiserver's mux
        request = request.clone(rel_url=yarl.URL(relative, encoded=True), host=request.host)
    return await handler(request)


def _not_found() -> web.Response:
    """Go's ``http.NotFound``, which the apiserver answers for a path it does not route."""
    response = web.Response(status=404, text="404 page not found\n")
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


@web.middleware
async def statuses(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn failures into Status answers (or ERROR events once a watch has started), and
    write every Status warmwatch answers itself in the encoding the client negotiated, as
    the apiserver does (protobuf for ``Accept: application/vnd.kubernetes.protobuf, ...``).

    A client's own fault is no failure of ours: a request over a limit gets the apiserver's
    429; a client that left or stopped reading (``connections.client_fault``) is counted and
    its connection cut — never a traceback, never a 500 written into a closed or half-sent
    stream."""
    response = await _answer(request, handler)
    error = response.get(STATUS)
    if error is None or response.prepared or _status_encoding(request) is Encoding.JSON:
        return response
    return status_response(error, encoding=Encoding.PROTOBUF)


def _status_encoding(request: web.Request) -> Encoding:
    """The encoding the apiserver writes a Status in for this request: its negotiated one
    (``negotiating.status_encoding``); protobuf only for a resource that has that form."""
    path = RequestPath.parse(request.path)
    if path is None:
        return Encoding.JSON
    ctx = request.app.get(CONTEXT)
    protobuf_ok = ctx.syncer.has_protobuf(path.gvr) if ctx else path.gvr.may_have_protobuf
    accept = ", ".join(request.headers.getall("Accept", []))
    return status_encoding(accept, protobuf_ok=protobuf_ok)


async def _answer(request: web.Request, handler: Handler) -> web.StreamResponse:
    metrics = request.app.get(METRICS)
    try:
        return await handler(request)
    except StatusError as error:
        return status_response(error)
    except limiting.LimitReached as reached:
        if metrics is not None:
            metrics.rejected.labels(limit=reached.limit).inc()
        return limiting.too_many_requests()
    except UpstreamBusy as busy:  # a purpose's upstream connections are all in use
        if metrics is not None:
            metrics.rejected.labels(limit=f"upstream_{busy.purpose}").inc()
        return limiting.too_many_requests()
    except web.HTTPException:
        raise
    except Exception as error:
        reason = connections.client_fault(error)
        if reason is None:
            logger.exception("%s %s failed", request.method, request.path)
            return status_response(StatusError.internal_error(error))
        if metrics is not None:
            metrics.client_errors.labels(reason=reason).inc()
        logger.debug("client error: %s (%s)", reason, type(error).__name__)
        cut(request)
        response = web.Response(status=499)  # never sent: the connection is gone
        response.force_close()
        return response


def api_app(
    ctx: Context,
    *,
    auth: authenticating.ClientAuth,
    guard: authenticating.Guard | None = None,
    tokens: authenticating.TokenFile | None = None,
) -> web.Application:
    app = web.Application(
        middlewares=[
            connections.middleware,
            request_target,
            statuses,
            authenticating.middleware(auth, guard=guard, tokens=tokens, metrics=ctx.metrics),
            watch_limits,
        ],
        client_max_size=64 * 1024 * 1024,
    )
    app[CONTEXT] = ctx
    app[METRICS] = ctx.metrics
    app.on_response_prepare.append(apiserver_headers)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


def health_app(*, metrics: Metrics, ready: Callable[[], tuple[bool, str]]) -> web.Application:
    """``/metrics``, ``/healthz``, ``/livez``, ``/readyz`` on their own port.

    ``/metrics`` is written on a thread, one scrape at a time: at the bounds (500 shapes, every
    series of 72 resources: 1.2 MB) that takes 70-180 ms of pure Python, which on the event loop
    stalled every client for as long; on a thread the loop gets the GIL back every few ms."""
    exposing = asyncio.Lock()

    async def exposition(_: web.Request) -> web.Response:
        async with exposing:  # (one thread at most, whoever scrapes how often)
            body = await asyncio.to_thread(metrics.exposition)
        response = web.Response(body=body)
        response.headers["Content-Type"] = metrics.content_type
        return response

    async def probe(request: web.Request) -> web.Response:
        return health.answer(
            request, check=ready if request.path.startswith("/readyz") else health.alive
        )

    app = web.Application(middlewares=[connections.middleware])
    app.router.add_get("/metrics", exposition)
    for endpoint in HEALTH_ENDPOINTS:
        app.router.add_get(endpoint, probe)
        app.router.add_get(endpoint + "/{check:.+}", probe)
    return app


def seed_app(snapshots: seeding.SnapshotServer) -> web.Application:
    """``/seed`` on the seeding listener: the cache's snapshot for a peer (``seeding``)."""
    app = web.Application(middlewares=[connections.middleware])
    app.router.add_get(SEED_PATH, snapshots.handle)
    return app
