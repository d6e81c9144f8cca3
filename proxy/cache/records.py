"""The values that move through the cache: upstream changes in, log events out.

A :class:`Change` is one upstream watch event (or one listed object) reduced to what the store
needs: the key, the RV, the labels for selector filtering and the object's bytes exactly as they
will be served — JSON, or for a protobuf shape the object's own protobuf message. An
:class:`EventRecord` is one committed entry of a shape's event log.

The two encodings are told apart by their first byte where that matters
(:func:`with_resource_version`): a JSON object starts with ``{``; an object's protobuf
message starts with the tag of its field 1, its ObjectMeta (``0x0a``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.kube import protobuf, versions


class ChangeType(enum.StrEnum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"
    BOOKMARK = "BOOKMARK"


@dataclass(frozen=True, kw_only=True, slots=True)
class Change:
    type: ChangeType
    rv: str
    namespace: str = ""
    name: str = ""
    uid: str = ""
    labels: bytes = b"{}"
    raw: bytes = b""

    @property
    def rv_order(self) -> int | None:
        return rv_order(self.rv)


@dataclass(frozen=True, kw_only=True, slots=True)
class EventRecord:
    """One committed log entry. BOOKMARK records are positions only and are never served."""

    seq: int
    type: ChangeType
    rv: str
    batch: bool
    """Part of a relist diff: several records share the relist RV."""
    namespace: str
    name: str
    labels: bytes | None
    prev_labels: bytes | None
    """Labels before this change, for label-selector transitions (None: no previous state)."""
    prev_raw: bytes | None
    """The previous object, kept only when the labels changed (a transition to DELETED sends it)."""
    raw: bytes | None
    at: float = 0.0
    """When it was committed (wall clock), for the event delivery lag metric."""


_INT64_MAX = 2**63 - 1


def rv_order(rv: str) -> int | None:
    """The RV as a sortable integer where it is well-formed (KEP-5504), else None."""
    if versions.is_well_formed(rv) and (len(rv) < 19 or int(rv) <= _INT64_MAX):
        return int(rv)
    return None


def labels_json(obj: dict[str, Any]) -> bytes:
    labels = obj.get("metadata", {}).get("labels") or {}
    return orjson.dumps(labels, option=orjson.OPT_SORT_KEYS)


def change_from_object(
    change_type: ChangeType, obj: dict[str, Any], *, raw: bytes | None = None
) -> Change:
    """A Change for ``obj`` (decoded); ``raw`` are its exact bytes when the caller has them."""
    metadata = obj.get("metadata") or {}
    return Change(
        type=change_type,
        rv=str(metadata.get("resourceVersion", "")),
        namespace=metadata.get("namespace", ""),
        name=metadata.get("name", ""),
        uid=metadata.get("uid", ""),
        labels=labels_json(obj),
        raw=raw if raw is not None else orjson.dumps(obj),
    )


def change_from_protobuf(change_type: ChangeType, raw: bytes) -> Change:
    """A Change for an object's own protobuf message (the ``raw`` of its envelope)."""
    meta = protobuf.object_meta(raw)
    return Change(
        type=change_type,
        rv=meta.resource_version,
        namespace=meta.namespace,
        name=meta.name,
        uid=meta.uid,
        labels=orjson.dumps(meta.labels, option=orjson.OPT_SORT_KEYS),
        raw=raw,
    )


def with_resource_version(raw: bytes, rv: str) -> bytes:
    """``raw`` with ``metadata.resourceVersion`` replaced (DELETED events carry the deletion's
    RV), in the object's own encoding."""
    if not raw.startswith(b"{"):
        return protobuf.with_resource_version(raw, rv)
    obj = orjson.loads(raw)
    obj.setdefault("metadata", {})["resourceVersion"] = rv
    return orjson.dumps(obj)
