"""How stored objects are written into answers: JSON list items as the apiserver's."""

from __future__ import annotations

import orjson

from proxy.cache.shapes import Encoding
from proxy.serve.rendering import Renderer

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
