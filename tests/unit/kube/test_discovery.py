"""Which resources a discovery document names (proxy/kube/discovery.py)."""

from __future__ import annotations

import orjson
import pytest

from proxy.kube.discovery import lists_resources, named_resources
from proxy.kube.resources import GroupVersionResource


def gvr(text: str) -> GroupVersionResource:
    return GroupVersionResource.parse(text)


def test_resource_list_names_its_resources_without_subresources() -> None:
    body = orjson.dumps(
        {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": "apps/v1",
            "resources": [
                {"name": "deployments", "namespaced": True, "kind": "Deployment"},
                {"name": "deployments/scale", "namespaced": True, "kind": "Scale"},
                {"name": "statefulsets", "namespaced": True, "kind": "StatefulSet"},
            ],
        }
    )
    assert named_resources(body) == {gvr("apps/v1/deployments"), gvr("apps/v1/statefulsets")}


def test_core_resource_list() -> None:
    body = orjson.dumps(
        {"kind": "APIResourceList", "groupVersion": "v1", "resources": [{"name": "pods"}]}
    )
    assert named_resources(body) == {gvr("v1/pods")}


def test_aggregated_discovery_names_every_group_version() -> None:
    body = orjson.dumps(
        {
            "kind": "APIGroupDiscoveryList",
            "apiVersion": "apidiscovery.k8s.io/v2",
            "metadata": {},
            "items": [
                {
                    "metadata": {"creationTimestamp": None},  # the core group: no name
                    "versions": [
                        {
                            "version": "v1",
                            "resources": [
                                {"resource": "pods", "subresources": [{"subresource": "log"}]},
                                {"resource": "configmaps"},
                            ],
                        }
                    ],
                },
                {
                    "metadata": {"name": "example.com"},
                    "versions": [
                        {"version": "v2", "resources": [{"resource": "widgets"}]},
                        {"version": "v1", "resources": [{"resource": "widgets"}]},
                    ],
                },
            ],
        }
    )
    assert named_resources(body) == {
        gvr("v1/pods"),
        gvr("v1/configmaps"),
        gvr("example.com/v2/widgets"),
        gvr("example.com/v1/widgets"),
    }


@pytest.mark.parametrize(
    "body",
    [
        b'{"kind": "APIGroupList", "groups": [{"name": "apps"}]}',
        b'{"kind": "APIVersions", "versions": ["v1"]}',
        b'{"major": "1", "minor": "37"}',
        b"[1, 2]",
        b"\x0a\x03k8s\x00protobuf",
        b"",
    ],
)
def test_other_documents_name_nothing(body: bytes) -> None:
    assert named_resources(body) is None


def test_malformed_entries_are_skipped() -> None:
    body = orjson.dumps(
        {
            "kind": "APIGroupDiscoveryList",
            "items": [
                "junk",
                {"metadata": "junk", "versions": [{"version": 1}, {"resources": []}]},
                {"metadata": {"name": "g.io"}, "versions": [{"version": "v1", "resources": 7}]},
                {
                    "metadata": {"name": "h.io"},
                    "versions": [{"version": "v1", "resources": [{"resource": 3}, {}, "x"]}],
                },
                {
                    "metadata": {"name": "ok.io"},
                    "versions": [{"version": "v1", "resources": [{"resource": "r"}]}],
                },
            ],
        }
    )
    assert named_resources(body) == {gvr("ok.io/v1/r")}
    assert named_resources(b'{"kind": "APIResourceList", "resources": [{"name": "x"}]}') == set()


@pytest.mark.parametrize(
    ("path", "lists"),
    [
        ("/api", True),
        ("/apis", True),
        ("/api/v1", True),
        ("/apis/apps/v1", True),
        ("/apis/apps", False),
        ("/version", False),
        ("/openapi/v2", False),
        ("/openapi/v3/apis/apps/v1", False),
        ("/api/v1/pods", False),
        ("/apis//v1", False),
        ("/api/", False),
    ],
)
def test_lists_resources(path: str, lists: bool) -> None:
    assert lists_resources(path) is lists
