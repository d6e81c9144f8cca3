"""Resources and apiserver request paths.

:class:`GroupVersionResource` names a collection (``v1/configmaps``, ``apps/v1/deployments``,
``example.com/v1/widgets``); :class:`ResourceFlag` is the ``--resource GVR[@NAMESPACE]`` flag.

:class:`RequestPath` parses a URL path the way the apiserver's ``RequestInfoFactory`` does:

* ``/api/v1/[namespaces/NS/]RESOURCE[/NAME[/SUBRESOURCE[/...]]]`` (core group);
* ``/apis/GROUP/VERSION/[namespaces/NS/]RESOURCE[/NAME[/SUBRESOURCE[/...]]]``;
* the deprecated watch prefix: ``/api/v1/watch/...`` and ``/apis/G/V/watch/...``
  (a WATCH whatever the ``watch`` query parameter says);
* ``/api/v1/namespaces`` is the namespaces collection and ``/api/v1/namespaces/NS`` the
  namespace object NS; ``/api/v1/namespaces/NS/status`` and ``.../finalize`` are its
  subresources. Namespaces are cluster-scoped, so these have ``namespace=None`` (the
  apiserver's RequestInfo sets its namespace field to NS here, for authorization only).

Anything else (``/version``, ``/openapi/...``, ``/healthz``, discovery documents ``/api``,
``/api/v1``, ``/apis``, ``/apis/G``, ``/apis/G/V``, the removed ``/proxy/`` verb prefix, or
paths with empty segments) is not a resource request: :meth:`RequestPath.parse` returns None.

The path alone does not tell whether a resource is namespaced: for
``/api/v1/RESOURCE`` the namespace is None, meaning "all namespaces" for a namespaced
resource and "no namespace" for a cluster-scoped one. The caller resolves that with discovery.
Paths are taken *decoded* (``%2F`` already turned into ``/``), as Go's ``URL.Path``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

__all__ = [
    "GroupVersionResource",
    "RequestPath",
    "ResourceFlag",
]

_DNS1123_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1035_LABEL: Final = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN: Final = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)

#: Namespace subresources: ``/api/v1/namespaces/NS/<these>`` address the namespace NS.
_NAMESPACE_SUBRESOURCES: Final = frozenset({"status", "finalize"})


def _check(pattern: re.Pattern[str], value: str, *, what: str, max_len: int, text: str) -> None:
    if len(value) > max_len or not pattern.fullmatch(value):
        raise ValueError(f"invalid {what} {value!r} in {text!r}")


@dataclass(frozen=True, kw_only=True, slots=True, order=True)
class GroupVersionResource:
    """A collection: API group (``""`` for core), version and plural resource name."""

    group: str
    version: str
    resource: str

    @classmethod
    def parse(cls, text: str) -> GroupVersionResource:
        """``VERSION/RESOURCE`` (core group) or ``GROUP/VERSION/RESOURCE``.

        Raises ValueError for anything else (empty parts, subresources, upper case, ...).
        """
        parts = text.split("/")
        if len(parts) == 2:
            group, (version, resource) = "", parts
        elif len(parts) == 3:
            group, version, resource = parts
            _check(_DNS1123_SUBDOMAIN, group, what="group", max_len=253, text=text)
        else:
            raise ValueError(
                f"invalid resource {text!r}: want VERSION/RESOURCE or GROUP/VERSION/RESOURCE"
            )
        _check(_DNS1035_LABEL, version, what="version", max_len=63, text=text)
        _check(_DNS1123_LABEL, resource, what="resource", max_len=63, text=text)
        return cls(group=group, version=version, resource=resource)

    @property
    def api_version(self) -> str:
        """The ``apiVersion`` of the resource's objects: ``v1`` or ``GROUP/VERSION``."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def api_prefix(self) -> str:
        """``/api/v1`` for the core group, ``/apis/GROUP/VERSION`` otherwise."""
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    @property
    def may_have_protobuf(self) -> bool:
        """Kubernetes' own groups (core, groups without a dot, ``*.k8s.io``) serve protobuf;
        custom resources never do. A CRD in a ``*.k8s.io`` group (Gateway API) is found out
        when the apiserver answers a protobuf request in JSON."""
        return "." not in self.group or self.group.endswith(".k8s.io")

    def collection_path(self, *, namespace: str | None = None) -> str:
        """The collection URL path, namespaced when ``namespace`` is given."""
        if namespace:
            return f"{self.api_prefix}/namespaces/{namespace}/{self.resource}"
        return f"{self.api_prefix}/{self.resource}"

    def __str__(self) -> str:
        """The flag form: ``v1/configmaps``, ``apps/v1/deployments``."""
        return f"{self.api_version}/{self.resource}"


@dataclass(frozen=True, kw_only=True, slots=True)
class ResourceFlag:
    """The ``--resource GVR[@NAMESPACE][;protobuf]`` flag: a collection (all namespaces when
    no namespace), cached for JSON clients, or with ``;protobuf`` for protobuf clients."""

    gvr: GroupVersionResource
    namespace: str | None = None
    protobuf: bool = False

    @classmethod
    def parse(cls, text: str) -> ResourceFlag:
        """``v1/configmaps``, ``apps/v1/deployments@team-a;protobuf``. Raises ValueError."""
        text = text.strip()
        body, semicolon, encoding = text.partition(";")
        if semicolon and encoding not in ("protobuf", "json"):
            raise ValueError(f"{text!r}: the encoding after ';' is protobuf or json")
        protobuf = encoding == "protobuf"
        if protobuf and not GroupVersionResource.parse(body.partition("@")[0]).may_have_protobuf:
            raise ValueError(f"{text!r}: custom resources have no protobuf form")
        spec, at, namespace = body.partition("@")
        gvr = GroupVersionResource.parse(spec)
        if not at:
            return cls(gvr=gvr, protobuf=protobuf)
        _check(_DNS1123_LABEL, namespace, what="namespace", max_len=63, text=text)
        return cls(gvr=gvr, namespace=namespace, protobuf=protobuf)

    def __str__(self) -> str:
        text = f"{self.gvr}@{self.namespace}" if self.namespace else str(self.gvr)
        return f"{text};protobuf" if self.protobuf else text


@dataclass(frozen=True, kw_only=True, slots=True)
class RequestPath:
    """A resource request path, parsed.

    ``namespace`` is None for cluster-scoped requests and for all-namespaces collections;
    ``name`` is None for collections; ``subresource`` is set only with a name;
    ``watch_prefix`` marks the deprecated ``/watch/`` form. Path segments after the
    subresource (``pods/NAME/proxy/some/path``) are not kept.
    """

    gvr: GroupVersionResource
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None
    watch_prefix: bool = False

    @classmethod
    def parse(cls, path: str) -> RequestPath | None:
        """Parse a decoded URL path; None when it is not a resource request.

        Trailing slashes are ignored as the apiserver ignores them; a path with an empty
        segment elsewhere (``//api/...``: Go's mux answers 404; ``/api//v1/...``) is not
        parsed: the apiserver answers it."""
        root, *parts = path.rstrip("/").split("/")
        if root or not parts or "" in parts:
            return None
        if parts[0] == "api":
            if len(parts) < 3:
                return None
            group, version, rest = "", parts[1], parts[2:]
        elif parts[0] == "apis":
            if len(parts) < 4:
                return None
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None

        watch_prefix = rest[0] == "watch"
        if watch_prefix:
            rest = rest[1:]
            if not rest:
                return None  # the apiserver: "unable to determine kind and namespace"
        elif rest[0] == "proxy":
            return None  # removed verb-via-path proxy; never a list or watch

        namespace: str | None = None
        if rest[0] == "namespaces" and len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            namespace, rest = rest[1], rest[2:]

        resource = rest[0]
        name = rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else None
        return cls(
            gvr=GroupVersionResource(group=group, version=version, resource=resource),
            namespace=namespace,
            name=name,
            subresource=subresource,
            watch_prefix=watch_prefix,
        )

    @property
    def is_collection(self) -> bool:
        """A collection request (LIST/WATCH of many): no object name in the path."""
        return self.name is None

    @property
    def is_watch_path(self) -> bool:
        """The deprecated ``/watch/`` prefix: the request is a WATCH (the apiserver's
        ``forceWatch``), even without ``watch=true``."""
        return self.watch_prefix
