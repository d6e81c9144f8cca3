"""The verify comparison: a merge join of the cache's rows with the apiserver's list."""

from __future__ import annotations

import sqlite3

import pytest

from proxy.cache.verifying import Comparison, Difference, Item, OutOfOrder, cached_items


def put(db: sqlite3.Connection, namespace: str, name: str, rv: str, *, gen: int = 1) -> None:
    db.execute(
        "INSERT INTO objects (gen, namespace, name, uid, rv, labels, raw) "
        "VALUES (?, ?, ?, '', ?, '{}', '{}')",
        (gen, namespace, name, rv),
    )


def etcd_order(items: list[Item]) -> list[Item]:
    """How the apiserver lists: by the key ``<namespace>/<name>``, byte by byte."""
    return sorted(items, key=lambda i: f"{i.namespace}/{i.name}".encode())


def test_rows_come_in_etcd_key_order_not_namespace_name_order(db: sqlite3.Connection) -> None:
    # "team-a/x" < "team/y" in etcd ('-' < '/'), though ("team", ..) < ("team-a", ..).
    for namespace, name in [("team", "y"), ("team-a", "x"), ("team", "a"), ("b", "z")]:
        put(db, namespace, name, "1")
    put(db, "other-shape", "q", "1", gen=2)
    got = [str(i) for i in cached_items(db, gen=1, batch=1)]
    assert got == ["b/z", "team-a/x", "team/a", "team/y"]
    assert got == [
        str(i)
        for i in etcd_order(
            [Item(namespace=s.split("/")[0], name=s.split("/")[1], rv="1") for s in got]
        )
    ]


def test_equal_cache_has_no_differences(db: sqlite3.Connection) -> None:
    listed = [Item(namespace="ns", name=f"cm-{i}", rv=str(10 + i)) for i in range(7)]
    for item in listed:
        put(db, item.namespace, item.name, item.rv)
    comparison = Comparison(cached=cached_items(db, gen=1))
    for page in (listed[:3], listed[3:6], listed[6:]):
        comparison.feed(page)
    comparison.finish()
    assert comparison.equal == 7 and comparison.differences == 0 and comparison.found == []


def test_missing_extra_and_stale_are_each_found(db: sqlite3.Connection) -> None:
    put(db, "ns", "a", "5")
    put(db, "ns", "b", "6")  # stale: the apiserver has 9
    put(db, "ns", "c", "7")  # extra
    put(db, "ns", "e", "8")
    put(db, "ns", "z", "8")  # extra, after the list's end
    listed = [
        Item(namespace="ns", name="a", rv="5"),
        Item(namespace="ns", name="b", rv="9"),
        Item(namespace="ns", name="d", rv="3"),  # missing
        Item(namespace="ns", name="e", rv="8"),
    ]
    comparison = Comparison(cached=cached_items(db, gen=1))
    comparison.feed(listed[:2])
    comparison.feed(listed[2:])
    comparison.finish()
    assert comparison.equal == 2
    assert comparison.counts[Difference.MISSING] == 1
    assert comparison.counts[Difference.EXTRA] == 2
    assert comparison.counts[Difference.STALE] == 1
    assert comparison.differences == 4
    found = {(e.difference, e.name, e.cache_rv, e.upstream_rv) for e in comparison.found}
    assert found == {
        (Difference.STALE, "b", "6", "9"),
        (Difference.EXTRA, "c", "7", None),
        (Difference.MISSING, "d", None, "3"),
        (Difference.EXTRA, "z", "8", None),
    }


def test_examples_are_capped_but_counts_are_not(db: sqlite3.Connection) -> None:
    for i in range(50):
        put(db, "", f"n{i:03d}", "1")
    comparison = Comparison(cached=cached_items(db, gen=1), examples=3)
    comparison.feed([])
    comparison.finish()
    assert comparison.counts[Difference.EXTRA] == 50
    assert len(comparison.found) == 3


def test_objects_changed_upstream_after_the_cache_rv_are_not_differences(
    db: sqlite3.Connection,
) -> None:
    put(db, "ns", "a", "5")
    put(db, "ns", "b", "6")
    comparison = Comparison(cached=cached_items(db, gen=1), newer_than="10")
    comparison.feed(
        [
            Item(namespace="ns", name="a", rv="12"),  # modified after RV 10
            Item(namespace="ns", name="b", rv="4"),  # older than the cache's: corruption
            Item(namespace="ns", name="c", rv="11"),  # created after RV 10
        ]
    )
    comparison.finish()
    assert comparison.counts[Difference.NEWER_UPSTREAM] == 2
    assert comparison.counts[Difference.STALE] == 1
    assert comparison.differences == 1


def test_a_list_out_of_key_order_is_refused(db: sqlite3.Connection) -> None:
    comparison = Comparison(cached=cached_items(db, gen=1))
    with pytest.raises(OutOfOrder):
        comparison.feed(
            [Item(namespace="", name="b", rv="1"), Item(namespace="", name="a", rv="1")]
        )
