"""Collection GETs: a LIST or WATCH planned (``planning.plan_read``), then carried out.

The plan decides; this module does what takes time: authorizes the client (``--client-auth
delegated``, before the plan: a bad query of a client that may not read is 403, not 400, as
in the apiserver's filters), learns and waits for a fill, waits for the writes made through
warmwatch (``read_your_writes``), and serves the LIST (``listing``) or the WATCH
(``watching``). Each of those that fails is passed through (``passing``): a fill that fails,
stalls or is refused by the apiserver (the client then gets the apiserver's own answer to
exactly its request), a most-recent read that does not catch up, a not-older-than
resourceVersion the cache does not reach in time.

A shape to fill behind (``Serve.learn_behind``: the protobuf collection of a protobuf client
answered from the JSON one) is learned once the answer's list, or its watch's initial state,
has been sent — or the request has ended. Its fill is a whole collection listed over the link
and stored; begun at once, it would compete with the answer the client is waiting for (for
CPU in warmwatch, in the apiserver and on the link). The client's later requests are served
from the JSON collection until it is filled.
"""

from __future__ import annotations

import logging

from aiohttp import web

from proxy.cache.shapes import Shape
from proxy.kube.resources import RequestPath
from proxy.kube.status import StatusError
from proxy.serve import authorizing, read_your_writes
from proxy.serve.authorizing import Grant
from proxy.serve.context import Context
from proxy.serve.listing import serve_list
from proxy.serve.passing import pass_through
from proxy.serve.planning import (
    Fill,
    PassThrough,
    ReadAttributes,
    Reject,
    Serve,
    Why,
    plan_read,
)
from proxy.serve.watching import Watch
from proxy.upstream.errors import UpstreamStatusError

logger = logging.getLogger(__name__)


async def read_collection(
    request: web.Request, *, path: RequestPath, ctx: Context
) -> web.StreamResponse:
    raw_query = request.raw_path.partition("?")[2]
    read = ReadAttributes.of(path, raw_query=raw_query, accept=request.headers.get("Accept"))
    max_key_bytes = ctx.syncer.settings.max_key_bytes
    grant: Grant | None = None
    if ctx.delegation is not None and not read.too_long(max_key_bytes):
        attributes = authorizing.access_attributes(path, raw_query)
        grant = await authorizing.grant(request, ctx.delegation, attributes)
        if grant is None:
            return await pass_through(request, ctx)  # the apiserver decides (see authorizing)
    plan = plan_read(read, ctx.syncer, learn=ctx.learn, max_key_bytes=max_key_bytes)
    if isinstance(plan, PassThrough):
        if plan.why is Why.SELECTORS_TOO_LONG:
            ctx.metrics.shape_limit.labels(reason="key_bytes").inc()
        return await pass_through(request, ctx)
    if isinstance(plan, Reject):
        raise plan.error
    if isinstance(plan, Fill):
        filled = await _filled(ctx, plan)
        if filled is None:
            return await pass_through(request, ctx)
        plan = plan.then(filled)
    return await _serve(request, ctx, plan, grant=grant)


async def _filled(ctx: Context, plan: Fill) -> Shape | None:
    """The plan's shape, learned if new, once filled; None: pass the request through."""
    try:
        shape = plan.shape or await ctx.syncer.learn(plan.learn)
        if shape is None:
            return None  # the shape limit is reached
        filled = await ctx.syncer.wait_filled(shape)
    except UpstreamStatusError as refused:
        # Not kept (never cache what warmwatch may not read). The client's own request
        # goes to the apiserver, so it gets the apiserver's own answer to exactly it: a
        # 403/404 as the apiserver words it, or a list where only watching was refused.
        logger.info("%s refused upstream (%s); passing through", plan.learn, refused)
        return None
    if not filled:
        logger.info("%s: its fill failed or stalled; passing the request through", shape.key)
        return None
    return shape


async def _serve(
    request: web.Request, ctx: Context, plan: Serve, *, grant: Grant | None
) -> web.StreamResponse:
    behind = plan.learn_behind

    async def fill_behind() -> None:
        if behind is not None:
            await ctx.syncer.learn(behind)  # not waited for

    shape = plan.shape
    await ctx.store.touch(shape)
    caught_up = read_your_writes.caught_up
    if plan.most_recent and not await caught_up(ctx, shape, namespace=plan.namespace):
        await fill_behind()
        return await pass_through(request, ctx)  # read your writes: the apiserver has them
    if plan.start is not None:
        watch = Watch(
            ctx=ctx,
            shape=shape,
            view=plan.view,
            options=plan.options,
            start=plan.start,
            renderer=plan.renderer,
            request=request,
            grant=grant,
            initial_sent=fill_behind,
        )
        return await watch.serve()
    try:
        return await serve_list(
            request,
            ctx=ctx,
            shape=shape,
            view=plan.view,
            renderer=plan.renderer,
            not_older_than=plan.not_older_than,
        )
    except StatusError as error:
        if not error.is_too_large_resource_version:
            raise
        # The cache did not reach the RV in time. A quiet shape learns the current RV only
        # from the next bookmark (about a minute), while the apiserver asks etcd for it: the
        # apiserver answers (at once, or with this same 504 if the RV is really ahead).
        return await pass_through(request, ctx)
    finally:
        await fill_behind()
