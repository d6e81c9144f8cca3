"""Reading Kubernetes protobuf bodies by field number (no generated types)."""

from __future__ import annotations

import pytest

from proxy.kube import protobuf


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, value: bytes | int) -> bytes:
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    return varint(number << 3 | 2) + varint(len(value)) + value


def envelope(*, kind: str, raw: bytes, api_version: str = "v1") -> bytes:
    type_meta = field(1, api_version.encode()) + field(2, kind.encode())
    return protobuf.PREFIX + field(1, type_meta) + field(2, raw) + field(3, b"") + field(4, b"")


def configmap(name: str, namespace: str, rv: str) -> bytes:
    meta = (
        field(1, name.encode())
        + field(3, namespace.encode())
        + field(5, b"uid-1")
        + field(6, rv.encode())
        + field(8, 1)  # generation: a varint between the strings
    )
    return field(1, meta) + field(2, field(1, b"key") + field(2, b"value"))


def test_an_object_in_its_envelope() -> None:
    body = envelope(kind="ConfigMap", raw=configmap("cm", "ns", "12345"))
    unwrapped = protobuf.unwrap(body)
    assert (unwrapped.api_version, unwrapped.kind) == ("v1", "ConfigMap")
    meta = protobuf.object_meta(unwrapped.raw)
    assert meta == protobuf.ObjectMeta(
        name="cm", namespace="ns", uid="uid-1", resource_version="12345"
    )


def test_fixed_width_and_long_fields_are_skipped() -> None:
    raw = (
        varint(2 << 3 | 1)
        + b"\x00" * 8
        + varint(3 << 3 | 5)
        + b"\x00" * 4
        + field(4, b"x" * 300)  # a two-byte length
        + field(1, field(6, b"7"))
    )
    assert protobuf.object_meta(raw).resource_version == "7"


@pytest.mark.parametrize(
    "body",
    [
        b"{}",  # JSON
        protobuf.PREFIX + b"\x0a\x05ab",  # truncated length-delimited field
        protobuf.PREFIX + b"\x08\xff",  # truncated varint
        protobuf.PREFIX + b"\x0b",  # wire type 3 (groups): not used by Kubernetes
        protobuf.PREFIX + b"\x00\x01",  # field number 0
    ],
)
def test_malformed_input_raises(body: bytes) -> None:
    with pytest.raises(protobuf.ProtobufError):
        protobuf.unwrap(body)


def test_missing_fields_read_as_empty() -> None:
    assert protobuf.object_meta(b"").resource_version == ""
    assert protobuf.unwrap(protobuf.PREFIX).kind == ""
