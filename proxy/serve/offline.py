"""Single-object GETs while the apiserver is unreachable: answered from the cache.

A GET is passed through whenever the apiserver answers (it is a consistent read). When it
cannot be reached, a controller that restarted from the cache still looks objects up — the
garbage collector verifies owners, controllers re-read what they reconcile — and would only
get 503s. Then the object is answered from a cached collection that holds it (full or
metadata-only, JSON or protobuf, as negotiated: ``planning.plan_object_get``), as of the
cache's resourceVersion.

An object the cache does not hold is still 503, never 404: "not found" from a cache that may
be behind could make a controller act on an absence that is not real (the garbage collector
remembers absent owners and would delete their dependents once writes work again).

In ``--client-auth delegated`` the client must be allowed to ``get`` the object by a decision
made within the offline window (``upstream.remembering``). While the apiserver answers, a GET
is passed through and the apiserver decides it, so a ``get`` decision is rarely remembered;
what a controller has are the decisions for its informers' ``list`` and ``watch``. Those
count: an allowed ``list`` or ``watch`` without selectors of the same resource (group,
version, resource) in the object's namespace, or across all namespaces, allows the ``get``.
It gives nothing away: such a list or watch (from resourceVersion 0) returns every object it
covers whole, so who may list may read each of them anyway. RBAC grants the verbs apart, but
no authorizer can make a list's objects unreadable to whom it lets list. A list allowed only
with a selector (which a webhook authorizer may look at), or only for one name, does not
count. A client without a bearer token, or with nothing decided, gets the 503; a ``get``
denied within the window, the 403.
"""

from __future__ import annotations

import logging

from aiohttp import web

from proxy.kube.resources import RequestPath
from proxy.serve import authorizing
from proxy.serve.answers import unavailable
from proxy.serve.context import Context
from proxy.serve.planning import plan_object_get
from proxy.serve.relaying import Offline
from proxy.upstream.errors import UpstreamUnavailable
from proxy.upstream.reviewing import AccessAttributes

logger = logging.getLogger(__name__)


def offline_get(ctx: Context, path: RequestPath) -> Offline:
    """The passthrough ``offline`` answer for a GET of the object at ``path``."""

    async def respond(request: web.Request, error: UpstreamUnavailable) -> web.StreamResponse:
        assert path.name is not None
        if ctx.delegation is not None:
            get, *reads = _get_and_its_implying_reads(path)
            if await authorizing.grant(request, ctx.delegation, get, implied_by=reads) is None:
                return unavailable(error)
        plan = plan_object_get(path, request.headers.get("Accept"), ctx.syncer)
        if plan is None:
            return unavailable(error)
        raw = await ctx.store.get_object(plan.shape, namespace=path.namespace or "", name=path.name)
        if raw is None:
            return unavailable(error)  # not cached: the apiserver's business (see above)
        logger.debug("apiserver unreachable; %s served from the cache", request.path)
        return web.Response(
            body=plan.renderer.single(raw), headers={"Content-Type": plan.renderer.content_type}
        )

    return respond


def _get_and_its_implying_reads(path: RequestPath) -> list[AccessAttributes]:
    """The ``get`` of the object at ``path``, then the selector-less ``list`` and ``watch``
    of its resource in its namespace and across all namespaces (see the module docstring)."""

    def attributes(verb: str, namespace: str, name: str = "") -> AccessAttributes:
        return AccessAttributes(
            verb=verb,
            group=path.gvr.group,
            version=path.gvr.version,
            resource=path.gvr.resource,
            namespace=namespace,
            name=name,
        )

    namespaces = [path.namespace, ""] if path.namespace else [""]
    implying = [attributes(verb, ns) for ns in namespaces for verb in ("list", "watch")]
    return [attributes("get", path.namespace or "", path.name or ""), *implying]
