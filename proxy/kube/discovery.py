"""Which resources a discovery document of the apiserver names.

Two kinds of document list resources, both JSON:

- ``APIResourceList``, at ``/api/v1`` and ``/apis/GROUP/VERSION``: ``groupVersion`` and
  ``resources[].name``, where a name with a ``/`` is a subresource (``pods/log``);
- the aggregated ``APIGroupDiscoveryList`` (``apidiscovery.k8s.io`` v2 or v2beta1, what
  client-go asks for first), at ``/api`` and ``/apis``: ``items[].metadata.name`` (the group,
  ``""`` for the core group), ``versions[].version`` and ``versions[].resources[].resource``
  (subresources are listed apart, under ``subresources``).

Every other document (``APIGroupList``, ``APIVersions``, a protobuf answer, ``/version``,
the OpenAPI documents) names none. Used to bound the ``resource`` metric label
(``proxy.metrics.ResourceNames``) to what the cluster serves.
"""

from __future__ import annotations

from typing import Any, TypedDict

import orjson

from proxy.kube.resources import GroupVersionResource

__all__ = ["lists_resources", "named_resources"]


class APIResource(TypedDict, total=False):
    name: str


class APIResourceList(TypedDict, total=False):
    kind: str
    groupVersion: str
    resources: list[APIResource]


class APIResourceDiscovery(TypedDict, total=False):
    resource: str


class APIVersionDiscovery(TypedDict, total=False):
    version: str
    resources: list[APIResourceDiscovery]


class GroupMeta(TypedDict, total=False):
    name: str


class APIGroupDiscovery(TypedDict, total=False):
    metadata: GroupMeta
    versions: list[APIVersionDiscovery]


class APIGroupDiscoveryList(TypedDict, total=False):
    kind: str
    items: list[APIGroupDiscovery]


def lists_resources(path: str) -> bool:
    """``path`` is one where a document naming resources is served: ``/api``, ``/apis``,
    ``/api/VERSION``, ``/apis/GROUP/VERSION`` (cheap: decide before reading a body)."""
    parts = path.split("/")
    if path in ("/api", "/apis"):
        return True
    if len(parts) == 3 and parts[1] == "api":
        return bool(parts[2])
    return len(parts) == 4 and parts[1] == "apis" and all(parts[2:])


def named_resources(body: bytes) -> frozenset[GroupVersionResource] | None:
    """The resources a discovery document names, or None when it is not a document that
    names resources (or not JSON)."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    kind = document.get("kind") if isinstance(document, dict) else None
    if kind == "APIResourceList":
        return _of_resource_list(document)
    if kind == "APIGroupDiscoveryList":
        return _of_aggregated(document)
    return None


def _of_resource_list(document: APIResourceList) -> frozenset[GroupVersionResource]:
    group, _, version = _text(document.get("groupVersion")).rpartition("/")
    if not version:
        return frozenset()
    resources: list[APIResource] = _objects(document.get("resources"))
    return frozenset(
        GroupVersionResource(group=group, version=version, resource=name)
        for resource in resources
        if (name := _text(resource.get("name"))) and "/" not in name
    )


def _of_aggregated(document: APIGroupDiscoveryList) -> frozenset[GroupVersionResource]:
    found: set[GroupVersionResource] = set()
    groups: list[APIGroupDiscovery] = _objects(document.get("items"))
    for item in groups:
        metadata: list[GroupMeta] = _objects([item.get("metadata")])
        group = _text(metadata[0].get("name")) if metadata else ""
        versions: list[APIVersionDiscovery] = _objects(item.get("versions"))
        for entry in versions:
            if not (version := _text(entry.get("version"))):
                continue
            resources: list[APIResourceDiscovery] = _objects(entry.get("resources"))
            found.update(
                GroupVersionResource(group=group, version=version, resource=name)
                for resource in resources
                if (name := _text(resource.get("resource")))
            )
    return frozenset(found)


def _objects(value: object) -> list[Any]:
    """The JSON objects of a JSON array (anything else in it, or anything else, is skipped):
    the apiserver's documents are checked, not trusted to have the shape typed here."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
