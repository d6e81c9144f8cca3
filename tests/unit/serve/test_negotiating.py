"""Which representation and encoding an Accept header gets from the cache."""

from __future__ import annotations

import pytest

from proxy.cache.shapes import Encoding
from proxy.serve.negotiating import Negotiated, Representation, negotiate, status_encoding

PB = "application/vnd.kubernetes.protobuf"
FULL_JSON = Negotiated(representation=Representation.FULL, encoding=Encoding.JSON)
FULL_PB = Negotiated(representation=Representation.FULL, encoding=Encoding.PROTOBUF)
META_JSON = Negotiated(representation=Representation.METADATA, encoding=Encoding.JSON)
META_PB = Negotiated(representation=Representation.METADATA, encoding=Encoding.PROTOBUF)
PASS = Negotiated(representation=Representation.PASS_THROUGH)
METADATA_LIST = (
    f"{PB};as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,"
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
)


@pytest.mark.parametrize(
    ("accept", "single", "protobuf_ok", "expected"),
    [
        (None, False, True, FULL_JSON),
        ("application/json", False, True, FULL_JSON),
        (f"{PB},application/json", False, True, FULL_PB),  # kube-controller-manager
        (f"{PB},application/json", False, False, FULL_JSON),  # a custom resource
        (f"{PB};stream=watch", True, True, FULL_PB),
        (PB, False, False, PASS),  # protobuf only, for a CR: the apiserver's business
        (METADATA_LIST, False, True, META_PB),  # the garbage collector's metadata informers
        (METADATA_LIST, False, False, META_JSON),
        (METADATA_LIST.replace("List;", ";"), True, True, META_PB),
        (METADATA_LIST, True, True, FULL_JSON),  # List asked on a watch: the last range
        ("application/json;as=Table;g=meta.k8s.io;v=v1,application/json", False, True, PASS),
        ("application/yaml", False, True, PASS),
        ("application/cbor,application/json", False, True, FULL_JSON),
        ("*/*", False, True, FULL_JSON),
    ],
)
def test_negotiate(
    accept: str | None, single: bool, protobuf_ok: bool, expected: Negotiated
) -> None:
    assert negotiate(accept, single=single, protobuf_ok=protobuf_ok) == expected


@pytest.mark.parametrize(
    ("accept", "protobuf_ok", "expected"),
    [
        ("application/vnd.kubernetes.protobuf, application/json", True, Encoding.PROTOBUF),
        ("application/vnd.kubernetes.protobuf, application/json", False, Encoding.JSON),
        ("application/json, application/vnd.kubernetes.protobuf", True, Encoding.JSON),
        # a transformation is never offered for errors: the next range
        (
            "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,"
            "application/vnd.kubernetes.protobuf",
            True,
            Encoding.PROTOBUF,
        ),
        ("application/json;as=Table;v=v1;g=meta.k8s.io, application/json", True, Encoding.JSON),
        ("application/vnd.kubernetes.protobuf;stream=watch", True, Encoding.PROTOBUF),
        ("application/yaml", True, Encoding.JSON),
        (None, True, Encoding.JSON),
    ],
)
def test_a_status_is_written_in_the_encoding_the_apiserver_negotiates_for_errors(
    accept: str | None, protobuf_ok: bool, expected: Encoding
) -> None:
    assert status_encoding(accept, protobuf_ok=protobuf_ok) is expected
