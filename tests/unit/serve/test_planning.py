"""The cached-read plan (proxy/serve/planning.py), without sockets: one test per rule of the
README's "How requests are served" that decides between the cache and the apiserver."""

from __future__ import annotations

import base64
import itertools

import orjson
import pytest

from proxy.cache.shapes import Encoding, Request, Shape, ShapeKey, choose
from proxy.cache.tailing import ShapeLog
from proxy.kube.options import WatchStartKind
from proxy.kube.resources import GroupVersionResource, RequestPath
from proxy.kube.selectors import LabelSelector
from proxy.serve.planning import (
    Fill,
    PassThrough,
    Plan,
    ReadAttributes,
    Reject,
    Serve,
    Why,
    plan_object_get,
    plan_read,
)

CM = GroupVersionResource.parse("v1/configmaps")
WIDGETS = GroupVersionResource.parse("example.com/v1/widgets")
PB = "application/vnd.kubernetes.protobuf"
PB_THEN_JSON = f"{PB}, application/json"
METADATA = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
_ids = itertools.count(1)


class Held:
    """The collections warmwatch holds (``planning.Collections``), as the syncer reads them."""

    def __init__(self, *shapes: Shape) -> None:
        self.shapes = {shape.key: shape for shape in shapes}

    def find(self, request: Request, *, namespaced: bool | None) -> Shape | None:
        key = choose(request, self.shapes.keys(), namespaced=namespaced)
        return self.shapes.get(key) if key is not None else None

    def holds(self, gvr: GroupVersionResource) -> bool:
        return any(k.gvr == gvr and s.rv is not None for k, s in self.shapes.items())

    def has_protobuf(self, gvr: GroupVersionResource) -> bool:
        return gvr.may_have_protobuf


def shape(
    gvr: GroupVersionResource = CM,
    *,
    rv: str | None = "10",
    log_start_rv: str | None = "5",
    namespace: str | None = None,
    labels: str = "",
    encoding: Encoding = Encoding.JSON,
) -> Shape:
    key = ShapeKey.of(
        gvr,
        namespace=namespace,
        label_selector=LabelSelector.parse(labels),
        encoding=encoding,
    )
    return Shape(
        id=next(_ids),
        key=key,
        configured=True,
        kind="ConfigMap" if gvr == CM else "Widget",
        api_version=gvr.api_version,
        rv=rv,
        log_start_rv=log_start_rv,
        used_at=0.0,
        log=ShapeLog(last_seq=0),
    )


def plan(
    path: str,
    query: str = "",
    *,
    held: Held,
    accept: str | None = "application/json",
    learn: bool = True,
    max_key_bytes: int = 4096,
) -> Plan:
    parsed = RequestPath.parse(path)
    assert parsed is not None
    read = ReadAttributes.of(parsed, raw_query=query, accept=accept)
    return plan_read(read, held, learn=learn, max_key_bytes=max_key_bytes)


def served(result: Plan) -> Serve:
    assert isinstance(result, Serve), result
    return result


def passed(result: Plan) -> Why:
    assert isinstance(result, PassThrough), result
    return result.why


def continue_token() -> str:
    payload = orjson.dumps({"v": "meta.k8s.io/v1", "rv": 5, "start": "a"})
    return base64.urlsafe_b64encode(payload).decode().rstrip("=")


# ------------------------------------------------------------------------- LIST


@pytest.mark.parametrize("query", ["", "resourceVersion=0", "resourceVersion=7", "limit=5"])
def test_a_list_with_resource_version_unset_zero_or_not_older_than_is_served_from_the_cache(
    query: str,
) -> None:
    held = Held(cached := shape())
    result = served(plan("/api/v1/configmaps", query, held=held))
    assert result.shape is cached and result.start is None and result.why is Why.EQUAL


def test_a_not_older_than_list_waits_for_its_resource_version() -> None:
    """An N ahead of the cache waits (then is passed through: the plan's execution)."""
    result = served(plan("/api/v1/configmaps", "resourceVersion=12", held=Held(shape())))
    assert result.not_older_than == "12" and not result.most_recent
    unset = served(plan("/api/v1/configmaps", "resourceVersion=0", held=Held(shape())))
    assert unset.not_older_than is None


@pytest.mark.parametrize(
    ("query", "why"),
    [
        ("resourceVersion=5&resourceVersionMatch=Exact", Why.EXACT),
        (f"limit=10&continue={continue_token()}", Why.CONTINUE),
    ],
)
def test_exact_and_continue_lists_pass_through(query: str, why: Why) -> None:
    assert passed(plan("/api/v1/configmaps", query, held=Held(shape()))) is why


# ------------------------------------------------------------------------- WATCH


@pytest.mark.parametrize(
    ("path", "query", "kind"),
    [
        ("/api/v1/configmaps", "watch=1&resourceVersion=7", WatchStartKind.FROM_RESOURCE_VERSION),
        ("/api/v1/configmaps", "watch=1", WatchStartKind.INITIAL_STATE),
        ("/api/v1/configmaps", "watch=1&resourceVersion=0", WatchStartKind.INITIAL_STATE),
        (
            "/api/v1/configmaps",
            "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
            "&allowWatchBookmarks=true",
            WatchStartKind.INITIAL_STATE,
        ),
        ("/api/v1/watch/configmaps", "", WatchStartKind.INITIAL_STATE),
    ],
)
def test_a_watch_is_served_from_the_cache(path: str, query: str, kind: WatchStartKind) -> None:
    result = served(plan(path, query, held=Held(shape())))
    assert result.start is not None and result.start.kind is kind


def test_a_metadata_only_client_is_served_partial_object_metadata() -> None:
    result = served(plan("/api/v1/configmaps", held=Held(shape()), accept=METADATA))
    assert result.renderer.metadata_only and result.renderer.encoding is Encoding.JSON


# ------------------------------------------------------------------------- read your writes


def test_a_most_recent_read_waits_for_your_writes_first() -> None:
    """``resourceVersion`` unset: served once the cache shows the writes made through
    warmwatch (else passed through: the plan's execution); ``"0"`` and ``N`` do not wait."""
    held = Held(shape())
    assert served(plan("/api/v1/configmaps", held=held)).most_recent
    assert served(plan("/api/v1/configmaps", "watch=1", held=held)).most_recent
    assert not served(plan("/api/v1/configmaps", "resourceVersion=0", held=held)).most_recent
    assert not served(
        plan("/api/v1/configmaps", "watch=1&resourceVersion=7", held=held)
    ).most_recent


# ------------------------------------------------------------------------- bad queries


@pytest.mark.parametrize("accept", ["application/json", PB_THEN_JSON])
def test_a_bad_query_of_a_listed_collection_gets_the_apiservers_status(accept: str) -> None:
    held = Held(shape())
    bad = plan("/api/v1/configmaps", "labelSelector=a%20in", held=held, accept=accept)
    assert isinstance(bad, Reject) and bad.error.code == 400
    forbidden = plan("/api/v1/configmaps", "resourceVersionMatch=Exact", held=held, accept=accept)
    assert isinstance(forbidden, Reject) and forbidden.error.code == 422


@pytest.mark.parametrize(
    ("path", "held", "accept"),
    [
        ("/api/v1/configmaps", Held(), "application/json"),  # never listed: maybe a 404
        ("/api/v1/configmaps", Held(shape(rv=None)), "application/json"),  # not yet listed
        ("/api/v1/configmaps", Held(shape()), "application/yaml"),  # the apiserver's 406
    ],
)
def test_an_unknown_resource_or_an_unserved_media_type_is_answered_by_the_apiserver(
    path: str, held: Held, accept: str
) -> None:
    result = plan(path, "labelSelector=a%20in", held=held, accept=accept)
    assert passed(result) is Why.APISERVER_VALIDATES


def test_a_watchs_unparsable_resource_version_is_the_apiservers_internal_error() -> None:
    result = plan("/api/v1/configmaps", "watch=1&resourceVersion=abc", held=Held(shape()))
    assert passed(result) is Why.APISERVER_VALIDATES


# ------------------------------------------------------------------------- which collection


def test_a_request_is_served_by_the_collection_that_equals_it_or_a_broader_one_filtered_locally() -> (
    None
):
    everything = shape()
    labelled = shape(namespace="a", labels="app=x")
    held = Held(everything, labelled)
    equal = served(plan("/api/v1/namespaces/a/configmaps", "labelSelector=app%3Dx", held=held))
    assert equal.shape is labelled and equal.why is Why.EQUAL and equal.view.is_everything
    broader = served(
        plan(
            "/api/v1/namespaces/b/configmaps",
            "labelSelector=tier%3Dweb&fieldSelector=metadata.name%3Dn",
            held=held,
        )
    )
    assert broader.shape is everything and broader.why is Why.BROADER
    assert broader.view.namespace == "b"
    assert broader.view.labels == LabelSelector.parse("tier=web")
    assert not broader.view.fields.is_everything


def test_other_requests_get_their_own_upstream_watch() -> None:
    result = plan("/api/v1/namespaces/a/configmaps", "labelSelector=app%3Dx", held=Held())
    assert isinstance(result, Fill) and result.shape is None and result.why is Why.NEW
    assert result.learn == ShapeKey.of(
        CM, namespace="a", label_selector=LabelSelector.parse("app=x")
    )
    filled = shape(namespace="a", labels="app=x")
    after = result.then(filled)
    assert after.shape is filled and after.view.is_everything


def test_with_learning_off_a_request_no_collection_serves_passes_through() -> None:
    """``--learn=false``: only the configured collections are served."""
    assert passed(plan("/api/v1/configmaps", held=Held(), learn=False)) is Why.NOT_LEARNING


def test_a_collection_still_being_filled_is_waited_for() -> None:
    filling = shape(rv=None)
    result = plan("/api/v1/configmaps", held=Held(filling))
    assert isinstance(result, Fill) and result.shape is filling and result.why is Why.FILLING


def test_selectors_longer_than_a_learned_shapes_key_may_be_pass_through_unparsed() -> None:
    """Before anything parses them: even a selector that would not parse."""
    query = "labelSelector=" + "a" * 5000 + "%20in"
    assert passed(plan("/api/v1/configmaps", query, held=Held(shape()))) is Why.SELECTORS_TOO_LONG


# ------------------------------------------------------------------------- protobuf


def test_protobuf_clients_are_answered_in_protobuf_for_built_in_types() -> None:
    protobuf = shape(encoding=Encoding.PROTOBUF)
    result = served(plan("/api/v1/configmaps", held=Held(shape(), protobuf), accept=PB_THEN_JSON))
    assert result.shape is protobuf and result.renderer.encoding is Encoding.PROTOBUF


def test_a_protobuf_client_that_accepts_json_is_served_from_a_warm_json_collection_while_its_protobuf_one_is_not_filled() -> (
    None
):
    json = shape()
    result = served(plan("/api/v1/configmaps", held=Held(json), accept=PB_THEN_JSON))
    assert result.shape is json and result.why is Why.JSON_FOR_PROTOBUF
    assert result.renderer.encoding is Encoding.JSON
    assert result.learn_behind == ShapeKey.of(CM, encoding=Encoding.PROTOBUF)
    filling = served(
        plan(
            "/api/v1/configmaps",
            held=Held(json, shape(rv=None, encoding=Encoding.PROTOBUF)),
            accept=PB_THEN_JSON,
        )
    )
    assert filling.shape is json and filling.learn_behind is None  # learned already
    only_protobuf = plan("/api/v1/configmaps", held=Held(json), accept=PB)
    assert isinstance(only_protobuf, Fill)  # a client that does not accept JSON waits


def test_a_watch_from_a_resource_version_the_protobuf_collection_does_not_reach_back_to_is_served_from_json() -> (
    None
):
    json = shape(log_start_rv="3")
    protobuf = shape(log_start_rv="9", encoding=Encoding.PROTOBUF)
    held = Held(json, protobuf)
    old = served(
        plan("/api/v1/configmaps", "watch=1&resourceVersion=5", held=held, accept=PB_THEN_JSON)
    )
    assert old.shape is json and old.why is Why.JSON_FOR_PROTOBUF
    recent = served(
        plan("/api/v1/configmaps", "watch=1&resourceVersion=9", held=held, accept=PB_THEN_JSON)
    )
    assert recent.shape is protobuf


def test_custom_resources_have_no_protobuf_form_and_are_always_json() -> None:
    widgets = shape(WIDGETS)
    result = served(plan("/apis/example.com/v1/widgets", held=Held(widgets), accept=PB_THEN_JSON))
    assert result.shape is widgets and result.why is Why.EQUAL
    assert result.renderer.encoding is Encoding.JSON and not result.renderer.untyped_list_items


@pytest.mark.parametrize(
    "accept",
    [
        "application/json;as=Table;g=meta.k8s.io;v=v1",
        "application/yaml",
        "application/cbor",
    ],
)
def test_table_yaml_and_cbor_requests_pass_through(accept: str) -> None:
    result = plan("/api/v1/configmaps", held=Held(shape()), accept=accept)
    assert passed(result) is Why.REPRESENTATION


# ------------------------------------------------------------------------- one object


def test_reads_while_the_apiserver_is_down_are_answered_from_a_cached_collection() -> None:
    """A GET of one object, from a filled collection without selectors, as negotiated; none
    such: no plan (the answer stays 503, never 404)."""
    path = RequestPath.parse("/api/v1/namespaces/a/configmaps/x")
    assert path is not None
    json, protobuf = shape(), shape(encoding=Encoding.PROTOBUF)
    held = Held(json, protobuf)
    first = plan_object_get(path, PB_THEN_JSON, held)
    assert first is not None and first.shape is protobuf
    as_json = plan_object_get(
        path, PB_THEN_JSON, Held(json, shape(rv=None, encoding=Encoding.PROTOBUF))
    )
    assert as_json is not None and as_json.shape is json
    metadata = plan_object_get(
        path, "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1", held
    )
    assert metadata is not None and metadata.renderer.metadata_only
    assert plan_object_get(path, "application/json", Held(shape(labels="app=x"))) is None
    assert plan_object_get(path, "application/json", Held(shape(rv=None))) is None
