"""The API listener's handler: a GET of a collection is a cached read (``executing``, which
may still pass it through), a GET of one object passes through with an answer from the cache
for when the apiserver is unreachable (``offline``), the health endpoints with warmwatch's own
(``health``); everything else passes through (``passing``). Before it, a long-running request
takes its watch slot (:func:`watch_limits`).
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler

from proxy.kube.resources import RequestPath
from proxy.serve import health, limiting
from proxy.serve.context import CONTEXT
from proxy.serve.executing import read_collection
from proxy.serve.offline import offline_get
from proxy.serve.passing import pass_through


@web.middleware
async def watch_limits(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A watch (or another long-running request) holds a slot of ``--max-watches`` and of its
    client's ``--max-client-watches`` while it runs (cached or passed through)."""
    if not limiting.is_long_running(request):
        return await handler(request)
    with request.app[CONTEXT].admission.watch(limiting.client_of(request)):
        return await handler(request)


async def handle(request: web.Request) -> web.StreamResponse:
    ctx = request.app[CONTEXT]
    if request.method == "GET":
        if health.is_health_path(request.path):
            return await pass_through(request, ctx, offline=health.offline_answer(ready=ctx.ready))
        path = RequestPath.parse(request.path)
        if path is not None and path.is_collection:
            return await read_collection(request, path=path, ctx=ctx)
        if path is not None and path.subresource is None and not path.watch_prefix:
            return await pass_through(request, ctx, offline=offline_get(ctx, path))
    return await pass_through(request, ctx)
