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

from collections.abc import Iterator
from dataclasses import dataclass

PREFIX = b"k8s\x00"
"""Every protobuf body and every object in a watch event starts with this."""

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"


class ProtobufError(ValueError):
    """Not a well-formed message."""


def _varint(data: bytes | memoryview, at: int) -> tuple[int, int]:
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
        tag, at = _varint(view, at)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise ProtobufError("field number 0")
        if wire == 0:
            value, at = _varint(view, at)
            yield number, wire, value
        elif wire == 2:
            length, at = _varint(view, at)
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


def _first(data: bytes | memoryview, number: int) -> memoryview | None:
    """The last occurrence of length-delimited field ``number`` (protobuf: last one wins)."""
    found = None
    for n, wire, value in fields(data):
        if n == number and wire == 2:
            assert isinstance(value, memoryview)
            found = value
    return found


def _text(data: bytes | memoryview | None, number: int) -> str:
    value = _first(data, number) if data is not None else None
    return bytes(value).decode() if value is not None else ""


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
    unknown = view[len(PREFIX) :]
    type_meta = _first(unknown, 1)
    raw = _first(unknown, 2)
    return Envelope(
        api_version=_text(type_meta, 1),
        kind=_text(type_meta, 2),
        raw=raw if raw is not None else memoryview(b""),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class ObjectMeta:
    name: str
    namespace: str
    uid: str
    resource_version: str


def object_meta(raw: bytes | memoryview) -> ObjectMeta:
    """The ObjectMeta (field 1) of an object's own message."""
    meta = _first(raw, 1)
    return ObjectMeta(
        name=_text(meta, 1),
        namespace=_text(meta, 3),
        uid=_text(meta, 5),
        resource_version=_text(meta, 6),
    )
