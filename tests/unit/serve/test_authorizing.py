"""The attributes a cached read is authorized with, the bearer token as the apiserver reads
it, and TokenReviews over a client's budget."""

from __future__ import annotations

from typing import Any, cast
from unittest import mock

import pytest
from aiohttp.test_utils import make_mocked_request

from proxy.kube.resources import RequestPath
from proxy.metrics import Metrics
from proxy.serve import authorizing
from proxy.serve.authorizing import access_attributes, bearer_token, impersonates
from proxy.serve.limiting import LimitReached
from proxy.upstream.delegating import Delegation, DelegationSettings
from proxy.upstream.reviewing import AccessAttributes


def attrs(path: str, query: str = "") -> AccessAttributes:
    parsed = RequestPath.parse(path)
    assert parsed is not None
    return access_attributes(parsed, query)


def test_list_and_watch_in_a_namespace() -> None:
    assert attrs("/api/v1/namespaces/a/configmaps") == AccessAttributes(
        verb="list", group="", version="v1", resource="configmaps", namespace="a"
    )
    watch = attrs("/apis/apps/v1/namespaces/a/deployments", "watch=1&resourceVersion=5")
    assert (watch.verb, watch.group, watch.version, watch.resource, watch.namespace) == (
        "watch",
        "apps",
        "v1",
        "deployments",
        "a",
    )
    assert attrs("/api/v1/configmaps", "watch=false").verb == "list"
    assert attrs("/api/v1/configmaps", "watch=0").namespace == ""


def test_the_watch_prefix_is_a_watch_whatever_the_query() -> None:
    assert attrs("/api/v1/watch/namespaces/a/secrets", "watch=false").verb == "watch"


def test_selectors_are_passed_as_given_and_a_pinned_name_is_the_name() -> None:
    got = attrs(
        "/api/v1/namespaces/a/configmaps",
        "labelSelector=app%20in%20(x,y)&fieldSelector=metadata.name%3Dcm-1",
    )
    assert got.label_selector == "app in (x,y)"
    assert got.field_selector == "metadata.name=cm-1"
    assert got.name == "cm-1"
    assert attrs("/api/v1/configmaps", "fieldSelector=metadata.name!%3Dx").name == ""
    # Not a valid path segment name: not taken as the name (IsValidPathSegmentName).
    assert attrs("/api/v1/configmaps", "fieldSelector=metadata.name%3D..").name == ""


@pytest.mark.parametrize(
    ("query", "verb"),
    [
        ("labelSelector=app%20in%20(x", "list"),
        ("limit=abc", "list"),
        ("limit=abc&watch=yes", "watch"),
        ("limit=abc&watch=FALSE", "list"),
    ],
)
def test_an_undecodable_query_is_list_or_watch_without_selectors(query: str, verb: str) -> None:
    got = attrs("/api/v1/namespaces/a/configmaps", query + "&fieldSelector=metadata.name%3Dx")
    assert (got.verb, got.label_selector, got.field_selector, got.name) == (verb, "", "", "")


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer abc", "abc"),
        ("  Bearer abc  ", "abc"),
        ("Bearer abc def", "abc"),
        ("Bearer  abc", None),  # the apiserver: an empty token
        ("Bearer ", None),
        ("Basic YTpi", None),
        ("", None),
    ],
)
def test_bearer_token_as_the_apiserver_reads_it(header: str, token: str | None) -> None:
    headers = {"Authorization": header} if header else {}
    assert bearer_token(make_mocked_request("GET", "/", headers=headers)) == token


def test_impersonation_headers_are_noticed() -> None:
    assert impersonates(make_mocked_request("GET", "/", headers={"Impersonate-User": "x"}))
    assert impersonates(
        make_mocked_request("GET", "/", headers={"impersonate-extra-scopes": "view"})
    )
    assert not impersonates(make_mocked_request("GET", "/", headers={"Authorization": "x"}))


async def test_a_token_review_over_the_address_budget_is_the_429_limit() -> None:
    delegation = Delegation(
        upstream=cast(Any, None),  # never asked: the budget refuses first
        # no refill within the test, however slow the machine
        settings=DelegationSettings(review_burst=1, review_rate=0.001),
        metrics=Metrics(),
    )
    assert delegation.review_budget.take("10.0.0.1")  # spent
    transport = mock.Mock()
    transport.get_extra_info.return_value = ("10.0.0.1", 40000)
    request = make_mocked_request(
        "GET",
        "/api/v1/namespaces/a/configmaps",
        headers={"Authorization": "Bearer junk"},
        transport=transport,
    )
    with pytest.raises(LimitReached) as reached:
        await authorizing.grant(request, delegation, attrs("/api/v1/namespaces/a/configmaps"))
    assert reached.value.limit == "token_reviews"
    await delegation.close()
