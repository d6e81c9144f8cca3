"""Shapes: which upstream collection watch holds what, and which one serves a request.

A shape is ``(group, version, resource, namespace or all, labelSelector, fieldSelector)``
(docs/design.md §2). A request is served by the shape equal to it, or by a broader shape (same
resource, all namespaces or the same namespace, no selectors) with local filtering by namespace,
label selector and the generic ``metadata.name`` / ``metadata.namespace`` fields. Anything else
needs its own exact shape, so that the apiserver does the filtering and the transitions.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from proxy.cache.tailing import ShapeLog
from proxy.kube.resources import GroupVersionResource
from proxy.kube.selectors import FieldSelector, LabelSelector


class Encoding(enum.StrEnum):
    """How a shape's objects are listed and watched upstream, stored, and served.

    A protobuf client (kube-controller-manager, typed client-go controllers) decodes protobuf
    several times faster than JSON, so it is served by a protobuf shape; JSON clients by a
    JSON shape. Objects cannot be converted between the two without the types' schemas, so
    the encoding is part of the shape: a collection read by both kinds of client is watched
    upstream twice (docs/design.md §2). Custom resources have no protobuf form: JSON only.
    """

    JSON = "json"
    PROTOBUF = "protobuf"


LOGGED_SELECTOR_CHARS = 200
"""Characters of a selector a log line shows: enough to tell real selectors apart."""


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


@dataclass(frozen=True, kw_only=True, slots=True)
class ShapeKey:
    """A shape's identity. Selectors are kept in canonical form, so equal shapes are equal."""

    group: str
    version: str
    resource: str
    namespace: str = ""
    """'' = all namespaces (or a cluster-scoped resource)."""
    label_selector: str = ""
    field_selector: str = ""
    encoding: Encoding = Encoding.JSON

    @classmethod
    def of(
        cls,
        gvr: GroupVersionResource,
        *,
        namespace: str | None = None,
        label_selector: LabelSelector = LabelSelector.EVERYTHING,
        field_selector: FieldSelector = FieldSelector.EVERYTHING,
        encoding: Encoding = Encoding.JSON,
    ) -> ShapeKey:
        return cls(
            group=gvr.group,
            version=gvr.version,
            resource=gvr.resource,
            namespace=namespace or "",
            label_selector=label_selector.canonical,
            field_selector=field_selector.canonical,
            encoding=encoding,
        )

    @property
    def gvr(self) -> GroupVersionResource:
        return GroupVersionResource(group=self.group, version=self.version, resource=self.resource)

    @property
    def gvr_label(self) -> str:
        """The ``resource`` metric label: ``v1/configmaps``, ``apps/v1/deployments``."""
        return str(self.gvr)

    @property
    def selector_bytes(self) -> int:
        """The length of its selectors (UTF-8), what ``SyncSettings.max_key_bytes`` bounds."""
        return len(self.label_selector.encode()) + len(self.field_selector.encode())

    @property
    def identity(self) -> str:
        """Stable text form, the ``shapes.key`` column."""
        text = str(self.gvr)
        if self.namespace:
            text += f"@{self.namespace}"
        if self.label_selector:
            text += f"?labelSelector={self.label_selector}"
        if self.field_selector:
            text += f"{'&' if self.label_selector else '?'}fieldSelector={self.field_selector}"
        if self.encoding is not Encoding.JSON:
            text += f";{self.encoding}"
        return text

    def __str__(self) -> str:
        return self.identity

    def described(self, *, limit: int = LOGGED_SELECTOR_CHARS) -> dict[str, str]:
        """The shape's fields for its log line, each selector cut after ``limit`` characters
        (a selector may be up to the request's header size, 1 MiB)."""
        fields = {"resource": str(self.gvr), "namespace": self.namespace}
        fields["labelSelector"] = _cut(self.label_selector, limit)
        fields["fieldSelector"] = _cut(self.field_selector, limit)
        fields["encoding"] = str(self.encoding)
        return fields


@dataclass(kw_only=True, eq=False)
class Shape:
    """A shape's state as the writer last committed it (mirrors its ``shapes`` row), and the
    ring its watchers read."""

    id: int
    key: ShapeKey
    configured: bool
    kind: str
    api_version: str
    rv: str | None
    log_start_rv: str | None
    used_at: float
    log: ShapeLog
    log_bytes: int = 0
    """Bytes its log holds in the database (``shapes.log_bytes``), as of the last commit."""
    unpublished: bool = False
    """An abandoned relist left log entries past the published ones: they are deleted
    (``relisting.drop_unpublished``) before the shape's next append."""

    @classmethod
    def from_row(cls, row: tuple[Any, ...], *, ring_size: int) -> Shape:
        """From a row of ``registering.SHAPE_COLUMNS``."""
        (
            id_,
            group,
            version,
            resource,
            namespace,
            label_selector,
            field_selector,
            encoding,
            configured,
            kind,
            api_version,
            rv,
            log_start_rv,
            last_seq,
            used_at,
            log_bytes,
            unpublished,
        ) = row
        key = ShapeKey(
            group=group,
            version=version,
            resource=resource,
            namespace=namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            encoding=Encoding(encoding),
        )
        return cls(
            id=id_,
            key=key,
            configured=bool(configured),
            kind=kind,
            api_version=api_version,
            rv=rv,
            log_start_rv=log_start_rv,
            used_at=used_at,
            log=ShapeLog(last_seq=last_seq, ring_size=ring_size),
            log_bytes=log_bytes,
            unpublished=bool(unpublished),
        )

    @property
    def resource(self) -> str:
        return self.key.gvr_label


@dataclass(frozen=True, kw_only=True, slots=True)
class Request:
    """What a LIST/WATCH asks for, as far as choosing a shape goes."""

    gvr: GroupVersionResource
    namespace: str | None
    label_selector: LabelSelector
    field_selector: FieldSelector
    encoding: Encoding = Encoding.JSON

    @property
    def exact_key(self) -> ShapeKey:
        return ShapeKey.of(
            self.gvr,
            namespace=self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            encoding=self.encoding,
        )

    def locally_filterable(self, *, namespaced: bool | None) -> bool:
        """A broader shape can answer it: the field selector uses generic fields only."""
        return self.field_selector.is_locally_servable(namespaced=namespaced)

    def needs_filter(self, shape: ShapeKey) -> bool:
        """Serving from ``shape`` needs local filtering (by namespace or selectors)."""
        return shape != self.exact_key


def choose(
    request: Request, shapes: Iterable[ShapeKey], *, namespaced: bool | None
) -> ShapeKey | None:
    """The shape that serves ``request``: the exact one, else the narrowest broad one, of the
    request's encoding."""
    candidates = set(shapes)
    exact = request.exact_key
    if exact in candidates:
        return exact
    if not request.locally_filterable(namespaced=namespaced):
        return None
    if request.namespace:
        in_namespace = ShapeKey.of(
            request.gvr, namespace=request.namespace, encoding=request.encoding
        )
        if in_namespace in candidates:
            return in_namespace
    everywhere = ShapeKey.of(request.gvr, encoding=request.encoding)
    return everywhere if everywhere in candidates else None
