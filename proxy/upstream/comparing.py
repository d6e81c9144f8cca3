"""``warmwatch verify``: each cached shape compared with the apiserver (docs/design.md §8).

For each shape, in one read transaction of the database (one snapshot, at the shape's RV C):

1. list the collection upstream page by page (``limit`` + ``continue``) **at exactly C**
   (``resourceVersion=C&resourceVersionMatch=Exact``), in the shape's encoding, with its
   namespace and selectors; each page is fed to a :class:`~proxy.cache.verifying.Comparison`
   and dropped, so memory does not grow with the collection;
2. the cache and the list then describe the same revision, so every difference is a real
   one, however fast the collection changes meanwhile: a running warmwatch commits newer
   changes beside the snapshot, which does not see them.

When the apiserver no longer has revision C (410: etcd compacted it — a cache that was
stopped for long), the shape is compared with the current list instead, and an object that
the apiserver changed after C is counted as ``newer-upstream``, not as a difference; an object
deleted upstream after C cannot be told from an extra row then, and is reported as extra.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass

from proxy.cache.inspecting import StoredShape
from proxy.cache.verifying import Comparison, Item, cached_items
from proxy.upstream.connecting import Upstream
from proxy.upstream.decoding import check_content_type, codec_for
from proxy.upstream.errors import UpstreamProtocolError, UpstreamStatusError

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class VerifySettings:
    page_size: int = 500
    """Objects per upstream LIST page: client-go's default, a bounded page in memory."""
    examples: int = 5
    """Examples kept of each kind of difference: enough to look at, few enough to read."""
    progress_interval: float = 2.0
    """Seconds between progress lines on a long list."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ShapeVerdict:
    shape: StoredShape
    comparison: Comparison | None
    """None when the shape was not compared (``skipped`` says why)."""
    list_rv: str = ""
    exact: bool = True
    """The list was taken at the cache's own RV (else: at the apiserver's latest)."""
    skipped: str = ""


Progress = Callable[[StoredShape, int], None]
"""Told the objects listed so far, at most every ``progress_interval``."""


class _Expired(Exception):
    """The cache's RV is no longer available upstream."""


async def verify_shape(
    connection: sqlite3.Connection,
    upstream: Upstream,
    shape: StoredShape,
    *,
    settings: VerifySettings,
    progress: Progress,
) -> ShapeVerdict:
    """Compare one shape (see the module docstring). Raises UpstreamError when the apiserver
    refuses or cannot be reached, OutOfOrder when its list is not in key order."""
    connection.execute("BEGIN")
    try:
        rv, gen = connection.execute(
            "SELECT rv, gen FROM shapes WHERE id = ?", (shape.id,)
        ).fetchone()
        if rv is None:
            return ShapeVerdict(shape=shape, comparison=None, skipped="not filled yet")
        try:
            comparison = Comparison(
                cached=cached_items(connection, gen=gen), examples=settings.examples
            )
            list_rv = await _list(
                upstream, shape, comparison, at=rv, settings=settings, progress=progress
            )
            return ShapeVerdict(shape=shape, comparison=comparison, list_rv=list_rv)
        except _Expired:
            logger.info(
                "%s: RV %s is compacted upstream; comparing with the latest list", shape.key, rv
            )
        comparison = Comparison(
            cached=cached_items(connection, gen=gen),
            newer_than=rv,
            examples=settings.examples,
        )
        list_rv = await _list(
            upstream, shape, comparison, at=None, settings=settings, progress=progress
        )
        return ShapeVerdict(shape=shape, comparison=comparison, list_rv=list_rv, exact=False)
    finally:
        with contextlib.suppress(sqlite3.Error):
            connection.execute("COMMIT")


async def _list(
    upstream: Upstream,
    shape: StoredShape,
    comparison: Comparison,
    *,
    at: str | None,
    settings: VerifySettings,
    progress: Progress,
) -> str:
    """Feed the collection's list, page by page, to ``comparison``; the list's RV."""
    key = shape.key
    codec = codec_for(key.encoding)
    path = key.gvr.collection_path(namespace=key.namespace or None)
    base = {"limit": str(settings.page_size)}
    if at is not None:
        base |= {"resourceVersion": at, "resourceVersionMatch": "Exact"}
    if key.label_selector:
        base["labelSelector"] = key.label_selector
    if key.field_selector:
        base["fieldSelector"] = key.field_selector
    continue_token = list_rv = ""
    reported = time.monotonic()
    while True:
        params = dict(base)
        if continue_token:  # the token carries the list's RV; the apiserver refuses both
            params.pop("resourceVersion", None)
            params.pop("resourceVersionMatch", None)
            params["continue"] = continue_token
        async with upstream.request(
            "GET",
            (path, params),
            headers={"Accept": codec.accept},
            purpose="reflector",
            verb="LIST",
        ) as response:
            body = await response.read()
            if response.status == 410 and at is not None and not continue_token:
                raise _Expired
            if response.status >= 400:
                raise UpstreamStatusError.from_response(
                    code=response.status, body=body, headers=response.headers
                )
            check_content_type(codec, response.content_type)
        page = codec.page(body)
        list_rv = list_rv or page.rv
        comparison.feed(Item(namespace=c.namespace, name=c.name, rv=c.rv) for c in page.changes)
        if time.monotonic() - reported >= settings.progress_interval:
            reported = time.monotonic()
            progress(shape, comparison.listed)
        continue_token = page.continue_token
        if not continue_token:
            break
    if not list_rv:
        raise UpstreamProtocolError(f"LIST of {path} without resourceVersion")
    comparison.finish()
    return list_rv
