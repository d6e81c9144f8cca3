"""LIST from the cache: one consistent snapshot, streamed as it is read.

The list's ``metadata.resourceVersion`` is the RV of the snapshot. ``limit`` is ignored, as
the apiserver's watch cache does for RV "0": the whole list, no ``continue``. Items are the
stored bytes, concatenated; nothing is decoded per request (metadata-only answers cut each
object down to its metadata). A not-older-than
RV the cache has not reached waits briefly (``wait_for_rv``), then the request is passed through:
the apiserver answers it (at once, or with its own 504 when the RV is really ahead; see
``executing``).

A LIST is sent within ``ServeSettings.list_timeout`` (60 s, the apiserver's
``--request-timeout``, which cuts its own LISTs too) plus the time its bytes take at
``list_min_rate`` (1 MiB/s), or it is cut: its snapshot is a read transaction, and a client
that reads slowly but steadily — past every write deadline — would otherwise keep the WAL
from being checkpointed past it for as long as it likes. The rate term is warmwatch's own:
it serves lists that the apiserver could not send within its timeout (1,000,000 objects),
to clients that read them at memory speed, or while the machine is busy, slower.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from proxy.cache.filtering import Filter
from proxy.cache.pooling import Snapshot
from proxy.cache.shapes import Encoding, Shape
from proxy.kube import protobuf, versions
from proxy.kube.status import StatusError
from proxy.serve import rendering
from proxy.serve.context import Context
from proxy.serve.rendering import Renderer
from proxy.serve.streaming import Pieces, Send, SlowClient, cut, write_within

logger = logging.getLogger(__name__)


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
    renderer: Renderer,
    not_older_than: str | None,
) -> web.StreamResponse:
    started = time.monotonic()
    if not_older_than is not None:
        await wait_for_rv(ctx, shape, not_older_than)
    response = web.StreamResponse(status=200, headers={"Content-Type": renderer.content_type})
    try:
        async with ctx.admission.list_stream():
            try:
                size = await _stream(
                    request, response, ctx=ctx, shape=shape, view=view, renderer=renderer
                )
            except TimeoutError:
                if not response.prepared:
                    raise StatusError.timeout(
                        "request did not complete within the allotted timeout"
                    ) from None
                raise SlowClient from None
        await response.write_eof()
    except Exception as error:
        if not response.prepared:
            raise  # nothing sent yet: the middleware answers with a Status
        # The answer has begun: it can only be cut, visibly (a clean end of a chunked body
        # would pass a truncated list off as complete). A client that left, or stopped
        # reading (``streaming``), is no error.
        if isinstance(error, ConnectionError | SlowClient):
            reason = "slow" if isinstance(error, SlowClient) else "disconnected"
            ctx.metrics.client_errors.labels(reason=reason).inc()
            logger.debug("LIST of %s: the client left or stopped reading", shape.resource)
        else:
            logger.exception("LIST of %s failed after its answer began", shape.resource)
        cut(request)
        return response
    resource = shape.resource
    ctx.metrics.list_bytes.labels(resource=resource, source="cache").inc(size)
    ctx.metrics.list_duration.labels(resource=resource, source="cache").observe(
        time.monotonic() - started
    )
    return response


def _send_within(ctx: Context, response: web.StreamResponse, deadline: asyncio.Timeout) -> Send:
    """Writes with the write deadline, each moving the list's ``deadline`` to ``list_timeout``
    after the list began plus the time its bytes so far take at ``list_min_rate``."""
    settings = ctx.settings
    begun = asyncio.get_running_loop().time()
    written = 0

    async def send(data: bytes) -> None:
        nonlocal written
        await write_within(response, data, timeout=settings.slow_write_timeout)
        written += len(data)
        deadline.reschedule(begun + settings.list_timeout + written / settings.list_min_rate)

    return send


async def _stream(
    request: web.Request,
    response: web.StreamResponse,
    *,
    ctx: Context,
    shape: Shape,
    view: Filter,
    renderer: Renderer,
) -> int:
    """The list, from one snapshot; the bytes of its body. TimeoutError when the snapshot
    was held for longer than the list's deadline (:func:`_send_within`)."""
    async with (
        ctx.store.snapshot(shape, namespace=view.namespace) as snapshot,
        asyncio.timeout(ctx.settings.list_timeout) as deadline,
    ):
        send = _send_within(ctx, response, deadline)
        if renderer.encoding is Encoding.PROTOBUF:
            return await _protobuf_list(request, response, send, snapshot, view, renderer)
        return await _json_list(request, response, send, snapshot, view, renderer)


def _admitted(view: Filter, rows: list[Any]) -> Iterator[Any]:
    for row in rows:
        if view.is_everything or view.admits(namespace=row[0], name=row[1], labels=row[2]):
            yield row


async def _json_list(
    request: web.Request,
    response: web.StreamResponse,
    send: Send,
    snapshot: Snapshot,
    view: Filter,
    renderer: Renderer,
) -> int:
    await response.prepare(request)
    head = rendering.list_head(
        kind=renderer.list_kind, api_version=renderer.object_api_version, rv=snapshot.rv
    )
    pieces = Pieces(send)
    await pieces.add(head)
    separator = b"["
    async for rows in snapshot.rows:
        for _, _, _, raw in _admitted(view, rows):
            await pieces.add(separator, renderer.list_item(raw))
            separator = b","
    if separator == b"[":
        tail = rendering.NO_METADATA_ITEMS if renderer.metadata_only else rendering.NO_ITEMS
    else:
        tail = rendering.LIST_TAIL
    await pieces.add(tail)
    await pieces.flush()
    return pieces.written


async def _protobuf_list(
    request: web.Request,
    response: web.StreamResponse,
    send: Send,
    snapshot: Snapshot,
    view: Filter,
    renderer: Renderer,
) -> int:
    """A protobuf list's envelope states its length first: a sizing pass over the rows' heads,
    then the rows, both in the snapshot's one read transaction (so they agree)."""
    list_meta = protobuf.list_meta(resource_version=snapshot.rv)
    total = len(list_meta)
    async for heads in snapshot.heads:
        for _, _, _, length, start in _admitted(view, heads):
            total += renderer.list_item_size(length=length, head=bytes(start))
    head = protobuf.envelope_head(
        api_version=renderer.object_api_version, kind=renderer.list_kind, raw_length=total
    )
    response.content_length = len(head) + total + len(protobuf.ENVELOPE_TAIL)
    await response.prepare(request)
    pieces = Pieces(send)
    await pieces.add(head, list_meta)
    async for rows in snapshot.rows:
        for _, _, _, raw in _admitted(view, rows):
            await pieces.add(protobuf.list_item(renderer.object(raw)))
    await pieces.flush()
    written = pieces.written - len(head)
    if written != total:  # cannot happen: the same rows in the same transaction
        raise RuntimeError(f"protobuf list sized {total} bytes, wrote {written}")
    await pieces.add(protobuf.ENVELOPE_TAIL)
    await pieces.flush()
    return pieces.written
