"""Comparing a shape's cached objects with the apiserver's list of them (``warmwatch verify``,
docs/design.md §8).

Pure and synchronous: the caller (``proxy.upstream.verifying``) feeds the apiserver's list
page by page into a :class:`Comparison`, which walks the cache's rows alongside in the same
order — a merge join, so neither side is ever held in memory whole. Objects are compared by
(namespace, name, resourceVersion) from the stored key and ``rv`` columns, so a shape's
encoding (JSON or protobuf) does not matter.

The order is the apiserver's: a list comes in etcd key order, ``<prefix>/<namespace>/<name>``
compared byte by byte, which is *not* (namespace, name) order — ``team-a/x`` sorts before
``team/y`` because ``-`` sorts before ``/``. :func:`cached_items` reads the rows in that
order from the primary-key index: namespaces (sorted as ``namespace + "/"``), and within each
the names in index order. A list that is not in that order is refused
(:class:`OutOfOrder`) rather than misreported.
"""

from __future__ import annotations

import enum
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from proxy.cache.records import rv_order


@dataclass(frozen=True, kw_only=True, slots=True)
class Item:
    """One object as far as the comparison goes."""

    namespace: str
    name: str
    rv: str

    @property
    def order(self) -> str:
        """The etcd key order within a collection."""
        return f"{self.namespace}/{self.name}"

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


class Difference(enum.StrEnum):
    MISSING = "missing"
    """Listed by the apiserver, not in the cache."""
    EXTRA = "extra"
    """In the cache, not listed by the apiserver."""
    STALE = "stale"
    """In both, with different resourceVersions."""
    NEWER_UPSTREAM = "newer-upstream"
    """Missing or stale only because the apiserver's object changed after the cache's RV:
    counted when the list could not be taken at the cache's RV (see ``newer_than``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Example:
    difference: Difference
    namespace: str
    name: str
    cache_rv: str | None
    upstream_rv: str | None


class OutOfOrder(Exception):
    """The apiserver's list is not in key order: a merge join would misreport it."""


@dataclass(kw_only=True)
class Comparison:
    """The merge join of a shape's cached rows with the apiserver's list.

    ``cached`` must yield the rows in etcd key order (:func:`cached_items`). ``newer_than``:
    the list was taken later than the cache's RV (it could not be taken at it); a listed
    object whose RV is newer than that is then counted as ``NEWER_UPSTREAM`` instead of
    missing or stale. ``examples``: how many examples of each difference are kept.
    """

    cached: Iterator[Item]
    newer_than: str | None = None
    examples: int = 5
    equal: int = 0
    counts: dict[Difference, int] = field(default_factory=lambda: dict.fromkeys(Difference, 0))
    found: list[Example] = field(default_factory=list)
    listed: int = 0
    _next: Item | None = None
    _exhausted: bool = False
    _last: str | None = None

    def __post_init__(self) -> None:
        self._advance()

    @property
    def differences(self) -> int:
        """Differences that mean the cache is not what the apiserver holds at its RV."""
        return sum(n for d, n in self.counts.items() if d is not Difference.NEWER_UPSTREAM)

    def _advance(self) -> None:
        self._next = next(self.cached, None)

    def _record(self, difference: Difference, *, cache: Item | None, upstream: Item | None) -> None:
        self.counts[difference] += 1
        if sum(1 for e in self.found if e.difference is difference) < self.examples:
            item = upstream or cache
            assert item is not None
            self.found.append(
                Example(
                    difference=difference,
                    namespace=item.namespace,
                    name=item.name,
                    cache_rv=cache.rv if cache else None,
                    upstream_rv=upstream.rv if upstream else None,
                )
            )

    def _newer_upstream(self, upstream: Item) -> bool:
        if self.newer_than is None:
            return False
        listed, cached = rv_order(upstream.rv), rv_order(self.newer_than)
        return listed is not None and cached is not None and listed > cached

    def feed(self, listed: Iterable[Item]) -> None:
        """The next page of the apiserver's list."""
        for upstream in listed:
            order = upstream.order
            if self._last is not None and order <= self._last:
                raise OutOfOrder(f"the apiserver listed {order} after {self._last}")
            self._last = order
            self.listed += 1
            while self._next is not None and self._next.order < order:
                self._record(Difference.EXTRA, cache=self._next, upstream=None)
                self._advance()
            cache = self._next if self._next is not None and self._next.order == order else None
            if cache is not None:
                self._advance()
            if cache is not None and cache.rv == upstream.rv:
                self.equal += 1
            elif self._newer_upstream(upstream):
                self._record(Difference.NEWER_UPSTREAM, cache=cache, upstream=upstream)
            else:
                missing_or_stale = Difference.STALE if cache else Difference.MISSING
                self._record(missing_or_stale, cache=cache, upstream=upstream)

    def finish(self) -> None:
        """The list ended: every cached row not yet matched is extra."""
        while self._next is not None:
            self._record(Difference.EXTRA, cache=self._next, upstream=None)
            self._advance()


def cached_items(connection: sqlite3.Connection, *, gen: int, batch: int = 2000) -> Iterator[Item]:
    """A shape's rows (its generation ``shapes.gen``) in etcd key order, read from the
    primary-key index in batches.

    Call it inside a read transaction (``BEGIN``) to read one snapshot. Namespaces are found
    one index seek each (``min(namespace) > previous``), not by reading every row twice.
    """
    namespaces: list[str] = []
    previous: str | None = None
    while True:
        (namespace,) = connection.execute(
            "SELECT min(namespace) FROM objects WHERE gen = ?"
            + (" AND namespace > ?" if previous is not None else ""),
            (gen,) if previous is None else (gen, previous),
        ).fetchone()
        if namespace is None:
            break
        namespaces.append(namespace)
        previous = namespace
    for namespace in sorted(namespaces, key=lambda ns: f"{ns}/"):
        cursor = connection.execute(
            "SELECT name, rv FROM objects WHERE gen = ? AND namespace = ? ORDER BY name",
            (gen, namespace),
        )
        while rows := cursor.fetchmany(batch):
            for name, rv in rows:
                yield Item(namespace=namespace, name=name, rv=rv)
