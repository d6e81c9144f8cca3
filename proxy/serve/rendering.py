"""Bytes on the wire for cached answers: list envelopes, watch frames, bookmarks, metadata.

Objects are served as the bytes the apiserver sent (kept in the cache); only the envelopes are
written here, in the apiserver's key order. A watch frame is ``{"type":T,"object":O}\\n``; a list
is ``{"kind":K,"apiVersion":V,"metadata":{"resourceVersion":RV},"items":[...]}\\n``.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.cache.records import ChangeType
from proxy.kube.payloads import INITIAL_EVENTS_END_ANNOTATION

METADATA_API_VERSION = "meta.k8s.io/v1"


def list_head(*, kind: str, api_version: str, rv: str) -> bytes:
    """The list up to ``"items":``; then ``[`` and the items, or :data:`NO_ITEMS` /
    :data:`NO_METADATA_ITEMS` when there are none."""
    return (
        b'{"kind":'
        + orjson.dumps(kind)
        + b',"apiVersion":'
        + orjson.dumps(api_version)
        + b',"metadata":{"resourceVersion":'
        + orjson.dumps(rv)
        + b'},"items":'
    )


LIST_TAIL = b"]}\n"
NO_ITEMS = b"[]}\n"
NO_METADATA_ITEMS = b"null}\n"
"""An empty ``PartialObjectMetadataList`` has ``"items":null`` from the apiserver (Go's nil
slice); typed lists have ``[]``."""


def watch_frame(event_type: ChangeType | str, raw: bytes) -> bytes:
    return b'{"type":"' + str(event_type).encode() + b'","object":' + raw + b"}\n"


def bookmark(*, kind: str, api_version: str, rv: str, initial_events_end: bool = False) -> bytes:
    """A BOOKMARK: an object of the watched kind carrying only its RV (and, ending a WatchList's
    initial events, the ``k8s.io/initial-events-end`` annotation)."""
    metadata: dict[str, Any] = {"resourceVersion": rv}
    if initial_events_end:
        metadata["annotations"] = {INITIAL_EVENTS_END_ANNOTATION: "true"}
    return watch_frame(
        ChangeType.BOOKMARK,
        orjson.dumps({"kind": kind, "apiVersion": api_version, "metadata": metadata}),
    )


def partial_metadata(raw: bytes) -> bytes:
    """The object reduced to ``PartialObjectMetadata`` (metadata-only clients)."""
    obj = orjson.loads(raw)
    return orjson.dumps(
        {
            "kind": "PartialObjectMetadata",
            "apiVersion": METADATA_API_VERSION,
            "metadata": obj.get("metadata", {}),
        }
    )
