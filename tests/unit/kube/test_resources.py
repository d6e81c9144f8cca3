"""GVRs, the --resource flag and apiserver request paths."""

from __future__ import annotations

import pytest

from proxy.kube.resources import GroupVersionResource, RequestPath, ResourceFlag


@pytest.mark.parametrize(
    ("text", "group", "version", "resource", "api_version"),
    [
        ("v1/configmaps", "", "v1", "configmaps", "v1"),
        ("apps/v1/deployments", "apps", "v1", "deployments", "apps/v1"),
        ("example.com/v1/widgets", "example.com", "v1", "widgets", "example.com/v1"),
        ("batch/v1beta1/cronjobs", "batch", "v1beta1", "cronjobs", "batch/v1beta1"),
    ],
)
def test_gvr_parse(text: str, group: str, version: str, resource: str, api_version: str) -> None:
    gvr = GroupVersionResource.parse(text)
    assert (gvr.group, gvr.version, gvr.resource) == (group, version, resource)
    assert gvr.api_version == api_version
    assert str(gvr) == text


@pytest.mark.parametrize(
    "text",
    [
        "",
        "configmaps",
        "v1/",
        "/v1/configmaps",
        "v1/ConfigMaps",
        "apps/v1/deployments/scale",
        "Apps/v1/x",
        "apps//x",
        "apps/1v/x",
        "v1/config maps",
    ],
)
def test_gvr_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid"):
        GroupVersionResource.parse(text)


def test_gvr_paths() -> None:
    core = GroupVersionResource.parse("v1/configmaps")
    apps = GroupVersionResource.parse("apps/v1/deployments")
    assert core.collection_path() == "/api/v1/configmaps"
    assert core.collection_path(namespace="ns") == "/api/v1/namespaces/ns/configmaps"
    assert apps.collection_path(namespace="team-a") == "/apis/apps/v1/namespaces/team-a/deployments"
    assert apps.api_prefix == "/apis/apps/v1"


@pytest.mark.parametrize(
    ("text", "gvr", "namespace"),
    [
        ("v1/configmaps", "v1/configmaps", None),
        ("apps/v1/deployments@team-a", "apps/v1/deployments", "team-a"),
        ("example.com/v1/widgets", "example.com/v1/widgets", None),
        ("apps/v1/deployments@team-a;protobuf", "apps/v1/deployments", "team-a"),
        ("v1/pods;protobuf", "v1/pods", None),
    ],
)
def test_resource_flag(text: str, gvr: str, namespace: str | None) -> None:
    flag = ResourceFlag.parse(text)
    assert str(flag.gvr) == gvr
    assert flag.namespace == namespace
    assert flag.protobuf is text.endswith(";protobuf")
    assert str(flag) == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("v1/configmaps;cbor", "protobuf or json"),
        ("example.com/v1/widgets;protobuf", "no protobuf form"),
    ],
)
def test_resource_flag_encodings(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ResourceFlag.parse(text)


@pytest.mark.parametrize(
    "text", ["v1/configmaps@", "v1/configmaps@Team", "v1/configmaps@a_b", "@ns", "v1@ns"]
)
def test_resource_flag_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid"):
        ResourceFlag.parse(text)


# (path, group, version, resource, namespace, name, subresource, watch_prefix)
PATHS = [
    ("/api/v1/configmaps", "", "v1", "configmaps", None, None, None, False),
    ("/api/v1/namespaces/ns/configmaps", "", "v1", "configmaps", "ns", None, None, False),
    ("/api/v1/namespaces/ns/configmaps/cm", "", "v1", "configmaps", "ns", "cm", None, False),
    ("/api/v1/namespaces/ns/pods/p/status", "", "v1", "pods", "ns", "p", "status", False),
    ("/api/v1/namespaces/ns/pods/p/proxy/a/b", "", "v1", "pods", "ns", "p", "proxy", False),
    ("/api/v1/nodes/n1", "", "v1", "nodes", None, "n1", None, False),
    ("/apis/apps/v1/deployments", "apps", "v1", "deployments", None, None, None, False),
    (
        "/apis/apps/v1/namespaces/a/deployments/d/scale",
        "apps",
        "v1",
        "deployments",
        "a",
        "d",
        "scale",
        False,
    ),
    ("/apis/example.com/v1/widgets", "example.com", "v1", "widgets", None, None, None, False),
    # the namespaces resource itself is cluster-scoped
    ("/api/v1/namespaces", "", "v1", "namespaces", None, None, None, False),
    ("/api/v1/namespaces/ns", "", "v1", "namespaces", None, "ns", None, False),
    ("/api/v1/namespaces/ns/status", "", "v1", "namespaces", None, "ns", "status", False),
    ("/api/v1/namespaces/ns/finalize", "", "v1", "namespaces", None, "ns", "finalize", False),
    ("/api/v1/namespaces/status/pods", "", "v1", "pods", "status", None, None, False),
    # deprecated watch prefix
    ("/api/v1/watch/configmaps", "", "v1", "configmaps", None, None, None, True),
    ("/api/v1/watch/namespaces/ns/pods", "", "v1", "pods", "ns", None, None, True),
    ("/api/v1/watch/namespaces/ns/pods/p", "", "v1", "pods", "ns", "p", None, True),
    ("/api/v1/watch/namespaces", "", "v1", "namespaces", None, None, None, True),
    ("/api/v1/watch/namespaces/ns", "", "v1", "namespaces", None, "ns", None, True),
    (
        "/apis/apps/v1/watch/namespaces/a/deployments",
        "apps",
        "v1",
        "deployments",
        "a",
        None,
        None,
        True,
    ),
    ("/apis/example.com/v1/watch/widgets", "example.com", "v1", "widgets", None, None, None, True),
    # trailing slash is ignored, as by the apiserver's splitPath
    ("/api/v1/configmaps/", "", "v1", "configmaps", None, None, None, False),
]


@pytest.mark.parametrize(
    ("path", "group", "version", "resource", "namespace", "name", "subresource", "watch"), PATHS
)
def test_request_path(
    path: str,
    group: str,
    version: str,
    resource: str,
    namespace: str | None,
    name: str | None,
    subresource: str | None,
    watch: bool,
) -> None:
    parsed = RequestPath.parse(path)
    assert parsed is not None
    assert parsed.gvr == GroupVersionResource(group=group, version=version, resource=resource)
    assert (parsed.namespace, parsed.name, parsed.subresource) == (namespace, name, subresource)
    assert parsed.is_watch_path is watch
    assert parsed.is_collection is (name is None)


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "",
        "/version",
        "/healthz",
        "/openapi/v2",
        "/openapi/v3/apis/apps/v1",
        "/api",
        "/api/v1",
        "/apis",
        "/apis/apps",
        "/apis/apps/v1",
        "/api/v1/watch",
        "/apis/apps/v1/watch",
        "/api/v1/proxy/namespaces/ns/pods/p",
        "/api/v1/namespaces//pods",
        "/apisx/apps/v1/deployments",
        "/metrics",
        # Empty segments other than trailing: the apiserver answers them (Go's mux 404s a
        # leading "//"; go-restful 404s "/api//v1/..."), not a LIST from the cache.
        "//api/v1/configmaps",
        "/api//v1/configmaps",
        "api/v1/configmaps",
    ],
)
def test_non_resource_paths(path: str) -> None:
    assert RequestPath.parse(path) is None


@pytest.mark.parametrize("path", ["/api/v1/configmaps/", "/api/v1/configmaps//"])
def test_trailing_slashes_are_ignored_as_the_apiserver_does(path: str) -> None:
    assert RequestPath.parse(path) == RequestPath.parse("/api/v1/configmaps")
