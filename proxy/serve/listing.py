"""LIST from the cache: one consistent snapshot, streamed as it is read.

The list's ``metadata.resourceVersion`` is the RV of the snapshot. ``limit`` is ignored, as
the apiserver's watch cache does for RV "0": the whole list, no ``continue``. A not-older-than
RV the cache has not reached waits briefly, then gets 504 with ``Retry-After``.
"""

from __future__ import annotations

import time

from aiohttp import web

from proxy.cache.filtering import Filter
from proxy.cache.store import Shape
from proxy.kube import versions
from proxy.kube.status import StatusError
from proxy.serve import rendering
from proxy.serve.context import Context
from proxy.serve.negotiating import Representation


async def wait_for_rv(ctx: Context, shape: Shape, rv: str) -> None:
    """Return once the cache reached ``rv``; 504 Too large resource version otherwise."""
    deadline = time.monotonic() + ctx.settings.too_large_wait
    while True:
        current = shape.rv or ""
        if versions.compare(current, rv) in (0, 1):
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise StatusError.too_large_resource_version(requested=rv, current=current)
        await shape.log.wait_beyond(shape.log.last_seq, timeout=remaining)


async def serve_list(
    request: web.Request,
    *,
    ctx: Context,
    shape: Shape,
    view: Filter,
    representation: Representation,
    not_older_than: str | None,
) -> web.StreamResponse:
    started = time.monotonic()
    if not_older_than is not None:
        await wait_for_rv(ctx, shape, not_older_than)
    metadata_only = representation is Representation.METADATA
    async with ctx.store.snapshot(shape, namespace=view.namespace) as snapshot:
        if metadata_only:
            kind, api_version = "PartialObjectMetadataList", rendering.METADATA_API_VERSION
        else:
            kind, api_version = f"{snapshot.kind}List", snapshot.api_version
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await response.prepare(request)
        sent = 0
        head = rendering.list_head(kind=kind, api_version=api_version, rv=snapshot.rv)
        await response.write(head)
        separator = b"["
        async for rows in snapshot.rows:
            items = [
                rendering.partial_metadata(raw) if metadata_only else raw
                for namespace, name, labels, raw in rows
                if view.is_everything or view.admits(namespace=namespace, name=name, labels=labels)
            ]
            if items:
                chunk = separator + b",".join(items)
                separator = b","
                sent += len(chunk)
                await response.write(chunk)
        if separator == b"[":
            tail = rendering.NO_METADATA_ITEMS if metadata_only else rendering.NO_ITEMS
        else:
            tail = rendering.LIST_TAIL
        await response.write(tail)
    await response.write_eof()
    resource = shape.resource
    ctx.metrics.list_bytes.labels(resource=resource, source="cache").inc(
        sent + len(head) + len(tail)
    )
    ctx.metrics.list_duration.labels(resource=resource, source="cache").observe(
        time.monotonic() - started
    )
    return response
