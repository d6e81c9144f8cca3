"""Read your writes: what the cache must show before it answers a "most recent" read.

The apiserver promises a LIST or watch with ``resourceVersion`` unset the most recent state
(a consistent read; client-go >= 1.35 starts informers that way). warmwatch cannot know the
apiserver's current revision without asking it, and asking would defeat a cache that must
answer while the apiserver is down. What it can guarantee, and what a controller relies on,
is that it sees its own writes: every write passed through warmwatch is recorded here, and a
most-recent read waits (bounded) until the cache shows it — the written resourceVersion
reached, the deleted object gone — or else is passed through to the apiserver.

Recorded per resource (group/version/resource) and namespace:

- the newest resourceVersion an answer to a create, update or patch carried (the object's
  RV is exactly the revision of the write, which the shape's watch will deliver);
- the objects deleted through warmwatch: a delete is usually answered with a Status, which
  carries no resourceVersion, so the read waits until the object has left the cache instead.
  Deletes are kept for ``keep_deletes`` seconds and at most ``max_deletes`` of them.

Writes made by other clients of the apiserver, not through this warmwatch, are not seen:
for them a most-recent read is as fresh as the cache (see the README).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from proxy.kube import versions
from proxy.kube.resources import GroupVersionResource

Clock = Callable[[], float]


@dataclass(frozen=True, kw_only=True, slots=True)
class Target:
    """What a read must see: the cache at ``rv`` or later, and none of ``deleted``."""

    rv: str | None
    deleted: tuple[tuple[str, str], ...]
    """(namespace, name) of objects deleted through warmwatch."""

    @property
    def empty(self) -> bool:
        return self.rv is None and not self.deleted


def reached(current: str | None, target: str | None) -> bool:
    """The cache at ``current`` shows a write at ``target`` (None: nothing to wait for)."""
    if target is None:
        return True
    if current is None:
        return False
    return versions.compare(current, target) in (0, 1) or current == target


class RecentWrites:
    def __init__(
        self,
        *,
        keep_deletes: float = 60.0,
        max_deletes: int = 10_000,
        max_namespaces: int = 100_000,
        clock: Clock = time.monotonic,
    ) -> None:
        self.keep_deletes = keep_deletes
        """Long enough for the cache to see any delete while the upstream watch is healthy
        (it delivers in milliseconds); a read waits for a delete only this long after it."""
        self.max_deletes = max_deletes
        self.max_namespaces = max_namespaces
        self._clock = clock
        self._rvs: dict[GroupVersionResource, OrderedDict[str, str]] = {}
        self._deletes: OrderedDict[tuple[GroupVersionResource, str, str], float] = OrderedDict()

    def wrote(self, gvr: GroupVersionResource, *, namespace: str, rv: str) -> None:
        """A create/update/patch answered with an object at ``rv``."""
        per_namespace = self._rvs.setdefault(gvr, OrderedDict())
        previous = per_namespace.pop(namespace, None)
        if previous is not None and versions.compare(previous, rv) == 1:
            rv = previous  # an older answer arriving late does not lower the target
        per_namespace[namespace] = rv
        while len(per_namespace) > self.max_namespaces:
            per_namespace.popitem(last=False)

    def deleted(self, gvr: GroupVersionResource, *, namespace: str, name: str) -> None:
        """A delete of one object succeeded."""
        key = (gvr, namespace, name)
        self._deletes.pop(key, None)
        self._deletes[key] = self._clock()
        while len(self._deletes) > self.max_deletes:
            self._deletes.popitem(last=False)

    def target(self, gvr: GroupVersionResource, *, namespace: str | None) -> Target:
        """What a read of ``gvr`` in ``namespace`` (None: all namespaces) must see."""
        oldest = self._clock() - self.keep_deletes
        while self._deletes and next(iter(self._deletes.values())) < oldest:
            self._deletes.popitem(last=False)
        per_namespace = self._rvs.get(gvr, OrderedDict[str, str]())
        candidates = per_namespace.values() if namespace is None else [per_namespace.get(namespace)]
        rv: str | None = None
        for written in candidates:
            if written is not None and (rv is None or versions.compare(written, rv) == 1):
                rv = written
        deleted = tuple(
            (ns, name)
            for (deleted_gvr, ns, name) in self._deletes
            if deleted_gvr == gvr and (namespace is None or ns == namespace)
        )
        return Target(rv=rv, deleted=deleted)
