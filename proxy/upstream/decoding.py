"""What the reflector reads from the apiserver, in either encoding: watch events and list pages.

A shape's encoding (``proxy.cache.shapes.Encoding``) decides how it is listed and watched:

- JSON: newline-delimited ``{"type":..,"object":..}`` events; each object's bytes are kept
  exactly as sent (``framing.event_object_bytes``); list items of built-in types get their
  ``kind`` / ``apiVersion`` added, since watch events and cached answers must carry them.
- protobuf: ``application/vnd.kubernetes.protobuf;stream=watch`` frames, each a 4-byte
  big-endian length and a ``WatchEvent`` whose object is a prefixed ``runtime.Unknown``; the
  object's own message (the envelope's ``raw``) is kept, byte for byte as the apiserver wrote
  it. The envelope is written again when serving, from the shape's kind and apiVersion.

An apiserver that answers a protobuf request in JSON (a custom resource) cannot fill a protobuf
shape: that is reported as a 406, which refuses the shape like any other first-list refusal.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from proxy.cache.records import Change, ChangeType, change_from_object, change_from_protobuf
from proxy.cache.shapes import Encoding
from proxy.kube import protobuf
from proxy.kube.payloads import INITIAL_EVENTS_END_ANNOTATION
from proxy.upstream.errors import UpstreamProtocolError, UpstreamStatusError
from proxy.upstream.framing import event_object_bytes, frame_batches, line_batches

_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"})


@dataclass(frozen=True, kw_only=True, slots=True)
class Event:
    """One upstream watch event, as far as the reflector needs it."""

    type: str
    kind: str = ""
    api_version: str = ""
    change: Change | None = None
    """ADDED / MODIFIED / DELETED."""
    rv: str = ""
    """BOOKMARK: its resourceVersion."""
    initial_events_end: bool = False
    """BOOKMARK: it ends a WatchList's initial events."""
    status: Mapping[str, Any] = field(default_factory=dict)
    """ERROR: the Status, as JSON would have it."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Page:
    """One page of a paginated LIST."""

    rv: str
    continue_token: str
    kind: str
    """The items' kind (the list's kind without ``List``)."""
    api_version: str
    changes: list[Change]
    remaining: int | None = None
    """Items in the following pages, when the apiserver says (``remainingItemCount``)."""


class Codec(Protocol):
    encoding: Encoding
    accept: str
    content_type: str

    def batches(self, chunks: AsyncIterable[bytes]) -> AsyncIterator[list[Event]]:
        """Events grouped by the chunk that completed them (one commit each)."""
        ...

    def page(self, body: bytes) -> Page: ...


def codec_for(encoding: Encoding) -> Codec:
    return PROTOBUF if encoding is Encoding.PROTOBUF else JSON


def error_event(status: Mapping[str, Any]) -> UpstreamStatusError:
    """The failure an ERROR event reports."""
    return UpstreamStatusError(
        code=int(status.get("code") or 500),
        reason=str(status.get("reason", "")),
        message=str(status.get("message", "")),
        status=status,
    )


def check_content_type(codec: Codec, content_type: str) -> None:
    """A protobuf request answered in another encoding cannot fill a protobuf shape."""
    if codec.encoding is Encoding.PROTOBUF and not content_type.startswith(protobuf.MEDIA_TYPE):
        message = f"the apiserver answers {content_type or 'no content type'}, not protobuf"
        raise UpstreamStatusError(
            code=406,
            reason="NotAcceptable",
            message=message,
            status={"kind": "Status", "code": 406, "reason": "NotAcceptable", "message": message},
        )


# ------------------------------------------------------------------------------------ JSON


def _json_event(line: bytes) -> Event:
    event = orjson.loads(line)
    if not isinstance(event, dict) or event.get("type") not in _TYPES:
        raise UpstreamProtocolError(f"not a watch event: {line[:200]!r}")
    kind, obj = event["type"], event.get("object") or {}
    if kind == "ERROR":
        return Event(type=kind, status=obj)
    metadata = obj.get("metadata") or {}
    if kind == "BOOKMARK":
        annotations = metadata.get("annotations") or {}
        return Event(
            type=kind,
            kind=str(obj.get("kind", "")),
            api_version=str(obj.get("apiVersion", "")),
            rv=str(metadata.get("resourceVersion", "")),
            initial_events_end=annotations.get(INITIAL_EVENTS_END_ANNOTATION) == "true",
        )
    return Event(
        type=kind,
        kind=str(obj.get("kind", "")),
        api_version=str(obj.get("apiVersion", "")),
        change=change_from_object(ChangeType(kind), obj, raw=event_object_bytes(line, event)),
    )


def _typed(item: dict[str, Any], kind: str, api_version: str) -> dict[str, Any]:
    """List items of built-in types omit kind/apiVersion; watch events must carry them."""
    if "kind" in item and "apiVersion" in item:
        return item
    return {"kind": kind, "apiVersion": api_version, **item}


class _Json:
    encoding = Encoding.JSON
    accept = "application/json"
    content_type = "application/json"

    async def batches(self, chunks: AsyncIterable[bytes]) -> AsyncIterator[list[Event]]:
        async for lines in line_batches(chunks):
            yield [_json_event(line) for line in lines]

    def page(self, body: bytes) -> Page:
        decoded = orjson.loads(body)
        if not isinstance(decoded, dict):
            raise UpstreamProtocolError("a LIST answer that is not a JSON object")
        metadata = decoded.get("metadata") or {}
        kind = str(decoded.get("kind", "")).removesuffix("List")
        api_version = str(decoded.get("apiVersion", ""))
        return Page(
            rv=str(metadata.get("resourceVersion", "")),
            continue_token=str(metadata.get("continue") or ""),
            kind=kind,
            api_version=api_version,
            changes=[
                change_from_object(ChangeType.ADDED, _typed(item, kind, api_version))
                for item in decoded.get("items") or []
            ],
            remaining=_count(metadata.get("remainingItemCount")),
        )


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# -------------------------------------------------------------------------------- protobuf


def _protobuf_event(message: bytes | memoryview) -> Event:
    event_type, enveloped = protobuf.watch_event(message)
    if event_type not in _TYPES:
        raise UpstreamProtocolError(f"not a watch event type: {event_type!r}")
    envelope = protobuf.unwrap(enveloped)
    if event_type == "ERROR":
        code, reason, text = protobuf.status_fields(envelope.raw)
        return Event(
            type=event_type,
            status={"kind": "Status", "code": code, "reason": reason, "message": text},
        )
    if event_type == "BOOKMARK":
        return Event(
            type=event_type,
            kind=envelope.kind,
            api_version=envelope.api_version,
            rv=protobuf.object_meta(envelope.raw).resource_version,
            initial_events_end=protobuf.annotations_of(envelope.raw).get(
                INITIAL_EVENTS_END_ANNOTATION
            )
            == "true",
        )
    return Event(
        type=event_type,
        kind=envelope.kind,
        api_version=envelope.api_version,
        change=change_from_protobuf(ChangeType(event_type), bytes(envelope.raw)),
    )


class _Protobuf:
    encoding = Encoding.PROTOBUF
    accept = f"{protobuf.MEDIA_TYPE}, application/json"
    content_type = protobuf.MEDIA_TYPE

    async def batches(self, chunks: AsyncIterable[bytes]) -> AsyncIterator[list[Event]]:
        async for frames in frame_batches(chunks):
            yield [_protobuf_event(frame) for frame in frames]

    def page(self, body: bytes) -> Page:
        envelope = protobuf.unwrap(body)
        meta, items = protobuf.list_parts(envelope.raw)
        return Page(
            rv=meta.resource_version,
            continue_token=meta.continue_token,
            kind=envelope.kind.removesuffix("List"),
            api_version=envelope.api_version,
            changes=[change_from_protobuf(ChangeType.ADDED, bytes(item)) for item in items],
            remaining=meta.remaining_item_count,
        )


JSON: Codec = _Json()
PROTOBUF: Codec = _Protobuf()
