"""Local filtering of a broader shape for a narrower request, and selector transitions.

Mirrors the apiserver's watch cache (``cacheWatcher.convertToWatchEvent``): for each change,
whether the new and the previous state match decides what the watcher is sent —
both: MODIFIED; only the new: ADDED; only the previous: DELETED carrying the *previous* object
with the change's RV; neither: nothing. Namespace and name never change, so filtering on them
has no transitions.

What a watcher is sent is decided in two steps, :meth:`Filter.event_type` (per watcher: its
selectors) and :func:`event_object` (per record and event type: the same for every watcher),
so that watchers of one shape can share the rendering of each record (``serve/rendering.py``
``Frames``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from proxy.cache.records import ChangeType, EventRecord, with_resource_version
from proxy.kube.selectors import FieldSelector, LabelSelector, generic_fields

LABEL_MEMO: Final = 1024
"""Distinct label sets whose match a filter remembers (then it forgets them all): a collection
has few distinct label sets, and each would otherwise be decoded for every record and
watcher."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Filter:
    namespace: str | None = None
    labels: LabelSelector = LabelSelector.EVERYTHING
    fields: FieldSelector = FieldSelector.EVERYTHING
    is_everything: bool = field(init=False, compare=False)
    """Nothing is filtered out (the request equals its shape)."""
    _matched: dict[bytes, bool] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        everything = not self.namespace and self.labels.is_everything
        object.__setattr__(self, "is_everything", everything and self.fields.is_everything)
        object.__setattr__(self, "_matched", {})

    def _key_matches(self, namespace: str, name: str) -> bool:
        if self.namespace and namespace != self.namespace:
            return False
        return self.fields.is_everything or self.fields.matches(
            generic_fields(name=name, namespace=namespace)
        )

    def _labels_match(self, labels: bytes | None) -> bool:
        """Whether the label set (canonical JSON, as stored) matches the label selector."""
        if self.labels.is_everything:
            return True
        labels = labels or b"{}"
        matched = self._matched.get(labels)
        if matched is None:
            if len(self._matched) >= LABEL_MEMO:
                self._matched.clear()
            decoded: Any = orjson.loads(labels)
            matched = self._matched[labels] = self.labels.matches(decoded)
        return matched

    def admits(self, *, namespace: str, name: str, labels: bytes) -> bool:
        """An object of the current state belongs to the filtered view."""
        return self._key_matches(namespace, name) and self._labels_match(labels)

    def event_type(self, record: EventRecord) -> ChangeType | None:
        """The event a watcher with this filter is sent for ``record`` (None: nothing); its
        object is :func:`event_object` of the two."""
        if record.type is ChangeType.BOOKMARK or record.raw is None:
            return None
        if self.is_everything:
            return record.type
        if not self._key_matches(record.namespace, record.name):
            return None
        if self.labels.is_everything:
            return record.type
        if record.type is ChangeType.DELETED:
            last = record.prev_labels if record.prev_labels is not None else record.labels
            return record.type if self._labels_match(last) else None
        now = self._labels_match(record.labels)
        before = record.prev_labels is not None and self._labels_match(record.prev_labels)
        if now and before:
            return ChangeType.MODIFIED
        if now:
            return ChangeType.ADDED
        if before:
            return ChangeType.DELETED
        return None


def event_object(record: EventRecord, event_type: ChangeType) -> bytes:
    """The object of the ``event_type`` event that :meth:`Filter.event_type` chose for
    ``record``: the record's own, except for a transition out of a selector (DELETED for a
    change that is not a delete), which carries the previous object with the change's RV."""
    assert record.raw is not None
    if event_type is ChangeType.DELETED and record.type is not ChangeType.DELETED:
        previous = record.prev_raw if record.prev_raw is not None else record.raw
        return with_resource_version(previous, record.rv)
    return record.raw
