"""Read your writes, the serving half (the rule is in ``proxy.cache.freshness``).

:func:`record_write` is passthrough's write observer: it reads the written object's
resourceVersion from the answer (JSON or protobuf; a Status carries none) and remembers
deletes. :func:`caught_up` makes a most-recent read (``resourceVersion`` unset) wait until the
cache shows every write recorded for what it reads, at most ``too_large_wait`` (3 s, as the
apiserver waits for its watch cache); False means: pass the read through to the apiserver.
"""

from __future__ import annotations

import logging
import time
import zlib
from typing import Any

import orjson
from aiohttp import web
from multidict import CIMultiDict

from proxy.cache.freshness import RecentWrites, reached
from proxy.cache.shapes import Shape
from proxy.kube import protobuf
from proxy.kube.resources import RequestPath
from proxy.serve.context import Context

logger = logging.getLogger(__name__)

_MAX_OBJECT = 8 * 2**20
"""A decompressed answer larger than this is not one object: it is not read."""

_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
"""zlib's window-bits value for each HTTP content coding (``deflate`` is the zlib format)."""

_PIECE = 1 << 20
"""Decompressed bytes produced per step."""


def _decoded(headers: CIMultiDict[str], body: bytes) -> bytes | bytearray | None:
    """The body without its content coding; None when it decodes to more than
    ``_MAX_OBJECT`` bytes, or not completely. Decompression is streamed and stops at the
    bound: a small compressed answer (the list a deletecollection returns, say) may stand for
    hundreds of MiB, which are never produced (at most the bound and a piece are held)."""
    encoding = headers.get("Content-Encoding", "").strip().lower()
    if encoding not in _WBITS:
        return body if len(body) <= _MAX_OBJECT else None
    inflater = zlib.decompressobj(_WBITS[encoding])
    data = bytearray()
    pending = body
    while not inflater.eof and len(data) <= _MAX_OBJECT:
        piece = inflater.decompress(pending, _PIECE)
        if not piece and len(inflater.unconsumed_tail) == len(pending):
            break  # no progress: the input ended before the stream did
        pending = inflater.unconsumed_tail
        data += piece
    if len(data) > _MAX_OBJECT or not inflater.eof:
        return None
    return data


def written_resource_version(headers: CIMultiDict[str], body: bytes) -> str | None:
    """The resourceVersion of the object a write was answered with (None: a Status, or not
    an object warmwatch can read)."""
    content_type = headers.get("Content-Type", "").split(";")[0].strip().lower()
    try:
        data = _decoded(headers, body)
        if data is None:
            return None
        if content_type == protobuf.MEDIA_TYPE:
            envelope = protobuf.unwrap(memoryview(data))
            if envelope.kind == "Status":
                return None
            return protobuf.object_meta(envelope.raw).resource_version or None
        if content_type == "application/json":
            obj: Any = orjson.loads(data)
            if not isinstance(obj, dict) or obj.get("kind") == "Status":
                return None
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            return rv if isinstance(rv, str) and rv else None
    except (ValueError, OSError, zlib.error) as error:
        logger.debug("cannot read the written object's resourceVersion: %s", error)
    return None


def record_write(
    writes: RecentWrites, request: web.BaseRequest, headers: CIMultiDict[str], body: bytes
) -> None:
    """passthrough's write observer (``WriteObserver``)."""
    path = RequestPath.parse(request.path)
    if path is None:
        return
    namespace = path.namespace or ""
    rv = written_resource_version(headers, body)
    if rv is not None:
        writes.wrote(path.gvr, namespace=namespace, rv=rv)
    if request.method.upper() == "DELETE" and path.name is not None and path.subresource is None:
        writes.deleted(path.gvr, namespace=namespace, name=path.name)


async def caught_up(ctx: Context, shape: Shape, *, namespace: str | None) -> bool:
    """Wait until ``shape`` shows every write recorded for reads of it in ``namespace``."""
    target = ctx.writes.target(shape.key.gvr, namespace=namespace or shape.key.namespace or None)
    if target.empty:
        return True
    deadline = time.monotonic() + ctx.settings.too_large_wait
    deleted = target.deleted
    while True:
        seen = shape.log.last_seq
        if reached(shape.rv, target.rv):
            if deleted:
                deleted = await ctx.store.present(shape, deleted)
            if not deleted:
                return True
        remaining = deadline - time.monotonic()
        if remaining <= 0 or shape.log.closed:
            logger.info(
                "%s: the cache does not show a write made through warmwatch yet (RV %s, "
                "%d deletes); passing the read through",
                shape.key,
                target.rv,
                len(deleted),
            )
            return False
        await shape.log.wait_beyond(seen, timeout=remaining)
