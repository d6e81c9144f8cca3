"""Bytes on the wire for cached answers: list envelopes, watch frames, bookmarks, metadata.

Objects are served as the bytes the apiserver sent (kept in the cache); only the envelopes are
written here, in the apiserver's key order. A watch frame is ``{"type":T,"object":O}\\n``; a list
is ``{"kind":K,"apiVersion":V,"metadata":{"resourceVersion":RV},"items":[...]}\\n``.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from proxy.cache.filtering import Filter, event_object
from proxy.cache.records import ChangeType, EventRecord
from proxy.cache.shapes import Encoding, Shape
from proxy.kube import protobuf
from proxy.kube.payloads import INITIAL_EVENTS_END_ANNOTATION
from proxy.kube.status import StatusError

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


# ---------------------------------------------------------------------------- per encoding


@dataclass(frozen=True, kw_only=True, slots=True)
class Renderer:
    """How one watch or list is written: its encoding, and full objects or metadata only.

    ``kind`` / ``api_version`` are the shape's objects'; metadata-only answers use
    ``PartialObjectMetadata`` of ``meta.k8s.io/v1`` instead. A protobuf object is stored as its
    own message and enveloped here (prefix, ``runtime.Unknown``), as the apiserver writes it.
    """

    encoding: Encoding
    metadata_only: bool
    kind: str
    api_version: str
    untyped_list_items: bool = False
    """The items of a full JSON list omit ``kind`` and ``apiVersion``, as the apiserver's do
    for built-in types (its typed lists); custom resources' items keep them."""
    _typed_prefix: bytes = field(init=False, repr=False, default=b"")

    def __post_init__(self) -> None:
        prefix = b'{"kind":' + orjson.dumps(self.kind) + b',"apiVersion":'
        object.__setattr__(self, "_typed_prefix", prefix + orjson.dumps(self.api_version) + b",")

    @property
    def object_kind(self) -> str:
        return "PartialObjectMetadata" if self.metadata_only else self.kind

    @property
    def object_api_version(self) -> str:
        return METADATA_API_VERSION if self.metadata_only else self.api_version

    @property
    def list_kind(self) -> str:
        return f"{self.object_kind}List"

    @property
    def content_type(self) -> str:
        """Of a whole answer (a list, an object); watches have :attr:`watch_content_type`."""
        return protobuf.MEDIA_TYPE if self.encoding is Encoding.PROTOBUF else "application/json"

    @property
    def watch_content_type(self) -> str:
        if self.encoding is Encoding.PROTOBUF:
            return f"{protobuf.MEDIA_TYPE};stream=watch"
        return "application/json"

    def object(self, raw: bytes) -> bytes:
        """A stored object as served (its own message, for protobuf)."""
        if not self.metadata_only:
            return raw
        if self.encoding is Encoding.PROTOBUF:
            return protobuf.partial_object_metadata(raw)
        return partial_metadata(raw)

    def list_item(self, raw: bytes) -> bytes:
        """A stored object as an item of a JSON list. Stored objects carry ``kind`` and
        ``apiVersion`` first (watch events need them), as ``{"kind":K,"apiVersion":V,``;
        where the apiserver's items omit them, that prefix is cut."""
        if self.metadata_only or not self.untyped_list_items:
            return self.object(raw)
        prefix = self._typed_prefix
        return b"{" + raw[len(prefix) :] if raw.startswith(prefix) else raw

    def single(self, raw: bytes) -> bytes:
        """A stored object as the whole answer to a GET (enveloped, for protobuf)."""
        if self.encoding is Encoding.JSON:
            return self.object(raw)
        return protobuf.envelope(
            api_version=self.object_api_version, kind=self.object_kind, raw=self.object(raw)
        )

    def event(self, event_type: ChangeType | str, raw: bytes) -> bytes:
        """One watch event for a stored object."""
        if self.encoding is Encoding.JSON:
            return watch_frame(event_type, self.object(raw))
        return protobuf.watch_frame(
            str(event_type),
            *protobuf.envelope_parts(
                api_version=self.object_api_version, kind=self.object_kind, raw=self.object(raw)
            ),
        )

    def bookmark(self, *, rv: str, initial_events_end: bool = False) -> bytes:
        if self.encoding is Encoding.JSON:
            return bookmark(
                kind=self.object_kind,
                api_version=self.object_api_version,
                rv=rv,
                initial_events_end=initial_events_end,
            )
        annotations = {INITIAL_EVENTS_END_ANNOTATION: "true"} if initial_events_end else {}
        message = protobuf.bookmark_object(resource_version=rv, annotations=annotations)
        return protobuf.watch_frame(
            ChangeType.BOOKMARK,
            protobuf.envelope(
                api_version=self.object_api_version, kind=self.object_kind, raw=message
            ),
        )

    def error(self, error: StatusError) -> bytes:
        """An ERROR event carrying the Status."""
        if self.encoding is Encoding.JSON:
            return watch_frame("ERROR", error.to_json())
        return protobuf.watch_frame("ERROR", error.to_protobuf())

    def list_item_size(self, *, length: int, head: bytes) -> int:
        """The bytes a stored object of ``length`` (whose raw starts with ``head``) takes as
        an item of a protobuf list: the sizing pass before a protobuf list is streamed."""
        if self.metadata_only:
            if not head.startswith(b"\x0a"):
                raise ValueError("an object whose first field is not its ObjectMeta")
            meta_length, _ = protobuf.read_varint(head, 1)
            length = protobuf.delimited_size(meta_length)
        return protobuf.delimited_size(length)


# ---------------------------------------------------------------------------- shared frames

FRAMES_PER_SHAPE_BYTES: Final = 4 * 1024 * 1024
"""Rendered watch frames kept per shape, oldest dropped first: the newest records, which is
what live watchers send (one that lags further renders its own)."""


class Frames:
    """Watch frames of committed records, shared by the watchers of a shape.

    A record is sent to every watcher of its shape that admits it, and they would each build
    the same bytes: its frame depends only on the record, the event type the watcher's filter
    chose and the renderer (encoding, metadata-only). So each is rendered once (with 100
    watchers, rendering was a fifth of the event loop's time). A watch looks up its
    :class:`ShapeFrames` once (:meth:`of`); they are keyed by the shape object itself, held
    weakly: a dropped shape's frames go with it, and a new shape with the same id never meets
    them.
    """

    def __init__(self, *, max_bytes: int = FRAMES_PER_SHAPE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._shapes: weakref.WeakKeyDictionary[Shape, dict[Renderer, ShapeFrames]] = (
            weakref.WeakKeyDictionary()
        )

    def of(self, shape: Shape, renderer: Renderer) -> ShapeFrames:
        """The frames of ``shape``'s records as ``renderer`` writes them."""
        renderers = self._shapes.get(shape)
        if renderers is None:
            renderers = self._shapes[shape] = {}
        frames = renderers.get(renderer)
        if frames is None:
            frames = renderers[renderer] = ShapeFrames(renderer, max_bytes=self.max_bytes)
        return frames


class ShapeFrames:
    """One shape's frames in one rendering, the newest kept up to ``max_bytes``."""

    __slots__ = ("_batch_of", "_batches", "by_key", "max_bytes", "renderer", "size")

    def __init__(self, renderer: Renderer, *, max_bytes: int) -> None:
        self.renderer = renderer
        self.max_bytes = max_bytes
        self.by_key: dict[tuple[int, ChangeType], bytes] = {}
        self.size = 0
        self._batch_of: Sequence[EventRecord] | None = None
        self._batches: dict[Filter, tuple[bytes, int]] = {}

    def batch(self, records: Sequence[EventRecord], view: Filter) -> tuple[bytes, int]:
        """The frames a watcher with filter ``view`` sends for ``records`` (a batch the
        writer just published), joined, and how many. Every watcher with an equal filter sends
        the same bytes, so they are joined once per batch and filter: the watchers that
        follow a shape parked (``Watch.offer``) share one join per commit. Only the newest
        batch is kept."""
        if records is not self._batch_of:
            self._batch_of = records
            self._batches.clear()
        joined = self._batches.get(view)
        if joined is None:
            frames = [
                self.event(record, event_type)
                for record in records
                if (event_type := view.event_type(record)) is not None
            ]
            joined = self._batches[view] = (b"".join(frames), len(frames))
        return joined

    def event(self, record: EventRecord, event_type: ChangeType) -> bytes:
        """The frame of ``record`` sent as ``event_type`` (``Filter.event_type``'s choice)."""
        key = (record.seq, event_type)
        frame = self.by_key.get(key)
        if frame is None:
            frame = self.renderer.event(event_type, event_object(record, event_type))
            self.by_key[key] = frame
            self.size += len(frame)
            while self.size > self.max_bytes:  # dicts keep insertion order: oldest first
                self.size -= len(self.by_key.pop(next(iter(self.by_key))))
        return frame
