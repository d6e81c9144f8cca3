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
        name="cm", namespace="ns", uid="uid-1", resource_version="12345", labels={}
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


# ------------------------------------------------------------------------------ writing

# The initial-events-end BOOKMARK frame of a protobuf WatchList of configmaps, as the real
# kube-apiserver v1.37.2 wrote it (captured from the test control plane).
APISERVER_BOOKMARK_FRAME = bytes.fromhex(
    "000000610a08424f4f4b4d41524b12550a536b3873000a0f0a0276311209436f6e6669674d617012380a36"
    "0a0012001a0022002a0032033536313800420062210a196b38732e696f2f696e697469616c2d6576656e74"
    "732d656e641204747275651a002200"
)


def test_a_bookmark_frame_has_the_apiservers_bytes() -> None:
    mine = protobuf.watch_frame(
        "BOOKMARK",
        protobuf.envelope(
            api_version="v1",
            kind="ConfigMap",
            raw=protobuf.bookmark_object(
                resource_version="561", annotations={"k8s.io/initial-events-end": "true"}
            ),
        ),
    )
    assert mine == APISERVER_BOOKMARK_FRAME


def test_a_watch_frame_round_trips() -> None:
    raw = configmap("cm", "ns", "77")
    frame = protobuf.watch_frame(
        "MODIFIED", protobuf.envelope(api_version="v1", kind="ConfigMap", raw=raw)
    )
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    event_type, enveloped = protobuf.watch_event(frame[4:])
    assert event_type == "MODIFIED"
    assert bytes(protobuf.unwrap(enveloped).raw) == raw


@pytest.mark.parametrize(
    "value", [0, 1, 0x7F, 0x80, 0x81, 0x3FFF, 0x4000, 0x1FFFFF, 2**35, 2**63 - 1]
)
def test_varint_at_each_width(value: int) -> None:
    assert protobuf.varint(value) == varint(value)
    assert protobuf.read_varint(protobuf.varint(value), 0) == (value, len(varint(value)))


@pytest.mark.parametrize("size", [10, 200, 20_000])
def test_a_watch_frame_of_envelope_parts_is_the_frame_of_the_envelope(size: int) -> None:
    raw = configmap("cm", "ns", "77") + b"\x00" * size
    parts = protobuf.envelope_parts(api_version="v1", kind="ConfigMap", raw=raw)
    whole = protobuf.envelope(api_version="v1", kind="ConfigMap", raw=raw)
    assert protobuf.watch_frame("ADDED", *parts) == protobuf.watch_frame("ADDED", whole)
    assert b"".join(parts) == whole


def test_a_list_is_its_envelope_meta_and_items() -> None:
    items = [configmap(f"c{i}", "ns", str(i)) for i in range(3)]
    body_raw = protobuf.list_meta(resource_version="9") + b"".join(
        protobuf.list_item(i) for i in items
    )
    assert len(body_raw) == len(protobuf.list_meta(resource_version="9")) + sum(
        protobuf.delimited_size(len(i)) for i in items
    )
    body = (
        protobuf.envelope_head(api_version="v1", kind="ConfigMapList", raw_length=len(body_raw))
        + body_raw
        + protobuf.ENVELOPE_TAIL
    )
    envelope = protobuf.unwrap(body)
    meta, parsed = protobuf.list_parts(envelope.raw)
    assert envelope.kind == "ConfigMapList" and meta.resource_version == "9"
    assert [bytes(p) for p in parsed] == items


def test_resource_version_replaced_in_place() -> None:
    raw = configmap("cm", "ns", "12")
    replaced = protobuf.with_resource_version(raw, "123456")
    assert protobuf.object_meta(replaced) == protobuf.ObjectMeta(
        name="cm", namespace="ns", uid="uid-1", resource_version="123456", labels={}
    )
    # Every other byte is kept: only field 6 and the lengths around it changed.
    assert replaced.endswith(raw[-14:])
    no_rv = field(1, field(1, b"x") + field(8, 1))
    assert protobuf.object_meta(protobuf.with_resource_version(no_rv, "5")).resource_version == "5"


def test_partial_object_metadata_and_labels() -> None:
    meta = field(1, b"cm") + field(11, field(1, b"team") + field(2, b"a"))
    raw = field(1, meta) + field(2, b"data")
    assert protobuf.partial_object_metadata(raw) == field(1, meta)
    assert protobuf.object_meta(raw).labels == {"team": "a"}
    assert protobuf.annotations_of(raw) == {}


def test_status_round_trips() -> None:
    message = protobuf.status(status="Failure", message="too old", reason="Expired", code=410)
    assert protobuf.status_fields(message) == (410, "Expired", "too old")


def test_object_meta_reads_every_field_in_one_pass() -> None:
    """The single-pass reader keeps protobuf's rules: the last occurrence of a field wins,
    map entries come in order, and other wire types are skipped."""
    meta = (
        field(1, b"old")
        + field(8, 7)  # generation: a varint, skipped
        + field(11, field(1, b"a") + field(2, b"1"))
        + field(1, b"cm")
        + field(12, field(1, b"note") + field(2, b"x"))
        + field(11, field(1, b"b") + field(2, b"2"))
        + field(6, b"42")
    )
    raw = field(1, meta) + field(2, b"data")
    assert protobuf.object_meta(raw) == protobuf.ObjectMeta(
        name="cm", namespace="", uid="", resource_version="42", labels={"a": "1", "b": "2"}
    )
    assert protobuf.annotations_of(raw) == {"note": "x"}


@pytest.mark.parametrize(
    "meta",
    [b"\x0a\x05ab", b"\x08", b"\x0b", b"\x09\x00\x00", b"\x00\x00", b"\x0a\xff"],
    ids=["short-string", "short-varint", "wire-3", "short-fixed64", "field-0", "short-length"],
)
def test_object_meta_of_malformed_input_raises(meta: bytes) -> None:
    with pytest.raises(protobuf.ProtobufError):
        protobuf.object_meta(field(1, meta))
