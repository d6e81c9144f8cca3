"""The Kubernetes protobuf wire format, read without generated schemas.

A protobuf body from the apiserver (apimachinery ``runtime/serializer/protobuf``) is the
4-byte prefix ``k8s\\x00`` and then a ``runtime.Unknown`` message::

    Unknown { 1: TypeMeta { 1: apiVersion, 2: kind }, 2: raw, 3: contentEncoding,
              4: contentType }

``raw`` is the object's own message. Every built-in object has its ``ObjectMeta`` as field 1,
and ObjectMeta has ``name`` = 1, ``namespace`` = 3, ``uid`` = 5, ``resourceVersion`` = 6.
That is all warmwatch needs to read: the fields are found by number, so no generated type
and no per-type schema is involved.

Only the wire types Kubernetes messages use are understood: varint (0), 64-bit (1),
length-delimited (2) and 32-bit (5). Malformed input raises :class:`ProtobufError`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

PREFIX = b"k8s\x00"
"""Every protobuf body and every object in a watch event starts with this."""

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"


class ProtobufError(ValueError):
    """Not a well-formed message."""


def read_varint(data: bytes | memoryview, at: int) -> tuple[int, int]:
    """The varint at ``at`` and the offset after it."""
    value = shift = 0
    while True:
        if at >= len(data):
            raise ProtobufError("truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise ProtobufError("varint longer than 64 bits")


def fields(data: bytes | memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """``(field number, wire type, value)`` for each field of a message, in order: an int
    for varint and fixed-width fields, the bytes (a view, no copy) for length-delimited."""
    view = memoryview(data)
    at = 0
    while at < len(view):
        tag, at = read_varint(view, at)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise ProtobufError("field number 0")
        if wire == 0:
            value, at = read_varint(view, at)
            yield number, wire, value
        elif wire == 2:
            length, at = read_varint(view, at)
            if at + length > len(view):
                raise ProtobufError("truncated length-delimited field")
            yield number, wire, view[at : at + length]
            at += length
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            if at + width > len(view):
                raise ProtobufError("truncated fixed-width field")
            yield number, wire, int.from_bytes(view[at : at + width], "little")
            at += width
        else:
            raise ProtobufError(f"unsupported wire type {wire}")


def _delimited(
    data: bytes | memoryview, *, repeated: int = 0
) -> tuple[dict[int, memoryview], list[memoryview]]:
    """A message's length-delimited fields in one pass: the last occurrence of each (protobuf:
    last one wins), and every occurrence of field ``repeated`` (a repeated field or a map)
    in order. Other fields are skipped; malformed input raises as :func:`fields` does.

    This is the hot path of a fill (every object's envelope and ObjectMeta): one walk per
    message, and the one-byte varints of tags and short lengths read inline."""
    view = memoryview(data)
    end = len(view)
    found: dict[int, memoryview] = {}
    entries: list[memoryview] = []
    at = 0
    while at < end:
        tag = view[at]
        if tag < 0x80:
            at += 1
        else:
            tag, at = read_varint(view, at)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise ProtobufError("field number 0")
        if wire == 2:
            if at < end and view[at] < 0x80:
                length = view[at]
                at += 1
            else:
                length, at = read_varint(view, at)
            stop = at + length
            if stop > end:
                raise ProtobufError("truncated length-delimited field")
            if number == repeated:
                entries.append(view[at:stop])
            else:
                found[number] = view[at:stop]
            at = stop
        elif wire == 0:
            _, at = read_varint(view, at)
        elif wire in (1, 5):
            at += 8 if wire == 1 else 4
            if at > end:
                raise ProtobufError("truncated fixed-width field")
        else:
            raise ProtobufError(f"unsupported wire type {wire}")
    return found, entries


def _first(data: bytes | memoryview, number: int) -> memoryview | None:
    """The last occurrence of length-delimited field ``number`` (protobuf: last one wins)."""
    return _delimited(data)[0].get(number)


def _decoded(value: memoryview | None) -> str:
    return str(value, "utf-8") if value is not None else ""


def _text(data: bytes | memoryview | None, number: int) -> str:
    return _decoded(_first(data, number)) if data is not None else ""


@dataclass(frozen=True, kw_only=True, slots=True)
class Envelope:
    """A ``runtime.Unknown``: the type it names and the object's own message."""

    api_version: str
    kind: str
    raw: memoryview


def unwrap(body: bytes | memoryview) -> Envelope:
    """Read the ``k8s\\x00`` prefix and the ``runtime.Unknown`` envelope."""
    view = memoryview(body)
    if view[: len(PREFIX)] != PREFIX:
        raise ProtobufError("no k8s protobuf prefix")
    unknown, _ = _delimited(view[len(PREFIX) :])
    type_meta, _ = _delimited(unknown[1]) if 1 in unknown else ({}, [])
    return Envelope(
        api_version=_decoded(type_meta.get(1)),
        kind=_decoded(type_meta.get(2)),
        raw=unknown.get(2, memoryview(b"")),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class ObjectMeta:
    name: str
    namespace: str
    uid: str
    resource_version: str
    labels: dict[str, str]


def object_meta(raw: bytes | memoryview) -> ObjectMeta:
    """The ObjectMeta (field 1) of an object's own message, with its ``labels`` (field 11, a
    map: entries of key 1, value 2)."""
    meta = _first(raw, 1)
    found, entries = _delimited(meta, repeated=11) if meta is not None else ({}, [])
    return ObjectMeta(
        name=_decoded(found.get(1)),
        namespace=_decoded(found.get(3)),
        uid=_decoded(found.get(5)),
        resource_version=_decoded(found.get(6)),
        labels=_string_map(entries),
    )


def _string_map(entries: list[memoryview]) -> dict[str, str]:
    """A ``map<string, string>`` from its entries (key 1, value 2; a later key wins)."""
    mapping = {}
    for entry in entries:
        parts, _ = _delimited(entry)
        mapping[_decoded(parts.get(1))] = _decoded(parts.get(2))
    return mapping


# ------------------------------------------------------------------------------ reading more


def annotations_of(raw: bytes | memoryview) -> dict[str, str]:
    """ObjectMeta's ``annotations`` (field 12, a map like ``labels``)."""
    meta = _first(raw, 1)
    _, entries = _delimited(meta, repeated=12) if meta is not None else ({}, [])
    return _string_map(entries)


def status_fields(raw: bytes | memoryview) -> tuple[int, str, str]:
    """A ``Status`` message's code (6), reason (4) and message (3)."""
    code = 0
    for number, wire, value in fields(raw):
        if number == 6 and wire == 0:
            assert isinstance(value, int)
            code = value
    return code, _text(raw, 4), _text(raw, 3)


@dataclass(frozen=True, kw_only=True, slots=True)
class ListMeta:
    resource_version: str
    continue_token: str
    remaining_item_count: int | None = None
    """Set on a page of a paginated list: how many items the following pages hold."""


def list_parts(raw: bytes | memoryview) -> tuple[ListMeta, list[memoryview]]:
    """A list message (``XList { 1: ListMeta, 2: items... }``): its ListMeta and its items'
    own messages, as views into ``raw``."""
    meta: memoryview | None = None
    items: list[memoryview] = []
    for number, wire, value in fields(raw):
        if wire != 2:
            continue
        assert isinstance(value, memoryview)
        if number == 1:
            meta = value
        elif number == 2:
            items.append(value)
    remaining = None
    if meta is not None:
        for number, wire, value in fields(meta):
            if number == 4 and wire == 0:
                assert isinstance(value, int)
                remaining = value
    list_meta = ListMeta(
        resource_version=_text(meta, 2),
        continue_token=_text(meta, 3),
        remaining_item_count=remaining,
    )
    return list_meta, items


def watch_event(message: bytes | memoryview) -> tuple[str, memoryview]:
    """A ``WatchEvent { 1: type, 2: RawExtension { 1: raw } }``: its type and its object,
    itself a prefixed ``runtime.Unknown``."""
    event, _ = _delimited(message)
    extension = event.get(2)
    raw = _first(extension, 1) if extension is not None else None
    return _decoded(event.get(1)), raw if raw is not None else memoryview(b"")


# ------------------------------------------------------------------------------ writing
#
# The apiserver's messages are generated by gogo-protobuf, which writes fields in number order
# and writes non-pointer strings and numbers even when empty: the envelopes below do the same,
# so a list or watch event from warmwatch has the apiserver's bytes (docs/design.md §5).


def varint(value: int) -> bytes:
    if value < 0x80:  # tags, and the lengths of most strings: one byte
        return _BYTES[value]
    if value < 0x4000:  # the lengths of most objects (up to 16 KiB): two bytes, no loop
        return bytes((value & 0x7F | 0x80, value >> 7))
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


_BYTES = tuple(bytes((i,)) for i in range(0x80))


def delimited(number: int, payload: bytes | memoryview) -> bytes:
    """Field ``number`` as a length-delimited field (a string, bytes or a message)."""
    return varint(number << 3 | 2) + varint(len(payload)) + bytes(payload)


def _string(number: int, text: str) -> bytes:
    return delimited(number, text.encode())


def delimited_size(length: int) -> int:
    """Bytes a length-delimited field with a one-byte tag and ``length`` bytes takes."""
    return 1 + len(varint(length)) + length


ENVELOPE_TAIL = b"\x1a\x00\x22\x00"
"""``runtime.Unknown``'s empty contentEncoding (3) and contentType (4), after ``raw``."""


@functools.lru_cache(maxsize=256)
def _envelope_start(api_version: str, kind: str) -> bytes:
    """Prefix and ``runtime.Unknown`` up to the tag of its ``raw``: the same for every
    object of a kind (computed once: envelopes are written for every watch event)."""
    type_meta = _string(1, api_version) + _string(2, kind)
    return PREFIX + delimited(1, type_meta) + b"\x12"


def envelope_head(*, api_version: str, kind: str, raw_length: int) -> bytes:
    """Prefix and ``runtime.Unknown`` up to its ``raw`` bytes, which are ``raw_length`` long
    and follow (then :data:`ENVELOPE_TAIL`): a list can be streamed once its length is known."""
    return _envelope_start(api_version, kind) + varint(raw_length)


def envelope(*, api_version: str, kind: str, raw: bytes | memoryview) -> bytes:
    """``raw`` as a complete protobuf body (or watch event object)."""
    return b"".join(envelope_parts(api_version=api_version, kind=kind, raw=raw))


def envelope_parts(
    *, api_version: str, kind: str, raw: bytes | memoryview
) -> tuple[bytes, bytes | memoryview, bytes]:
    """:func:`envelope` before it is joined: head, ``raw``, tail. A watch frame joins them
    with its own header in one copy (:func:`watch_frame`)."""
    return (
        envelope_head(api_version=api_version, kind=kind, raw_length=len(raw)),
        raw,
        ENVELOPE_TAIL,
    )


def list_meta(*, resource_version: str) -> bytes:
    """``XList``'s field 1: ListMeta with selfLink, resourceVersion and continue."""
    return delimited(1, b"\x0a\x00" + _string(2, resource_version) + b"\x1a\x00")


def list_item(raw: bytes | memoryview) -> bytes:
    """One item of a list message (field 2)."""
    return delimited(2, raw)


def watch_frame(event_type: str, *enveloped: bytes | memoryview) -> bytes:
    """One frame of a protobuf watch stream: a 4-byte big-endian length, then the WatchEvent
    ``{ 1: type, 2: RawExtension { 1: enveloped } }``, joined once (no copy per level).
    ``enveloped`` may come in parts (:func:`envelope_parts`), which are concatenated."""
    type_field = _event_type(event_type)
    enveloped_length = sum(map(len, enveloped))
    raw_field = b"\x0a" + varint(enveloped_length)
    extension_length = len(raw_field) + enveloped_length
    extension_field = b"\x12" + varint(extension_length)
    length = len(type_field) + len(extension_field) + extension_length
    return b"".join((length.to_bytes(4, "big"), type_field, extension_field, raw_field, *enveloped))


@functools.lru_cache(maxsize=16)
def _event_type(event_type: str) -> bytes:
    return _string(1, event_type)


def _replace_in_meta(raw: bytes | memoryview, number: int, value: bytes) -> bytes:
    """``raw`` (an object's message) with ObjectMeta field ``number`` set to ``value``."""
    out = bytearray()
    for n, wire, item in fields(raw):
        if n == 1 and wire == 2:
            assert isinstance(item, memoryview)
            meta = bytearray()
            replaced = False
            for m, meta_wire, meta_item in fields(item):
                if m == number:
                    if not replaced:
                        meta += delimited(number, value)
                        replaced = True
                    continue
                if not replaced and m > number:
                    meta += delimited(number, value)
                    replaced = True
                meta += _field_bytes(m, meta_wire, meta_item)
            if not replaced:
                meta += delimited(number, value)
            out += delimited(1, bytes(meta))
        else:
            out += _field_bytes(n, wire, item)
    return bytes(out)


def _field_bytes(number: int, wire: int, value: int | memoryview) -> bytes:
    if wire == 2:
        assert isinstance(value, memoryview)
        return delimited(number, value)
    assert isinstance(value, int)
    tag = varint(number << 3 | wire)
    if wire == 0:
        return tag + varint(value)
    return tag + value.to_bytes(8 if wire == 1 else 4, "little")


def with_resource_version(raw: bytes | memoryview, resource_version: str) -> bytes:
    """The object's message with ``metadata.resourceVersion`` replaced."""
    return _replace_in_meta(raw, 6, resource_version.encode())


def partial_object_metadata(raw: bytes | memoryview) -> bytes:
    """``PartialObjectMetadata { 1: ObjectMeta }`` of an object's message.

    The apiserver writes ObjectMeta first, so that message is the object's own first field,
    byte for byte: a slice, without reading the rest of the object."""
    if raw[:1] == b"\x0a":
        length, at = read_varint(raw, 1)
        if at + length <= len(raw):
            return bytes(raw[: at + length])
    meta = _first(raw, 1)
    return delimited(1, meta if meta is not None else b"")


def bookmark_object(*, resource_version: str, annotations: dict[str, str]) -> bytes:
    """The message of a BOOKMARK's object: ObjectMeta with the RV and annotations only
    (every built-in type's field 1 is its ObjectMeta, so it decodes as the watched kind), with
    the empty fields the apiserver writes (name .. uid, generation, creationTimestamp)."""
    meta = (
        b"\x0a\x00\x12\x00\x1a\x00\x22\x00\x2a\x00"
        + _string(6, resource_version)
        + b"\x38\x00\x42\x00"
        + b"".join(
            delimited(12, _string(1, key) + _string(2, value))
            for key, value in sorted(annotations.items())
        )
    )
    return delimited(1, meta)


def status(
    *,
    status: str,
    message: str,
    reason: str,
    code: int,
    continue_token: str = "",
    details: bytes | None = None,
) -> bytes:
    """A ``Status`` message: ListMeta 1 (selfLink, resourceVersion, continue), status 2,
    message 3, reason 4, details 5 (only when given: a pointer in Go), code 6."""
    return (
        delimited(1, b"\x0a\x00\x12\x00" + _string(3, continue_token))
        + _string(2, status)
        + _string(3, message)
        + _string(4, reason)
        + (delimited(5, details) if details is not None else b"")
        + varint(6 << 3)
        + varint(code)
    )


def status_details(
    *,
    name: str,
    group: str,
    kind: str,
    causes: Iterable[tuple[str, str, str]],
    retry_after_seconds: int,
    uid: str,
) -> bytes:
    """A ``StatusDetails`` message: name 1, group 2, kind 3, causes 4 (each a ``StatusCause``:
    type 1, message 2, field 3), retryAfterSeconds 5, uid 6."""
    return (
        _string(1, name)
        + _string(2, group)
        + _string(3, kind)
        + b"".join(
            delimited(4, _string(1, kind_) + _string(2, message) + _string(3, field))
            for kind_, message, field in causes
        )
        + varint(5 << 3)
        + varint(retry_after_seconds)
        + _string(6, uid)
    )
