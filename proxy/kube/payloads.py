"""Typed shapes of the raw JSON payloads the apiserver sends and the proxy serves.

These are TypedDicts over the decoded JSON (``orjson.loads``); they describe only the keys
the proxy reads or writes. Real objects carry more top-level keys (``spec``, ``status``,
``data``, ...) which the proxy keeps verbatim as raw bytes and never interprets.

Key order matters where the proxy *writes* JSON: Go's encoder emits struct fields in
declaration order, so builders in this package insert keys in that order (for example
``kind, apiVersion, metadata, items`` for lists, and the Status order in ``status.py``).
"""

from __future__ import annotations

from typing import Any, Final, Literal, NotRequired, TypedDict

__all__ = [
    "INITIAL_EVENTS_END_ANNOTATION",
    "WATCH_EVENT_TYPES",
    "KubeObject",
    "ListMeta",
    "ObjectMeta",
    "StatusCause",
    "StatusDetails",
    "StatusPayload",
    "WatchEventType",
]

#: Annotation on the BOOKMARK that ends the initial events of a WatchList
#: (``sendInitialEvents=true``); its value is the string ``"true"``.
INITIAL_EVENTS_END_ANNOTATION: Final = "k8s.io/initial-events-end"

WatchEventType = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"]
WATCH_EVENT_TYPES: Final[frozenset[str]] = frozenset(
    {"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"}
)


class OwnerReference(TypedDict):
    """``metav1.OwnerReference`` (without ``blockOwnerDeletion``)."""

    apiVersion: str
    kind: str
    name: str
    uid: str
    controller: NotRequired[bool]


class ObjectMeta(TypedDict, total=False):
    """``metav1.ObjectMeta`` (the keys the proxy may look at)."""

    name: str
    generateName: str
    namespace: str
    selfLink: str
    uid: str
    resourceVersion: str
    generation: int
    creationTimestamp: str | None
    deletionTimestamp: str
    deletionGracePeriodSeconds: int
    labels: dict[str, str]
    annotations: dict[str, str]
    ownerReferences: list[OwnerReference]
    finalizers: list[str]
    managedFields: list[dict[str, Any]]


class KubeObject(TypedDict, total=False):
    """Any API object. Items of built-in list responses omit ``kind``/``apiVersion``; watch
    event objects always carry them."""

    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: Any
    status: Any
    data: Any


# "continue" is a Python keyword, hence the functional syntax.
ListMeta = TypedDict(
    "ListMeta",
    {
        "selfLink": str,
        "resourceVersion": str,
        "continue": str,
        "remainingItemCount": int,
    },
    total=False,
)
ListMeta.__doc__ = """``metav1.ListMeta``. ``continue`` and ``remainingItemCount`` appear only on
paginated answers; an expired continue token's Status carries a fresh ``continue``."""


class StatusCause(TypedDict, total=False):
    """``metav1.StatusCause``; Go's field ``Type`` is serialised as ``reason``."""

    reason: str
    message: str
    field: str


class StatusDetails(TypedDict, total=False):
    """``metav1.StatusDetails``; ``kind`` holds the *resource* for NotFound/Forbidden."""

    name: str
    group: str
    kind: str
    uid: str
    causes: list[StatusCause]
    retryAfterSeconds: int


class StatusPayload(TypedDict):
    """``metav1.Status`` as the apiserver writes it for a failure.

    Key order on the wire: kind, apiVersion, metadata, status, message, reason, details, code.
    """

    kind: Literal["Status"]
    apiVersion: Literal["v1"]
    metadata: ListMeta
    status: str
    message: NotRequired[str]
    reason: NotRequired[str]
    details: NotRequired[StatusDetails]
    code: int
