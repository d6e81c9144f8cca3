"""The read-your-writes rule: what a most-recent read must see (no I/O)."""

from __future__ import annotations

from proxy.cache.freshness import RecentWrites, Target, reached
from proxy.kube.resources import GroupVersionResource

CM = GroupVersionResource.parse("v1/configmaps")
DEPLOY = GroupVersionResource.parse("apps/v1/deployments")


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_nothing_written_nothing_to_wait_for() -> None:
    assert RecentWrites().target(CM, namespace=None).empty


def test_the_newest_write_per_namespace_and_over_all() -> None:
    writes = RecentWrites()
    writes.wrote(CM, namespace="a", rv="120")
    writes.wrote(CM, namespace="a", rv="110")  # a slower answer arriving late
    writes.wrote(CM, namespace="b", rv="130")
    writes.wrote(DEPLOY, namespace="a", rv="999")
    assert writes.target(CM, namespace="a") == Target(rv="120", deleted=())
    assert writes.target(CM, namespace="b").rv == "130"
    assert writes.target(CM, namespace=None).rv == "130"
    assert writes.target(CM, namespace="c").empty


def test_deletes_are_kept_for_a_while_and_bounded() -> None:
    clock = Clock()
    writes = RecentWrites(keep_deletes=60, max_deletes=2, clock=clock)
    writes.deleted(CM, namespace="a", name="x")
    clock.now = 30
    writes.deleted(CM, namespace="b", name="y")
    assert writes.target(CM, namespace=None).deleted == (("a", "x"), ("b", "y"))
    assert writes.target(CM, namespace="b").deleted == (("b", "y"),)
    assert writes.target(DEPLOY, namespace=None).empty
    clock.now = 61
    assert writes.target(CM, namespace=None).deleted == (("b", "y"),)  # x expired
    writes.deleted(CM, namespace="c", name="z1")
    writes.deleted(CM, namespace="c", name="z2")
    assert writes.target(CM, namespace=None).deleted == (("c", "z1"), ("c", "z2"))  # bounded


def test_reached() -> None:
    assert reached("100", None)
    assert reached("100", "100") and reached("101", "100")
    assert not reached("99", "100")
    assert not reached(None, "100")
    assert reached("abc", "abc") and not reached("abc", "abd")  # not integers: equality only
