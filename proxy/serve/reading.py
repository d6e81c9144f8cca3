"""Collection GETs: answer LIST / WATCH from the cache, or decide to pass them through.

Order, as the apiserver's: find the resource (404), negotiate the representation (406),
decode and validate the query (400/422 Status), then choose. warmwatch answers a bad query
itself only when the apiserver would reach that check too: the resource is one a shape has
listed, and the Accept header is one the cache serves; otherwise (an unknown resource, YAML,
a Table, an Accept nobody serves) the apiserver answers, in its own order.

A query whose selectors are longer than a learned shape's key may be
(``SyncSettings.max_key_bytes``) is passed through first, before anything parses them: no
real controller's selectors come near it, and parsing a 683 KiB label selector took 0.4 s of
the event loop, peaked at 23 MB and kept 6 MB for as long as its request was in flight.

The cache answers when the representation is one it can produce (JSON or protobuf, full
objects or metadata only: ``negotiating``), the semantics allow it (not ``Exact``, not a
``continue`` page) and a shape serves the request — an existing one, or one learned now. A
learned shape whose first list the apiserver refuses is dropped, and the client gets the
apiserver's own answer. A most-recent read (RV unset) first waits for the cache to show the
writes made through warmwatch (``read_your_writes``).
"""

from __future__ import annotations

import dataclasses
import logging

from aiohttp import web

from proxy.cache.filtering import Filter
from proxy.cache.shapes import Encoding, Request, Shape
from proxy.kube.gocompat import parse_query
from proxy.kube.options import (
    ListOptions,
    ListSemanticsKind,
    WatchStart,
    WatchStartKind,
    list_semantics,
    selector_bytes,
    watch_start,
)
from proxy.kube.resources import RequestPath
from proxy.kube.status import StatusError
from proxy.kube.versions import compare
from proxy.serve import authorizing, read_your_writes
from proxy.serve.authorizing import Grant
from proxy.serve.context import Context
from proxy.serve.listing import serve_list
from proxy.serve.negotiating import Representation, negotiate
from proxy.serve.passing import pass_through
from proxy.serve.rendering import Renderer
from proxy.serve.watching import Watch
from proxy.upstream.errors import UpstreamStatusError

logger = logging.getLogger(__name__)


async def read_collection(
    request: web.Request, *, path: RequestPath, ctx: Context
) -> web.StreamResponse:
    raw_query = request.raw_path.partition("?")[2]
    # The query as the apiserver decodes it (Go's URL.Query()), not as aiohttp does: a
    # parameter with a bad escape is dropped rather than kept verbatim.
    query = parse_query(raw_query)
    if selector_bytes(query) > ctx.syncer.settings.max_key_bytes:
        ctx.metrics.shape_limit.labels(reason="key_bytes").inc()
        return await pass_through(request, ctx)
    grant: Grant | None = None
    if ctx.delegation is not None:
        # Authorization comes first, as in the apiserver's filters (a bad query of a client
        # that may not read is 403, not 400).
        attributes = authorizing.access_attributes(path, raw_query)
        grant = await authorizing.grant(request, ctx.delegation, attributes)
        if grant is None:
            return await pass_through(request, ctx)  # the apiserver decides (see authorizing)
    accept = request.headers.get("Accept")
    protobuf_ok = ctx.syncer.has_protobuf(path.gvr)
    try:
        options = ListOptions.parse(query, watch_path=path.is_watch_path)
    except StatusError as invalid:
        if invalid.code < 500 and ctx.syncer.holds(path.gvr) and _servable(accept, protobuf_ok):
            raise
        # The apiserver finds the resource (404) and negotiates (406) before it decodes the
        # query, and a watch's unparsable resourceVersion is its InternalError: its answer.
        return await pass_through(request, ctx)
    negotiated = negotiate(accept, single=options.is_watch, protobuf_ok=protobuf_ok)
    not_older_than: str | None = None
    if negotiated.representation is Representation.PASS_THROUGH:
        return await pass_through(request, ctx)
    start = watch_start(options) if options.is_watch else None
    if start is None:
        semantics = list_semantics(options)
        if semantics.kind in (ListSemanticsKind.EXACT, ListSemanticsKind.CONTINUE):
            return await pass_through(request, ctx)
        if semantics.kind is ListSemanticsKind.NOT_OLDER_THAN:
            not_older_than = semantics.resource_version
        most_recent = semantics.kind is ListSemanticsKind.MOST_RECENT
    else:
        most_recent = start.freshness is ListSemanticsKind.MOST_RECENT

    wanted = Request(
        gvr=path.gvr,
        namespace=path.namespace,
        label_selector=options.label_selector,
        field_selector=options.field_selector,
        encoding=negotiated.encoding,
    )
    namespaced = True if path.namespace else None
    shape = ctx.syncer.find(wanted, namespaced=namespaced)
    if negotiated.encoding is Encoding.PROTOBUF and not _serves(shape, start):
        # The client's first choice is not warm (a first start; the apiserver slow or down)
        # or not learned: a warm JSON collection serves a client that accepts JSON too, and
        # the protobuf one fills behind it for the client's later requests.
        as_json = negotiate(accept, single=options.is_watch, protobuf_ok=False)
        if as_json.representation is not Representation.PASS_THROUGH:
            json_wanted = dataclasses.replace(wanted, encoding=Encoding.JSON)
            other = ctx.syncer.find(json_wanted, namespaced=namespaced)
            if _serves(other, start) or (shape is None and not ctx.learn and other is not None):
                if shape is None and ctx.learn:
                    await ctx.syncer.learn(wanted.exact_key)  # filled behind, not waited for
                negotiated, wanted, shape = as_json, json_wanted, other
    if shape is None or shape.rv is None:
        if shape is None and not ctx.learn:
            return await pass_through(request, ctx)
        try:
            shape = shape or await ctx.syncer.learn(wanted.exact_key)
            if shape is None:
                return await pass_through(request, ctx)  # the shape limit is reached
            filled = await ctx.syncer.wait_filled(shape)
        except UpstreamStatusError as refused:
            # Not kept (never cache what warmwatch may not read). The client's own request
            # goes to the apiserver, so it gets the apiserver's own answer to exactly it: a
            # 403/404 as the apiserver words it, or a list where only watching was refused.
            logger.info("%s refused upstream (%s); passing through", wanted.exact_key, refused)
            return await pass_through(request, ctx)
        if not filled:
            logger.info("%s: its fill failed or stalled; passing the request through", shape.key)
            return await pass_through(request, ctx)
    await ctx.store.touch(shape)
    if most_recent and not await read_your_writes.caught_up(ctx, shape, namespace=path.namespace):
        return await pass_through(request, ctx)  # read your writes: the apiserver has them

    renderer = Renderer(
        encoding=shape.key.encoding,
        metadata_only=negotiated.representation is Representation.METADATA,
        kind=shape.kind,
        api_version=shape.api_version,
        untyped_list_items=protobuf_ok,
    )
    view = Filter()
    if wanted.needs_filter(shape.key):
        view = Filter(
            namespace=path.namespace, labels=options.label_selector, fields=options.field_selector
        )
    if start is not None:
        watch = Watch(
            ctx=ctx,
            shape=shape,
            view=view,
            options=options,
            start=start,
            renderer=renderer,
            request=request,
            grant=grant,
        )
        return await watch.serve()
    try:
        return await serve_list(
            request,
            ctx=ctx,
            shape=shape,
            view=view,
            renderer=renderer,
            not_older_than=not_older_than,
        )
    except StatusError as behind:
        if not behind.is_too_large_resource_version:
            raise
        # The cache did not reach the RV in time. A quiet shape learns the current RV only
        # from the next bookmark (about a minute), while the apiserver asks etcd for it: the
        # apiserver answers (at once, or with this same 504 if the RV is really ahead).
        return await pass_through(request, ctx)


def _serves(shape: Shape | None, start: WatchStart | None) -> bool:
    """``shape`` is filled and, for a watch from a resourceVersion, its log reaches back to it
    (a collection filled later than the client's RV would answer 410 Expired)."""
    if shape is None or shape.rv is None:
        return False
    if start is None or start.kind is not WatchStartKind.FROM_RESOURCE_VERSION:
        return True
    assert start.resource_version is not None
    since = shape.log_start_rv
    order = compare(since, start.resource_version) if since is not None else None
    return order is None or order <= 0


def _servable(accept: str | None, protobuf_ok: bool) -> bool:
    """The cache serves ``accept`` for a list or a watch (which one, the query would say):
    then the apiserver's own negotiation accepts it too."""
    return any(
        negotiate(accept, single=single, protobuf_ok=protobuf_ok).representation
        is not Representation.PASS_THROUGH
        for single in (False, True)
    )
