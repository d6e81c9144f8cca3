"""How stored objects are written into answers: JSON list items as the apiserver's."""

from __future__ import annotations

import dataclasses

import orjson

from proxy.cache.filtering import Filter
from proxy.cache.records import ChangeType, EventRecord
from proxy.cache.shapes import Encoding, Shape, ShapeKey
from proxy.cache.tailing import ShapeLog
from proxy.kube.resources import GroupVersionResource
from proxy.kube.selectors import LabelSelector
from proxy.serve.rendering import Frames, Renderer

STORED = b'{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a"},"data":{"k":"v"}}'


def renderer(**options: object) -> Renderer:
    base: dict[str, object] = {
        "encoding": Encoding.JSON,
        "metadata_only": False,
        "kind": "ConfigMap",
        "api_version": "v1",
    }
    return Renderer(**(base | options))  # type: ignore[arg-type]


def test_built_in_list_items_omit_kind_and_api_version() -> None:
    """The apiserver's typed lists do; client-go's typed decoder keeps what items carry."""
    item = renderer(untyped_list_items=True).list_item(STORED)
    assert item == b'{"metadata":{"name":"a"},"data":{"k":"v"}}'
    # watch events and single objects still carry them
    assert renderer(untyped_list_items=True).single(STORED) == STORED
    assert b'"object":' + STORED in renderer(untyped_list_items=True).event("ADDED", STORED)


def test_custom_resource_items_and_metadata_items_keep_them() -> None:
    assert renderer().list_item(STORED) == STORED
    other_order = b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{}}'
    assert renderer(untyped_list_items=True).list_item(other_order) == other_order
    partial = orjson.loads(renderer(metadata_only=True, untyped_list_items=True).list_item(STORED))
    assert partial["kind"] == "PartialObjectMetadata"  # the apiserver's metadata items do


def _record(seq: int, raw: bytes = STORED) -> EventRecord:
    return EventRecord(
        seq=seq,
        type=ChangeType.MODIFIED,
        rv=str(seq),
        batch=False,
        namespace="",
        name="a",
        labels=b"{}",
        prev_labels=b"{}",
        prev_raw=None,
        raw=raw,
    )


def _shape() -> Shape:
    key = ShapeKey.of(GroupVersionResource.parse("v1/configmaps"))
    return Shape(
        id=1,
        key=key,
        configured=True,
        kind="ConfigMap",
        api_version="v1",
        rv="1",
        log_start_rv="1",
        used_at=0.0,
        log=ShapeLog(last_seq=0),
    )


def test_watchers_of_a_shape_share_each_frame_per_renderer_and_type() -> None:
    frames, shape = Frames(), _shape()
    record = _record(7)
    plain = frames.of(shape, renderer())
    assert frames.of(shape, renderer()) is plain  # equal renderers of two watches share
    first = plain.event(record, ChangeType.MODIFIED)
    assert first == renderer().event(ChangeType.MODIFIED, STORED)
    assert frames.of(shape, renderer()).event(record, ChangeType.MODIFIED) is first
    # another event type (a selector transition) or renderer is a frame of its own
    assert plain.event(record, ChangeType.ADDED).startswith(b'{"type":"ADDED"')
    metadata = frames.of(shape, renderer(metadata_only=True)).event(record, ChangeType.MODIFIED)
    assert b"PartialObjectMetadata" in metadata
    # another shape's record of the same seq is never confused with it
    other = frames.of(_shape(), renderer()).event(_record(7, raw=b'{"o":1}'), ChangeType.MODIFIED)
    assert b'{"o":1}' in other


def test_frames_are_bounded_in_bytes_oldest_first() -> None:
    kept = Frames(max_bytes=1000).of(_shape(), renderer())
    for seq in range(100):
        kept.event(_record(seq), ChangeType.MODIFIED)
    assert 0 < kept.size <= 1000
    assert min(key[0] for key in kept.by_key) > 90  # the newest are kept
    assert kept.size == sum(len(frame) for frame in kept.by_key.values())


def test_a_published_batch_is_joined_once_per_filter() -> None:
    """Parked watchers of equal filters send the same bytes for a batch: joined once."""
    frames = Frames().of(_shape(), renderer())
    labelled = dataclasses.replace(_record(2), labels=b'{"app":"x"}', prev_labels=b'{"app":"x"}')
    batch = (_record(1), labelled, _record(3))
    everything, selected = Filter(), Filter(labels=LabelSelector.parse("app=x"))
    data, count = frames.batch(batch, everything)
    assert count == 3 and data == b"".join(
        renderer().event(ChangeType.MODIFIED, STORED) for _ in range(3)
    )
    assert frames.batch(batch, Filter())[0] is data  # an equal filter: the same join
    assert frames.batch(batch, selected) == (renderer().event(ChangeType.MODIFIED, STORED), 1)
    # The next batch is joined afresh, even with the same records in it.
    assert frames.batch(list(batch), everything)[0] is not data
