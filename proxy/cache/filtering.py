"""Local filtering of a broader shape for a narrower request, and selector transitions.

Mirrors the apiserver's watch cache (``cacheWatcher.convertToWatchEvent``): for each change,
whether the new and the previous state match decides what the watcher is sent —
both: MODIFIED; only the new: ADDED; only the previous: DELETED carrying the *previous* object
with the change's RV; neither: nothing. Namespace and name never change, so filtering on them
has no transitions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from proxy.cache.records import ChangeType, EventRecord, with_resource_version
from proxy.kube.selectors import FieldSelector, LabelSelector, generic_fields


@dataclass(frozen=True, kw_only=True, slots=True)
class Filter:
    namespace: str | None = None
    labels: LabelSelector = LabelSelector.EVERYTHING
    fields: FieldSelector = FieldSelector.EVERYTHING

    @property
    def is_everything(self) -> bool:
        return not self.namespace and self.labels.is_everything and self.fields.is_everything

    def _key_matches(self, namespace: str, name: str) -> bool:
        if self.namespace and namespace != self.namespace:
            return False
        return self.fields.is_everything or self.fields.matches(
            generic_fields(name=name, namespace=namespace)
        )

    def _labels_match(self, labels: bytes | None) -> bool:
        if self.labels.is_everything:
            return True
        decoded: Any = orjson.loads(labels) if labels else {}
        return self.labels.matches(decoded)

    def admits(self, *, namespace: str, name: str, labels: bytes) -> bool:
        """An object of the current state belongs to the filtered view."""
        return self._key_matches(namespace, name) and self._labels_match(labels)

    def event_for(self, record: EventRecord) -> tuple[ChangeType, bytes] | None:
        """What a watcher with this filter is sent for ``record`` (None: nothing)."""
        if record.type is ChangeType.BOOKMARK or record.raw is None:
            return None
        if self.is_everything:
            return record.type, record.raw
        if not self._key_matches(record.namespace, record.name):
            return None
        if self.labels.is_everything:
            return record.type, record.raw
        if record.type is ChangeType.DELETED:
            last = record.prev_labels if record.prev_labels is not None else record.labels
            return (record.type, record.raw) if self._labels_match(last) else None
        now = self._labels_match(record.labels)
        before = record.prev_labels is not None and self._labels_match(record.prev_labels)
        if now and before:
            return ChangeType.MODIFIED, record.raw
        if now:
            return ChangeType.ADDED, record.raw
        if before:
            previous = record.prev_raw if record.prev_raw is not None else record.raw
            return ChangeType.DELETED, with_resource_version(previous, record.rv)
        return None
