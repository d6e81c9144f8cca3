"""Which shape serves a request (cache/shapes.py ``choose``, docs/design.md §2): the equal
one, else the narrowest broad one of the request's encoding; never one that would need a
field it cannot filter by."""

from __future__ import annotations

import pytest

from proxy.cache.shapes import Encoding, Request, ShapeKey, choose
from proxy.kube.resources import GroupVersionResource
from proxy.kube.selectors import FieldSelector, LabelSelector

CM = GroupVersionResource.parse("v1/configmaps")
PODS = GroupVersionResource.parse("v1/pods")


def request(
    gvr: GroupVersionResource = CM,
    *,
    namespace: str | None = None,
    labels: str = "",
    fields: str = "",
    encoding: Encoding = Encoding.JSON,
) -> Request:
    return Request(
        gvr=gvr,
        namespace=namespace,
        label_selector=LabelSelector.parse(labels),
        field_selector=FieldSelector.parse(fields),
        encoding=encoding,
    )


EVERYWHERE = ShapeKey.of(CM)
TEAM_A = ShapeKey.of(CM, namespace="team-a")
SELECTED = ShapeKey.of(CM, namespace="team-a", label_selector=LabelSelector.parse("app=x"))


@pytest.mark.parametrize(
    ("wanted", "shapes", "chosen"),
    [
        # The equal shape, however narrow, first.
        (request(namespace="team-a", labels="app=x"), [EVERYWHERE, TEAM_A, SELECTED], SELECTED),
        # A namespace's own broad shape before the cluster-wide one.
        (request(namespace="team-a", labels="app=y"), [EVERYWHERE, TEAM_A], TEAM_A),
        (request(namespace="team-b"), [EVERYWHERE, TEAM_A], EVERYWHERE),
        # A selector shape never serves a broader or different request.
        (request(namespace="team-a"), [SELECTED], None),
        (request(namespace="team-a", labels="app=y"), [SELECTED], None),
        # Another namespace's shape serves nothing here.
        (request(namespace="team-b"), [TEAM_A], None),
        (request(), [TEAM_A], None),
        # Generic fields are filtered locally.
        (request(namespace="team-a", fields="metadata.name=cm-1"), [TEAM_A], TEAM_A),
    ],
)
def test_the_equal_shape_else_the_narrowest_broad_one(
    wanted: Request, shapes: list[ShapeKey], chosen: ShapeKey | None
) -> None:
    assert choose(wanted, shapes, namespaced=True) == chosen


def test_a_field_only_the_apiserver_can_filter_needs_its_own_shape() -> None:
    on_node = request(PODS, fields="spec.nodeName=n1")
    assert choose(on_node, [ShapeKey.of(PODS)], namespaced=True) is None
    assert choose(on_node, [on_node.exact_key], namespaced=True) == on_node.exact_key


def test_the_encoding_is_part_of_the_shape() -> None:
    protobuf = ShapeKey.of(CM, encoding=Encoding.PROTOBUF)
    assert choose(request(), [protobuf], namespaced=True) is None
    assert choose(request(encoding=Encoding.PROTOBUF), [EVERYWHERE, protobuf], namespaced=True) == (
        protobuf
    )


def test_equal_selectors_make_equal_shapes_and_one_identity() -> None:
    one = ShapeKey.of(CM, label_selector=LabelSelector.parse("b=2,a=1"))
    other = ShapeKey.of(CM, label_selector=LabelSelector.parse("a=1, b=2"))
    assert one == other and one.identity == other.identity
    assert ShapeKey.of(CM, namespace="n", encoding=Encoding.PROTOBUF).identity == (
        "v1/configmaps@n;protobuf"
    )
