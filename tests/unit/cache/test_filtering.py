"""Local filtering of a broader shape (proxy/cache/filtering.py), as the apiserver's watch cache
decides per change (``cacheWatcher.convertToWatchEvent``): the new and the previous state's
match decide the event, a transition out carries the previous object at the change's RV."""

from __future__ import annotations

import orjson
import pytest

from proxy.cache import filtering
from proxy.cache.filtering import Filter, event_object
from proxy.cache.records import ChangeType, EventRecord
from proxy.kube.selectors import FieldSelector, LabelSelector


def obj(name: str, rv: str, tier: str, namespace: str = "a") -> bytes:
    return orjson.dumps(
        {
            "kind": "ConfigMap",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "resourceVersion": rv,
                "labels": {"tier": tier},
            },
        }
    )


def labels(tier: str) -> bytes:
    return orjson.dumps({"tier": tier})


def record(
    change: ChangeType,
    *,
    tier: str,
    before: str | None = None,
    rv: str = "9",
    namespace: str = "a",
) -> EventRecord:
    return EventRecord(
        seq=1,
        type=change,
        rv=rv,
        batch=False,
        namespace=namespace,
        name="x",
        labels=labels(tier),
        prev_labels=labels(before) if before is not None else None,
        prev_raw=obj("x", "5", before, namespace) if before not in (None, tier) else None,
        raw=obj("x", rv, tier, namespace),
    )


TIER_A = Filter(labels=LabelSelector.parse("tier=a"))


@pytest.mark.parametrize(
    ("change", "tier", "before", "sent"),
    [
        (ChangeType.ADDED, "a", None, ChangeType.ADDED),
        (ChangeType.ADDED, "b", None, None),
        (ChangeType.MODIFIED, "a", "a", ChangeType.MODIFIED),  # both match
        (ChangeType.MODIFIED, "a", "b", ChangeType.ADDED),  # starts matching
        (ChangeType.MODIFIED, "b", "a", ChangeType.DELETED),  # stops matching
        (ChangeType.MODIFIED, "b", "c", None),  # neither
        (ChangeType.DELETED, "a", "a", ChangeType.DELETED),
        (ChangeType.DELETED, "b", "b", None),
        (ChangeType.BOOKMARK, "a", None, None),  # positions, never sent
    ],
)
def test_label_selector_transitions(
    change: ChangeType, tier: str, before: str | None, sent: ChangeType | None
) -> None:
    assert TIER_A.event_type(record(change, tier=tier, before=before)) is sent


def test_a_transition_out_carries_the_previous_object_at_the_changes_rv() -> None:
    leaving = record(ChangeType.MODIFIED, tier="b", before="a", rv="12")
    sent = orjson.loads(event_object(leaving, ChangeType.DELETED))
    assert sent["metadata"]["labels"] == {"tier": "a"}
    assert sent["metadata"]["resourceVersion"] == "12"
    # every other event carries the record's own object
    assert event_object(leaving, ChangeType.MODIFIED) == leaving.raw
    deleted = record(ChangeType.DELETED, tier="a", before="a")
    assert event_object(deleted, ChangeType.DELETED) == deleted.raw


def test_namespace_and_name_filter_without_transitions() -> None:
    in_b = Filter(namespace="b")
    assert in_b.event_type(record(ChangeType.MODIFIED, tier="a", before="b")) is None
    changed = record(ChangeType.MODIFIED, tier="a", before="b", namespace="b")
    assert in_b.event_type(changed) is ChangeType.MODIFIED
    named = Filter(fields=FieldSelector.parse("metadata.name=y"))
    assert named.event_type(changed) is None
    assert not named.is_everything and Filter().is_everything


def test_admits_the_current_state() -> None:
    assert TIER_A.admits(namespace="a", name="x", labels=labels("a"))
    assert not TIER_A.admits(namespace="a", name="x", labels=labels("b"))
    assert Filter(labels=LabelSelector.parse("!tier")).admits(namespace="a", name="x", labels=b"")


def test_label_matches_are_remembered_within_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(filtering, "LABEL_MEMO", 4)
    view = Filter(labels=LabelSelector.parse("tier in (t1,t3)"))
    answers = [view.admits(namespace="a", name="x", labels=labels(f"t{i}")) for i in range(10)]
    assert answers == [i in (1, 3) for i in range(10)]
    assert len(view._matched) <= 4
    # the same answers once remembered
    assert [view.admits(namespace="a", name="x", labels=labels(f"t{i}")) for i in range(10)] == (
        answers
    )
