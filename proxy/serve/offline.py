"""Single-object GETs while the apiserver is unreachable: answered from the cache.

A GET is passed through whenever the apiserver answers (it is a consistent read). When it
cannot be reached, a controller that restarted from the cache still looks objects up — the
garbage collector verifies owners, controllers re-read what they reconcile — and would only
get 503s. Then the object is answered from a cached collection that holds it (full or
metadata-only, JSON or protobuf, as negotiated), as of the cache's resourceVersion.

An object the cache does not hold is still 503, never 404: "not found" from a cache that may
be behind could make a controller act on an absence that is not real (the garbage collector
remembers absent owners and would delete their dependents once writes work again).

In ``--client-auth delegated`` the client must be allowed to ``get`` the object, decided by
the decisions remembered within the offline window (``upstream.remembering``); a client
without a bearer token, or one never decided, gets the 503.
"""

from __future__ import annotations

import logging

from aiohttp import web

from proxy.cache.shapes import Request
from proxy.kube.resources import RequestPath
from proxy.kube.selectors import FieldSelector, LabelSelector
from proxy.serve import authorizing
from proxy.serve.context import Context
from proxy.serve.negotiating import Representation, negotiate
from proxy.serve.rendering import Renderer
from proxy.upstream.errors import UpstreamUnavailable
from proxy.upstream.passing import Offline, unavailable
from proxy.upstream.reviewing import AccessAttributes

logger = logging.getLogger(__name__)


def offline_get(ctx: Context, path: RequestPath) -> Offline:
    """The passthrough ``offline`` answer for a GET of the object at ``path``."""

    async def respond(request: web.Request, error: UpstreamUnavailable) -> web.StreamResponse:
        assert path.name is not None
        if ctx.delegation is not None:
            attributes = AccessAttributes(
                verb="get",
                group=path.gvr.group,
                version=path.gvr.version,
                resource=path.gvr.resource,
                namespace=path.namespace or "",
                name=path.name,
            )
            if await authorizing.grant(request, ctx.delegation, attributes) is None:
                return unavailable(error)
        accept = request.headers.get("Accept")
        protobuf_ok = path.gvr.may_have_protobuf and path.gvr not in ctx.syncer.without_protobuf
        for ok in (protobuf_ok, False) if protobuf_ok else (False,):
            negotiated = negotiate(accept, single=True, protobuf_ok=ok)
            if negotiated.representation is Representation.PASS_THROUGH:
                continue
            wanted = Request(
                gvr=path.gvr,
                namespace=path.namespace,
                label_selector=LabelSelector.EVERYTHING,
                field_selector=FieldSelector.EVERYTHING,
                encoding=negotiated.encoding,
            )
            shape = ctx.syncer.find(wanted, namespaced=True if path.namespace else None)
            if shape is None or shape.rv is None:
                continue
            raw = await ctx.store.get_object(shape, namespace=path.namespace or "", name=path.name)
            if raw is None:
                break  # not cached: the apiserver's business (see the module docstring)
            renderer = Renderer(
                encoding=shape.key.encoding,
                metadata_only=negotiated.representation is Representation.METADATA,
                kind=shape.kind,
                api_version=shape.api_version,
            )
            logger.debug("apiserver unreachable; %s served from the cache", request.path)
            return web.Response(
                body=renderer.single(raw), headers={"Content-Type": renderer.content_type}
            )
        return unavailable(error)

    return respond
