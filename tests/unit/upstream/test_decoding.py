"""What the reflector reads, in both encodings: events split across chunks, list pages, and a
protobuf request answered in JSON (no sockets)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest

from proxy.cache.records import ChangeType
from proxy.cache.shapes import Encoding
from proxy.kube import protobuf
from proxy.upstream.decoding import JSON, PROTOBUF, check_content_type, codec_for
from proxy.upstream.errors import UpstreamStatusError
from proxy.upstream.framing import FramingError
from tests.unit.kube.test_protobuf import configmap


async def chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


def pb_event(event_type: str, raw: bytes, kind: str = "ConfigMap") -> bytes:
    return protobuf.watch_frame(event_type, protobuf.envelope(api_version="v1", kind=kind, raw=raw))


@pytest.mark.parametrize("size", [1, 7, 4096])
async def test_protobuf_frames_in_any_chunking(size: int) -> None:
    stream = (
        pb_event("ADDED", configmap("a", "ns", "10"))
        + pb_event("DELETED", configmap("b", "ns", "11"))
        + pb_event(
            "BOOKMARK",
            protobuf.bookmark_object(
                resource_version="12", annotations={"k8s.io/initial-events-end": "true"}
            ),
        )
        + pb_event(
            "ERROR",
            protobuf.status(status="Failure", message="gone", reason="Expired", code=410),
            kind="Status",
        )
    )
    events = [e async for batch in PROTOBUF.batches(chunks(stream, size)) for e in batch]
    assert [e.type for e in events] == ["ADDED", "DELETED", "BOOKMARK", "ERROR"]
    added = events[0].change
    assert added is not None and (added.type, added.name, added.rv) == (ChangeType.ADDED, "a", "10")
    assert added.raw == configmap("a", "ns", "10")  # the object's own message, as sent
    assert (events[0].kind, events[0].api_version) == ("ConfigMap", "v1")
    assert events[2].rv == "12" and events[2].initial_events_end
    assert events[3].status["code"] == 410 and events[3].status["reason"] == "Expired"


async def test_a_protobuf_stream_cut_inside_a_frame_is_an_error() -> None:
    frame = pb_event("ADDED", configmap("a", "ns", "10"))
    with pytest.raises(FramingError):
        async for _ in PROTOBUF.batches(chunks(frame[:-3], 5)):
            pass


async def test_json_events() -> None:
    obj = {
        "kind": "ConfigMap",
        "apiVersion": "v1",
        "metadata": {"name": "a", "resourceVersion": "5"},
    }
    stream = orjson.dumps({"type": "ADDED", "object": obj}) + b"\n"
    events = [e async for batch in JSON.batches(chunks(stream, 3)) for e in batch]
    assert events[0].change is not None and events[0].change.raw == orjson.dumps(obj)


def test_pages_in_both_encodings() -> None:
    items = [configmap(f"c{i}", "ns", str(i)) for i in range(2)]
    raw = protobuf.list_meta(resource_version="9") + b"".join(protobuf.list_item(i) for i in items)
    page = PROTOBUF.page(protobuf.envelope(api_version="v1", kind="ConfigMapList", raw=raw))
    assert (page.rv, page.kind, page.api_version, page.continue_token) == (
        "9",
        "ConfigMap",
        "v1",
        "",
    )
    assert [c.name for c in page.changes] == ["c0", "c1"]
    body = orjson.dumps(
        {
            "kind": "ConfigMapList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": "9", "continue": "next"},
            "items": [{"metadata": {"name": "x", "resourceVersion": "3"}}],
        }
    )
    page = JSON.page(body)
    assert page.continue_token == "next"
    assert orjson.loads(page.changes[0].raw)["kind"] == "ConfigMap"  # kind added to items
    assert page.remaining is None


def test_pages_say_how_many_items_follow() -> None:
    meta = (
        protobuf.delimited(2, b"9")
        + protobuf.delimited(3, b"tok")
        + b"\x20"
        + protobuf.varint(1234)
    )
    raw = protobuf.delimited(1, meta) + protobuf.list_item(configmap("c", "ns", "3"))
    page = PROTOBUF.page(protobuf.envelope(api_version="v1", kind="ConfigMapList", raw=raw))
    assert (page.rv, page.continue_token, page.remaining) == ("9", "tok", 1234)
    body = orjson.dumps(
        {"kind": "ConfigMapList", "metadata": {"resourceVersion": "9", "remainingItemCount": 77}}
    )
    assert JSON.page(body).remaining == 77


def test_a_protobuf_shape_refuses_a_json_answer() -> None:
    check_content_type(PROTOBUF, "application/vnd.kubernetes.protobuf;stream=watch")
    check_content_type(JSON, "application/json")
    with pytest.raises(UpstreamStatusError) as refused:
        check_content_type(codec_for(Encoding.PROTOBUF), "application/json")
    assert refused.value.code == 406
