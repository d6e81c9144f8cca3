"""The fault test's checker: what clients saw through warmwatch, against what the apiserver did.

A randomized fault run (etcd ``tests/robustness`` style) has many clients list and watch through
warmwatch while warmwatch is killed and restarted, the apiserver stops and starts, etcd compacts
(warmwatch's resume gets 410, it relists and appends the diff) and clients stay away until their
RV leaves warmwatch's log (they get 410 and relist). A reference client watching the apiserver
directly records every change: the *reference history*. :func:`check` replays it and holds each
client's observation log to the guarantees of docs/design.md §5a; this module does no I/O except
:func:`read_run`, which loads a recorded run (JSON lines, see :func:`parse_run`).

Definitions used by the rules:

- The *expected events* of a client are the reference changes as the apiserver's watch cache
  would show them to the client's filter (namespace, label selector): for each change, whether
  the object's previous and new versions match decides — both: MODIFIED; only the new: ADDED;
  only the previous: DELETED (at the change's RV); neither: nothing.
- An *epoch* of a client starts at a snapshot — a LIST answer at RV L, or the initial events of
  a WatchList ending with the bookmark at L — and lasts until the next snapshot; the watches in
  between resume one another. (A watch from an RV with no snapshot before it starts an epoch at
  that RV, with no known state.) The epoch *covers* the RVs (L, last], where ``last`` is the
  greatest event or bookmark RV received in it (or resumed from): a bookmark at B promises
  everything up to B. When ``last`` is a relist RV reached by one of the batch's events rather
  than a bookmark, the batch's other events at that RV are not yet due (they share the RV).
- An upstream relist at RV R has a *window* (P, R]: P is where warmwatch's cache stood when its
  resume got 410. If the driver does not know P, it is bounded from below by the previous relist
  of the shape and by what any client of the shape observed before R that only an un-collapsed
  log can contain (a list or bookmark RV below R; an event for a version that is not the
  object's last version up to R).
- *Collapse* (the allowance of rule 3): within a window, warmwatch's log holds an object's
  versions up to P one by one, then the relist batch holds the object's last version up to R —
  compared with the version it had cached at P, which decides the event type for a filtered
  client — or, if the object is gone at R, a DELETED stamped R (or at its real RV). So per
  object, a client may receive any prefix of its expected events in the window followed by that
  one collapse event; objects created and deleted inside the window may not appear at all.

The rules (docs/design.md §5a wins over anything stricter):

1. **ordered** — within a client's stream, across resumes and restarts, an event's RV is
   greater than the previous event's; it may equal it only for a DELETED at a relist RV (the
   batch's DELETEDs share it). The initial events of a WatchList and LIST items carry object
   RVs and are exempt. An event older than one received earlier *in the same connection* is an
   ordering violation; otherwise going back is time travel (rule 2).
2. **no-time-travel** — no LIST, event or bookmark carries an RV lower than the highest the
   client already received (a relist after 410 included). After a LIST that went back, the
   client's position is that LIST's RV (so one fault is not reported once per later event).
3. **complete** — in each epoch, every expected event in the covered RVs is received, with the
   right type, and nothing else is received — except as collapse allows inside relist windows.
   Each snapshot equals the reference state at its RV restricted to the client's filter: every
   object at its RV there, nothing more. (A relist's collapse leaves the cache at R exactly in
   the reference state at R, so no allowance is needed for lists.)
4. **unique** — no event (object, RV) twice in an epoch, no event for a version the epoch's
   snapshot already held, no object twice in one snapshot; except the replay of a relist batch:
   a watch resumed from a relist RV R may start with events at R again (each must be one the
   batch could hold).
5. **resumable** — a watch resumed from RV X (after a LIST at X, a WatchList's bookmark X, or the
   last RV received) continues right after X: its first event is after X (at X only as a
   relist replay), and an expected event between X and the first RV the watch delivered is a
   resumability violation rather than a completeness one (outside relist windows: a watch
   may legitimately continue at a relist batch).
6. **convergent** — each client's final state (given, or its snapshots with its events applied)
   equals the apiserver's final state (given, or the reference replayed) restricted to the
   client's filter. If the apiserver's final state is given and the reference replay disagrees
   with it, that is reported for client ``(reference)``: the history is incomplete and the other
   verdicts cannot be trusted.

A client's log is assumed to be what client-go does: resume from the last RV received (event or
bookmark), relist after 410. Plain watches from RV "0" are not modelled (their initial events
have no end marker): the driver uses LIST+WATCH or WatchList. RVs are integers and the
reference's RVs strictly increase.
"""

from __future__ import annotations

import enum
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from proxy.kube.selectors import LabelSelector

__all__ = [
    "Bookmarked",
    "Change",
    "ClientLog",
    "Counts",
    "EventType",
    "Expired",
    "Item",
    "Listed",
    "Observation",
    "Received",
    "Reference",
    "Report",
    "Rule",
    "Run",
    "StreamEnded",
    "UpstreamRelist",
    "Violation",
    "WatchStarted",
    "check",
    "check_run",
    "format_run",
    "parse_run",
    "read_run",
]

Key = tuple[str, str]
"""An object's identity: (namespace, name); namespace "" for cluster-scoped objects."""

DETAILS_LIMIT = 50
_REFERENCE = "(reference)"


def show(key: Key) -> str:
    """``namespace/name`` (or ``name`` for a cluster-scoped object)."""
    return f"{key[0]}/{key[1]}" if key[0] else key[1]


# ============================================================================ inputs


class EventType(enum.StrEnum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


@dataclass(frozen=True, kw_only=True, slots=True)
class Item:
    """One object version in a list or a state. ``labels`` matter only where the checker
    filters the item itself (the reference's initial list, the apiserver's final state)."""

    namespace: str
    name: str
    rv: int
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)


@dataclass(frozen=True, kw_only=True, slots=True)
class Change:
    """One upstream change as the reference watch saw it; a DELETED carries the object's last
    labels (as the apiserver's DELETED carries its last state)."""

    type: EventType
    namespace: str
    name: str
    rv: int
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class Reference:
    """Everything upstream did: the state listed at ``initial_rv`` (empty if the run starts on
    an empty collection), then every change after it, RVs strictly increasing."""

    changes: Sequence[Change]
    initial_rv: int = 0
    initial: Sequence[Item] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class UpstreamRelist:
    """warmwatch relisted ``shape`` after a 410 and appended the diff at ``rv``.

    ``reached`` is the RV its cache stood at when the resume got 410, if the driver knows it
    (it tightens the window of allowed collapse); ``shape`` names the warmwatch shape, matched
    against :attr:`ClientLog.shape` ("" for both when all clients share one shape)."""

    rv: int
    reached: int | None = None
    shape: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class Listed:
    """A LIST answer: its ``metadata.resourceVersion`` and its items (labels not needed)."""

    rv: int
    items: Sequence[Item]


@dataclass(frozen=True, kw_only=True, slots=True)
class WatchStarted:
    """A watch request: from ``rv`` (a resume, or the watch after a LIST), or ``None`` for an
    initial-state watch (WatchList) whose initial events end with an
    ``initial_events_end`` bookmark."""

    rv: int | None


@dataclass(frozen=True, kw_only=True, slots=True)
class Received:
    """A watch event (ADDED, MODIFIED or DELETED) and its object's identity and RV."""

    type: EventType
    namespace: str
    name: str
    rv: int

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)


@dataclass(frozen=True, kw_only=True, slots=True)
class Bookmarked:
    """A BOOKMARK; ``initial_events_end`` when it carries ``k8s.io/initial-events-end``."""

    rv: int
    initial_events_end: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class Expired:
    """410 Expired/Gone (an ERROR event or the HTTP status): the client relists next."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamEnded:
    """The watch stream ended (timeout, connection lost, warmwatch killed)."""


Observation = Listed | WatchStarted | Received | Bookmarked | Expired | StreamEnded


@dataclass(frozen=True, kw_only=True, slots=True)
class ClientLog:
    """One client: its filter, everything it observed in order, and its final state (``None``:
    the state its snapshots and events build, as an informer's store)."""

    name: str
    observations: Sequence[Observation]
    namespace: str | None = None
    label_selector: str = ""
    shape: str = ""
    final: Sequence[Item] | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Run:
    """A recorded fault run, everything :func:`check` takes."""

    reference: Reference
    clients: Sequence[ClientLog]
    relists: Sequence[UpstreamRelist] = ()
    apiserver_final: Sequence[Item] | None = None
    faults: int = 0


# ============================================================================ outputs


class Rule(enum.StrEnum):
    ORDERED = "ordered"
    NO_TIME_TRAVEL = "no-time-travel"
    COMPLETE = "complete"
    UNIQUE = "unique"
    RESUMABLE = "resumable"
    CONVERGENT = "convergent"


@dataclass(frozen=True, kw_only=True, slots=True)
class Violation:
    """One broken guarantee. ``key`` is the object involved ("" if none); ``rvs`` the RVs
    involved, the offending one first."""

    rule: Rule
    client: str
    detail: str
    key: str = ""
    rvs: tuple[int, ...] = ()

    def line(self) -> str:
        return f"[{self.rule}] {self.client}: {self.detail}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Counts:
    clients: int = 0
    reference_changes: int = 0
    events: int = 0
    """Watch events received by all clients (initial events included): the events checked."""
    snapshots: int = 0
    bookmarks: int = 0
    resumes: int = 0
    expired: int = 0
    relists: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class Report:
    faults: int
    counts: Counts
    violations: tuple[Violation, ...]

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary_line(self) -> str:
        """Exactly ``faults=<n> events=<n checked> violations=<n>``."""
        return f"faults={self.faults} events={self.counts.events} violations={len(self.violations)}"

    def by_rule(self) -> dict[Rule, int]:
        tally: dict[Rule, int] = {}
        for violation in self.violations:
            tally[violation.rule] = tally.get(violation.rule, 0) + 1
        return tally

    def details(self, *, limit: int = DETAILS_LIMIT) -> list[str]:
        """One line per violation, at most ``limit``, then ``... and N more``."""
        lines = [violation.line() for violation in self.violations[:limit]]
        if len(self.violations) > limit:
            lines.append(f"... and {len(self.violations) - limit} more")
        return lines


# ============================================================================ the reference

_ABSENT: tuple[bool, int] = (False, -1)


class _Row(NamedTuple):
    """A reference change with what filtering needs: the object's previous version."""

    rv: int
    key: Key
    exists: bool
    labels: int
    prev_exists: bool
    prev_labels: int


class _History:
    """The reference indexed: changes in RV order, each object's versions, interned label sets.

    A version is ``(rv, exists, labels id)``; a deletion is a version that does not exist and
    keeps the object's last labels."""

    __slots__ = (
        "_ids",
        "changes",
        "initial",
        "initial_rv",
        "label_sets",
        "rows",
        "rvs",
        "versions",
    )

    def __init__(self, reference: Reference) -> None:
        self.label_sets: list[Mapping[str, str]] = []
        self._ids: dict[frozenset[tuple[str, str]], int] = {}
        self.initial_rv = reference.initial_rv
        self.initial: dict[Key, tuple[int, int]] = {}
        self.versions: dict[Key, list[tuple[int, bool, int]]] = {}
        self.rvs: list[int] = []
        self.rows: list[_Row] = []
        for item in reference.initial:
            labels = self.intern(item.labels)
            self.initial[item.key] = (item.rv, labels)
            self.versions[item.key] = [(item.rv, True, labels)]
        previous_rv = reference.initial_rv
        for change in reference.changes:
            if change.rv <= previous_rv:
                raise ValueError(
                    f"reference RVs must strictly increase: {change.rv} after {previous_rv}"
                )
            previous_rv = change.rv
            self._add(change)
        self.changes = len(reference.changes)

    def intern(self, labels: Mapping[str, str]) -> int:
        frozen = frozenset(labels.items())
        found = self._ids.get(frozen)
        if found is None:
            found = self._ids[frozen] = len(self.label_sets)
            self.label_sets.append(labels)
        return found

    def _add(self, change: Change) -> None:
        key = (change.namespace, change.name)
        labels = self.intern(change.labels)
        versions = self.versions.setdefault(key, [])
        exists = change.type is not EventType.DELETED
        if versions:
            _, prev_exists, prev_labels = versions[-1]
        elif change.type is EventType.ADDED:
            prev_exists, prev_labels = _ABSENT
        else:  # a change of an object the reference never listed: assume it was there as is
            prev_exists, prev_labels = True, labels
        if not exists and not prev_exists:
            prev_exists, prev_labels = True, labels
        if not exists:
            labels = prev_labels  # the last state decides whether a filtered client sees it
        versions.append((change.rv, exists, labels))
        self.rvs.append(change.rv)
        self.rows.append(
            _Row(
                rv=change.rv,
                key=key,
                exists=exists,
                labels=labels,
                prev_exists=prev_exists,
                prev_labels=prev_labels,
            )
        )

    def version_at(self, key: Key, rv: int) -> tuple[int, bool, int] | None:
        """The object's version at ``rv`` (its last version with an RV ≤ ``rv``), or None."""
        versions = self.versions.get(key)
        if not versions:
            return None
        index = bisect_right(versions, rv, key=lambda v: v[0]) - 1
        return versions[index] if index >= 0 else None

    def window(
        self, key: Key, lo: int, hi: int
    ) -> tuple[tuple[bool, int], list[tuple[int, bool, int]]]:
        """The object's state at ``lo`` and its versions in (lo, hi]."""
        versions = self.versions.get(key, [])
        first = bisect_right(versions, lo, key=lambda v: v[0])
        last = bisect_right(versions, hi, key=lambda v: v[0])
        before = (versions[first - 1][1], versions[first - 1][2]) if first else _ABSENT
        return before, versions[first:last]


class _Filter:
    """A client's view: namespace (None: all) and label selector, matched once per label set
    of the reference (``table``)."""

    __slots__ = ("namespace", "selector", "table")

    def __init__(self, *, client: ClientLog, history: _History) -> None:
        self.namespace = client.namespace
        self.selector = LabelSelector.parse(client.label_selector)
        self.table = [self.selector.matches(labels) for labels in history.label_sets]

    def key_matches(self, key: Key) -> bool:
        return self.namespace is None or key[0] == self.namespace

    def transition(
        self, *, key_ok: bool, before: tuple[bool, int], after: tuple[bool, int]
    ) -> EventType | None:
        """What the watch cache sends this client for a change from ``before`` to ``after``:
        both match → MODIFIED, only ``after`` → ADDED, only ``before`` → DELETED."""
        if not key_ok:
            return None
        table = self.table
        was = before[0] and table[before[1]]
        now = after[0] and table[after[1]]
        if was and now:
            return EventType.MODIFIED
        if now:
            return EventType.ADDED
        if was:
            return EventType.DELETED
        return None


# ============================================================================ pass 1: the stream


@dataclass(slots=True)
class _Epoch:
    """From one snapshot to the next (mutable while the client's log is read)."""

    start: int
    snapshot: dict[Key, int] | None
    last: int
    received: dict[tuple[Key, int], EventType] = field(default_factory=dict)
    resumes: list[tuple[int, int]] = field(default_factory=list)
    """(X, Y): a watch from X whose first RV after X was Y."""
    last_event_rv: int | None = None
    bookmarked: int = -1
    """The greatest bookmark RV received in the epoch."""


@dataclass(slots=True)
class _Connection:
    start: int | None
    """The RV the watch continues from (None during a WatchList's initial events)."""
    initial: dict[Key, int] | None = None
    max_rv: int | None = None
    replaying: bool = False
    continued: bool = False
    """Whether the first RV after ``start`` has been seen."""


class _Reader:
    """Reads one client's log in order: rules 1, 2, 4 and the first-event part of 5; collects
    the epochs that rules 3 and 5 are checked on, the snapshots, and the client's state."""

    def __init__(self, *, client: ClientLog, history: _History, relist_rvs: frozenset[int]) -> None:
        self.client = client
        self.history = history
        self.relist_rvs = relist_rvs
        self.violations: list[Violation] = []
        self.epochs: list[_Epoch] = []
        self.snapshots: list[tuple[int, Mapping[Key, int], _Epoch]] = []
        self.bookmark_rvs: list[int] = []
        self.state: dict[Key, int] = {}
        self.high: int | None = None
        self.epoch: _Epoch | None = None
        self.connection: _Connection | None = None
        self.events = self.bookmarks = self.resumes = self.expired = 0

    def report(
        self, rule: Rule, detail: str, *, key: Key | None = None, rvs: tuple[int, ...]
    ) -> None:
        self.violations.append(
            Violation(
                rule=rule,
                client=self.client.name,
                detail=detail,
                key=show(key) if key else "",
                rvs=rvs,
            )
        )

    def read(self) -> None:
        for observation in self.client.observations:
            match observation:
                case Received():
                    self.on_event(observation)
                case Bookmarked():
                    self.on_bookmark(observation)
                case Listed():
                    self.connection = None
                    items: dict[Key, int] = {}
                    for item in observation.items:
                        self._snapshot_item(items, item.key, item.rv, observation.rv)
                    self.on_snapshot(observation.rv, items)
                case WatchStarted():
                    self.on_watch(observation.rv)
                case Expired():
                    self.expired += 1
                    self.connection = None
                case StreamEnded():
                    self.connection = None

    # -- snapshots and watches ---------------------------------------------------------------

    def on_snapshot(self, rv: int, items: dict[Key, int]) -> None:
        """Rule 2 for the snapshot's RV; a new epoch starts there."""
        if self.high is not None and rv < self.high:
            self.report(
                Rule.NO_TIME_TRAVEL,
                f"snapshot (list) at RV {rv} is older than RV {self.high} the client already had",
                rvs=(rv, self.high),
            )
        self.high = rv
        self.epoch = _Epoch(start=rv, snapshot=items, last=rv)
        self.epochs.append(self.epoch)
        self.snapshots.append((rv, items, self.epoch))
        self.state = dict(items)

    def _snapshot_item(self, items: dict[Key, int], key: Key, rv: int, at: int | None) -> None:
        """Rule 4 for snapshots: an object appears once in a list or in initial events."""
        if key in items:
            where = f"the list at RV {at}" if at is not None else "a WatchList's initial events"
            self.report(
                Rule.UNIQUE,
                f"{where} hold {show(key)} twice (at RVs {items[key]} and {rv})",
                key=key,
                rvs=(rv, items[key]),
            )
        items[key] = rv

    def on_watch(self, rv: int | None) -> None:
        if rv is None:
            self.connection = _Connection(start=None, initial={})
            return
        self.resumes += 1
        if self.epoch is None:  # a watch from a remembered RV, no snapshot: state unknown
            self.epoch = _Epoch(start=rv, snapshot=None, last=rv)
            self.epochs.append(self.epoch)
            self.high = rv if self.high is None else max(self.high, rv)
        else:  # a client resumes from an RV it had: coverage reaches at least there
            self.epoch.last = max(self.epoch.last, rv)
        self.connection = _Connection(start=rv, replaying=rv in self.relist_rvs)

    def _continue(self, connection: _Connection, epoch: _Epoch, rv: int) -> None:
        """Note the first RV after the watch's start (rule 5's interval)."""
        if connection.start is not None and not connection.continued and rv > connection.start:
            connection.continued = True
            epoch.resumes.append((connection.start, rv))

    # -- bookmarks ---------------------------------------------------------------------------

    def on_bookmark(self, bookmark: Bookmarked) -> None:
        connection = self._connection(bookmark.rv)
        if connection.initial is not None:
            if bookmark.initial_events_end:
                self.on_snapshot(bookmark.rv, connection.initial)
                self.connection = _Connection(start=bookmark.rv)
            return
        self.bookmarks += 1
        self.bookmark_rvs.append(bookmark.rv)
        epoch = self._epoch(bookmark.rv)
        if self.high is not None and bookmark.rv < self.high:
            self.report(
                Rule.NO_TIME_TRAVEL,
                f"bookmark at RV {bookmark.rv} is older than RV {self.high} the client already had",
                rvs=(bookmark.rv, self.high),
            )
            return
        if bookmark.rv != connection.start:
            connection.replaying = False
        self.high = bookmark.rv
        epoch.last = max(epoch.last, bookmark.rv)
        epoch.bookmarked = max(epoch.bookmarked, bookmark.rv)
        self._continue(connection, epoch, bookmark.rv)

    # -- events ------------------------------------------------------------------------------

    def on_event(self, event: Received) -> None:
        self.events += 1
        connection = self._connection(event.rv)
        key, rv = event.key, event.rv
        if connection.initial is not None:
            self._snapshot_item(connection.initial, key, rv, None)
            return
        epoch = self._epoch(rv)
        if connection.replaying and rv == connection.start:
            self._replayed(event, epoch)
        else:
            connection.replaying = False
            self._ordered(event, connection, epoch)
            self._continue(connection, epoch, rv)
            epoch.last = max(epoch.last, rv)
            epoch.last_event_rv = rv
        connection.max_rv = rv if connection.max_rv is None else max(connection.max_rv, rv)
        self.high = rv if self.high is None else max(self.high, rv)
        if rv > epoch.start:
            epoch.received.setdefault((key, rv), event.type)
        if event.type is EventType.DELETED:
            self.state.pop(key, None)
        else:
            self.state[key] = rv

    def _ordered(self, event: Received, connection: _Connection, epoch: _Epoch) -> None:
        """Rules 1, 2, 4 and 5 (first event) for one event outside a relist replay."""
        key, rv, high = event.key, event.rv, self.high
        what = f"{event.type} {show(key)}@{rv}"
        if high is None or rv > high:
            return
        if rv < high:
            if connection.max_rv is not None and connection.max_rv > rv:
                self.report(
                    Rule.ORDERED,
                    f"{what} came after RV {connection.max_rv} in the same watch",
                    key=key,
                    rvs=(rv, connection.max_rv),
                )
            else:
                self.report(
                    Rule.NO_TIME_TRAVEL,
                    f"{what} is older than RV {high} the client already had",
                    key=key,
                    rvs=(rv, high),
                )
            return
        # rv == high
        if (key, rv) in epoch.received:
            self.report(Rule.UNIQUE, f"{what} received twice", key=key, rvs=(rv,))
        elif epoch.snapshot is not None and rv == epoch.start and epoch.snapshot.get(key) == rv:
            self.report(
                Rule.UNIQUE,
                f"{what} repeats the version the list at RV {epoch.start} held",
                key=key,
                rvs=(rv,),
            )
        elif epoch.last_event_rv == rv:
            if not (event.type is EventType.DELETED and rv in self.relist_rvs):
                self.report(
                    Rule.ORDERED,
                    f"{what} shares RV {rv} with the previous event (only a relist batch's "
                    "DELETEDs may)",
                    key=key,
                    rvs=(rv,),
                )
        elif connection.max_rv is None and connection.start == rv:
            self.report(
                Rule.RESUMABLE,
                f"watch from RV {rv} began with {what} instead of what follows RV {rv}",
                key=key,
                rvs=(rv,),
            )
        else:
            self.report(Rule.ORDERED, f"{what} is not after bookmark RV {rv}", key=key, rvs=(rv,))

    def _replayed(self, event: Received, epoch: _Epoch) -> None:
        """Rule 4's exception: on a resume from relist RV R, events at R again — each must be
        one the relist batch could hold: a DELETED of an object gone at R, or any event for an
        object whose version at R has RV R (a filtered client may see that one as DELETED)."""
        version = self.history.version_at(event.key, event.rv)
        changed_at_relist = version is not None and version[1] and version[0] == event.rv
        if event.type is EventType.DELETED:  # gone, or a selector transition at R
            plausible = changed_at_relist or version is None or not version[1]
        else:
            plausible = changed_at_relist
        if not plausible:
            self.report(
                Rule.COMPLETE,
                f"{event.type} {show(event.key)}@{event.rv} replayed on a resume from relist "
                f"RV {event.rv} is no change the relist could have appended",
                key=event.key,
                rvs=(event.rv,),
            )

    def _connection(self, rv: int) -> _Connection:
        if self.connection is None:
            raise ValueError(f"client {self.client.name}: RV {rv} received outside a watch")
        return self.connection

    def _epoch(self, rv: int) -> _Epoch:
        if self.epoch is None:
            raise ValueError(f"client {self.client.name}: RV {rv} received before any list")
        return self.epoch


# ============================================================================ relist windows


@dataclass(frozen=True, kw_only=True, slots=True)
class _Window:
    """Collapse allowed for versions in (lo, rv]."""

    lo: int
    rv: int


def _windows(
    *, relists: Sequence[UpstreamRelist], readers: Sequence[_Reader], history: _History
) -> list[_Window]:
    """The windows of one shape's relists: (P, R] with P at least the previous relist, the
    known ``reached`` RV, and every RV below R that only an un-collapsed log shows a client."""
    ordered = sorted(relists, key=lambda relist: relist.rv)
    tops = [relist.rv for relist in ordered]
    lows = [
        max(ordered[i - 1].rv if i else -1, relist.reached if relist.reached is not None else -1)
        for i, relist in enumerate(ordered)
    ]

    def evidence(rv: int, key: Key | None) -> None:
        index = bisect_right(tops, rv)
        if index == len(tops) or rv <= lows[index] or rv >= tops[index]:
            return
        if key is not None:
            latest = history.version_at(key, tops[index])
            if latest is not None and latest[0] == rv:
                return  # maybe the relist batch's entry for the object
        lows[index] = rv

    for reader in readers:
        for rv, _items, _epoch in reader.snapshots:
            evidence(rv, None)
        for rv in reader.bookmark_rvs:
            evidence(rv, None)
        for epoch in reader.epochs:
            for key, rv in epoch.received:
                evidence(rv, key)
    return [_Window(lo=lo, rv=top) for lo, top in zip(lows, tops, strict=True)]


# ============================================================================ pass 2: completeness


class _Completeness:
    """Rule 3 (and the gaps of rule 5) for one client's epochs."""

    def __init__(
        self,
        *,
        reader: _Reader,
        history: _History,
        view: _Filter,
        windows: Sequence[_Window],
    ) -> None:
        self.reader = reader
        self.history = history
        self.view = view
        self.windows = windows

    def check(self) -> None:
        for epoch in self.reader.epochs:
            self.epoch(epoch)

    def missing(
        self, epoch: _Epoch, key: Key, rv: int, kind: EventType, window: _Window | None = None
    ) -> None:
        """A missing expected event: a resumability violation if it lies between a resume
        point and the first RV that watch delivered, else (or inside a relist window, where a
        watch legitimately continues at the batch) a completeness one."""
        what = f"{kind} {show(key)}@{rv}"
        resumes = epoch.resumes  # sorted by start (see ``epoch``)
        index = bisect_left(resumes, rv, key=lambda resume: resume[0]) - 1
        if window is None and index >= 0 and rv < resumes[index][1]:
            start, first = resumes[index]
            self.reader.report(
                Rule.RESUMABLE,
                f"watch resumed from RV {start} continued at RV {first}, skipping {what}",
                key=key,
                rvs=(rv, start, first),
            )
            return
        self.reader.report(
            Rule.COMPLETE, f"never received {what}{_note(window)}", key=key, rvs=(rv,)
        )

    def epoch(self, epoch: _Epoch) -> None:
        start, last = epoch.start, epoch.last
        if last <= start:
            return
        epoch.resumes.sort()
        windows = [
            _Window(lo=max(w.lo, start), rv=w.rv)
            for w in self.windows
            if w.rv > start and max(w.lo, start) < last
        ]
        tops = [w.rv for w in windows]
        expected, in_window = self.expected(start, last, windows)
        window_received: list[dict[Key, list[tuple[int, EventType]]]] = [{} for _ in windows]
        for (key, rv), kind in epoch.received.items():
            index = bisect_left(tops, rv)
            if index < len(windows) and windows[index].lo < rv:
                window_received[index].setdefault(key, []).append((rv, kind))
                in_window[index].add(key)
                continue
            want = expected.get((key, rv))
            if want is None:
                self.unexpected(key, rv, kind)
            elif want is not kind:
                self.wrong(key, rv, kind, want)
        for (key, rv), kind in expected.items():
            if (key, rv) not in epoch.received:
                self.missing(epoch, key, rv, kind)
        for index, window in enumerate(windows):
            for key in sorted(in_window[index]):
                got = sorted(window_received[index].get(key, ()))
                self.window_key(epoch, window, key, got)

    def expected(
        self, start: int, last: int, windows: Sequence[_Window]
    ) -> tuple[dict[tuple[Key, int], EventType], list[set[Key]]]:
        """The client's expected events in (start, last] outside the windows, and the objects
        changed inside each window (checked per object, with collapse)."""
        history, table, namespace = self.history, self.view.table, self.view.namespace
        expected: dict[tuple[Key, int], EventType] = {}
        in_window: list[set[Key]] = [set() for _ in windows]
        bounds = [(w.lo, w.rv) for w in windows]
        current = 0
        lo, top = bounds[0] if bounds else (last, last)  # (last, last) holds no change
        rows = history.rows[bisect_right(history.rvs, start) : bisect_right(history.rvs, last)]
        for rv, key, exists, labels, prev_exists, prev_labels in rows:
            if namespace is not None and key[0] != namespace:
                continue
            while top < rv:
                current += 1
                lo, top = bounds[current] if current < len(bounds) else (last, last)
            if lo < rv:
                in_window[current].add(key)
                continue
            was = prev_exists and table[prev_labels]
            now = exists and table[labels]
            if was:
                expected[(key, rv)] = EventType.MODIFIED if now else EventType.DELETED
            elif now:
                expected[(key, rv)] = EventType.ADDED
        return expected, in_window

    def unexpected(self, key: Key, rv: int, kind: EventType, window: _Window | None = None) -> None:
        self.reader.report(
            Rule.COMPLETE,
            f"received {kind} {show(key)}@{rv}, which is no change of that object the client "
            f"should see{_note(window)}",
            key=key,
            rvs=(rv,),
        )

    def wrong(
        self, key: Key, rv: int, kind: EventType, want: EventType, window: _Window | None = None
    ) -> None:
        self.reader.report(
            Rule.COMPLETE,
            f"received {kind} {show(key)}@{rv} where the change is a {want} for this client"
            f"{_note(window)}",
            key=key,
            rvs=(rv,),
        )

    def window_key(
        self, epoch: _Epoch, window: _Window, key: Key, got: list[tuple[int, EventType]]
    ) -> None:
        """Rule 3 with collapse, for one object in one relist window (see the module doc):
        what was received must be, up to ``last``, some prefix of the object's expected events
        followed by the collapse event from the version at that point to the last version."""
        view = self.view
        key_ok = view.key_matches(key)
        before, versions = self.history.window(key, window.lo, window.rv)
        if not versions:
            for rv, received in got:
                self.unexpected(key, rv, received, window)
            return
        states = [before] + [(exists, labels) for _, exists, labels in versions]
        singles: list[tuple[int, EventType]] = []
        counts = [0]  # counts[j]: how many expected events versions 1..j produce
        for j, (rv, exists, labels) in enumerate(versions, 1):
            kind = view.transition(key_ok=key_ok, before=states[j - 1], after=(exists, labels))
            if kind is not None:
                singles.append((rv, kind))
            counts.append(len(singles))
        partial = epoch.last == window.rv and epoch.bookmarked < window.rv
        if _collapses(
            got=got,
            singles=singles,
            counts=counts,
            collapse=[
                view.transition(key_ok=key_ok, before=states[j], after=states[-1])
                for j in range(len(versions))
            ],
            final_rv=versions[-1][0],
            deleted=not versions[-1][1],
            relist_rv=window.rv,
            last=epoch.last,
            partial=partial,
        ):
            return
        due = epoch.last - 1 if partial else epoch.last
        self.window_diff(epoch, key, got, [s for s in singles if s[0] <= due], window)

    def window_diff(
        self,
        epoch: _Epoch,
        key: Key,
        got: list[tuple[int, EventType]],
        singles: list[tuple[int, EventType]],
        window: _Window,
    ) -> None:
        """Report a window that no collapse explains against its full, uncollapsed events
        (``singles``: those due)."""
        received = dict(got)
        wanted = dict(singles)
        if (
            singles
            and singles[-1][1] is EventType.DELETED
            and received.get(window.rv) is EventType.DELETED
            and singles[-1][0] not in received
        ):
            received[singles[-1][0]] = received.pop(window.rv)  # a DELETED at R stands for it
        for rv, kind in received.items():
            want = wanted.get(rv)
            if want is None:
                self.unexpected(key, rv, kind, window)
            elif want is not kind:
                self.wrong(key, rv, kind, want, window)
        for rv, kind in wanted.items():
            if rv not in received:
                self.missing(epoch, key, rv, kind, window)


def _note(window: _Window | None) -> str:
    if window is None:
        return ""
    return (
        f" (inside the window ({window.lo}, {window.rv}] of the relist at RV {window.rv}, "
        "where no collapse explains what was received)"
    )


def _collapses(
    *,
    got: list[tuple[int, EventType]],
    singles: list[tuple[int, EventType]],
    counts: list[int],
    collapse: list[EventType | None],
    final_rv: int,
    deleted: bool,
    relist_rv: int,
    last: int,
    partial: bool,
) -> bool:
    """Whether ``got`` (sorted) is, cut at ``last``, the object's window events for some split
    point j: the expected events of versions 1..j, then ``collapse[j]`` (j < m) at the last
    version's RV — or, for an object gone at R, at R. j = m is the uncollapsed sequence.

    ``partial``: the client's last RV is the relist RV, reached by an event of the batch, not a
    bookmark — the batch's other events at that RV may still be on their way."""
    size = len(got)
    common = 0
    while common < size and common < len(singles) and got[common] == singles[common]:
        common += 1
    up_to_last = bisect_right(singles, last, key=lambda single: single[0])
    cuts = (
        {up_to_last, bisect_left(singles, last, key=lambda single: single[0])}
        if partial
        else {up_to_last}
    )
    if common == size and size in cuts:
        return True  # j = m: every expected event up to ``last``
    for j, kind in enumerate(collapse):
        prefix = counts[j]
        shown = min(prefix, up_to_last)  # the prefix's RVs are below the last version's
        if common < shown:
            continue
        if shown < prefix:  # cut inside the prefix: the collapse lies beyond ``last`` too
            if size == shown:
                return True
            continue
        if kind is None:
            if size == shown:
                return True
            continue
        at = {final_rv, relist_rv} if deleted and kind is EventType.DELETED else {final_rv}
        if size == shown + 1 and got[shown][1] is kind and got[shown][0] in at:
            return True
        latest = max(at)
        if size == shown and (latest > last or (partial and latest == last)):
            return True
    return False


# ============================================================================ pass 3: snapshots


def _check_snapshots(
    *, history: _History, readers: Sequence[_Reader], views: Sequence[_Filter]
) -> None:
    """Rule 3 for snapshots: each equals the reference state at its RV, filtered (one replay
    of the reference for all of them, in RV order). Snapshots older than the reference's
    start cannot be checked and are skipped."""
    pending = sorted(
        (
            (rv, order, items, reader, view)
            for order, (reader, view) in enumerate(zip(readers, views, strict=True))
            for rv, items, _epoch in reader.snapshots
            if rv >= history.initial_rv
        ),
        key=lambda entry: (entry[0], entry[1]),
    )
    state: dict[Key, tuple[int, int]] = dict(history.initial)
    rows = history.rows
    position = 0
    for rv, _order, items, reader, view in pending:
        while position < len(rows) and rows[position].rv <= rv:
            row = rows[position]
            if row.exists:
                state[row.key] = (row.rv, row.labels)
            else:
                state.pop(row.key, None)
            position += 1
        _compare_snapshot(rv=rv, items=items, state=state, reader=reader, view=view)


def _compare_snapshot(
    *,
    rv: int,
    items: Mapping[Key, int],
    state: Mapping[Key, tuple[int, int]],
    reader: _Reader,
    view: _Filter,
) -> None:
    namespace, table = view.namespace, view.table
    for key, item_rv in items.items():
        found = state.get(key)
        if found is None or not ((namespace is None or key[0] == namespace) and table[found[1]]):
            reader.report(
                Rule.COMPLETE,
                f"list at RV {rv} has {show(key)}@{item_rv}, which the apiserver did not have "
                f"(matching the client's filter) at RV {rv}",
                key=key,
                rvs=(item_rv, rv),
            )
        elif found[0] != item_rv:
            reader.report(
                Rule.COMPLETE,
                f"list at RV {rv} has {show(key)}@{item_rv}; the apiserver had it at RV {found[0]}",
                key=key,
                rvs=(item_rv, found[0], rv),
            )
    for key, (object_rv, labels) in state.items():
        if table[labels] and key not in items and (namespace is None or key[0] == namespace):
            reader.report(
                Rule.COMPLETE,
                f"list at RV {rv} lacks {show(key)}@{object_rv}",
                key=key,
                rvs=(object_rv, rv),
            )


# ============================================================================ pass 4: convergence


def _compare_states(
    *,
    client: str,
    have: Mapping[Key, int],
    want: Mapping[Key, int],
    subject: str,
) -> list[Violation]:
    """Rule 6: ``have`` (``subject``: a client's final state) equals ``want`` (the apiserver's
    final state, filtered as the client filters)."""
    found: list[Violation] = []
    for key, rv in have.items():
        other = want.get(key)
        if other is None:
            detail = f"{subject} has {show(key)}@{rv}; the apiserver has no such object"
            if client != _REFERENCE:
                detail += " matching the client's filter"
            found.append(_violation(Rule.CONVERGENT, client, detail, key, (rv,)))
        elif other != rv:
            detail = f"{subject} has {show(key)}@{rv}; the apiserver has it at RV {other}"
            found.append(_violation(Rule.CONVERGENT, client, detail, key, (rv, other)))
    for key, rv in want.items():
        if key not in have:
            detail = f"{subject} lacks {show(key)}@{rv}, which the apiserver has"
            found.append(_violation(Rule.CONVERGENT, client, detail, key, (rv,)))
    return found


def _violation(rule: Rule, client: str, detail: str, key: Key, rvs: tuple[int, ...]) -> Violation:
    return Violation(rule=rule, client=client, detail=detail, key=show(key), rvs=rvs)


def _reference_final(history: _History) -> dict[Key, tuple[int, Mapping[str, str]]]:
    final: dict[Key, tuple[int, Mapping[str, str]]] = {}
    for key, versions in history.versions.items():
        rv, exists, labels = versions[-1]
        if exists:
            final[key] = (rv, history.label_sets[labels])
    return final


# ============================================================================ check


def check(
    *,
    reference: Reference,
    clients: Sequence[ClientLog],
    relists: Sequence[UpstreamRelist] = (),
    apiserver_final: Sequence[Item] | None = None,
    faults: int = 0,
) -> Report:
    """Hold every client's log to the six rules (module doc) against the reference history.

    Raises ``ValueError`` for malformed input (reference RVs not increasing, an event before
    any watch, a client without a list before its first event, a bad label selector)."""
    history = _History(reference)
    violations: list[Violation] = []
    relist_rvs: dict[str, frozenset[int]] = {}
    for relist in relists:
        relist_rvs[relist.shape] = relist_rvs.get(relist.shape, frozenset()) | {relist.rv}
    readers = [
        _Reader(
            client=client, history=history, relist_rvs=relist_rvs.get(client.shape, frozenset())
        )
        for client in clients
    ]
    views = [_Filter(client=client, history=history) for client in clients]
    for reader in readers:
        reader.read()
    for shape in {client.shape for client in clients}:
        members = [index for index, client in enumerate(clients) if client.shape == shape]
        windows = _windows(
            relists=[relist for relist in relists if relist.shape == shape],
            readers=[readers[index] for index in members],
            history=history,
        )
        for index in members:
            _Completeness(
                reader=readers[index], history=history, view=views[index], windows=windows
            ).check()
    _check_snapshots(history=history, readers=readers, views=views)

    upstream = _reference_final(history)
    if apiserver_final is not None:
        actual = {item.key: (item.rv, item.labels) for item in apiserver_final}
        violations += _compare_states(
            client=_REFERENCE,
            have={key: rv for key, (rv, _) in upstream.items()},
            want={key: rv for key, (rv, _) in actual.items()},
            subject="the reference history's final state",
        )
        upstream = actual
    for client, reader, view in zip(clients, readers, views, strict=True):
        violations += reader.violations
        have = (
            reader.state if client.final is None else {item.key: item.rv for item in client.final}
        )
        want = {
            key: rv
            for key, (rv, labels) in upstream.items()
            if view.key_matches(key) and view.selector.matches(labels)
        }
        violations += _compare_states(
            client=client.name, have=have, want=want, subject="final state"
        )
    counts = Counts(
        clients=len(clients),
        reference_changes=history.changes,
        events=sum(reader.events for reader in readers),
        snapshots=sum(len(reader.snapshots) for reader in readers),
        bookmarks=sum(reader.bookmarks for reader in readers),
        resumes=sum(reader.resumes for reader in readers),
        expired=sum(reader.expired for reader in readers),
        relists=len(relists),
    )
    return Report(faults=faults, counts=counts, violations=tuple(violations))


def check_run(run: Run) -> Report:
    return check(
        reference=run.reference,
        clients=run.clients,
        relists=run.relists,
        apiserver_final=run.apiserver_final,
        faults=run.faults,
    )


# ============================================================================ JSON lines
#
# One JSON object per line, ``record`` saying what it is; a client's records in the order it
# observed them (clients may interleave), each client declared before its observations:
#   {"record": "run", "faults": 3}
#   {"record": "initial", "rv": 10, "items": [{"namespace": "a", "name": "x", "rv": 5, "labels": {}}]}
#   {"record": "change", "type": "ADDED", "namespace": "a", "name": "x", "rv": 11, "labels": {}}
#   {"record": "relist", "rv": 30, "reached": 23, "shape": ""}
#   {"record": "apiserver_final", "items": [...]}
#   {"record": "client", "client": "c", "namespace": null, "label_selector": "", "shape": ""}
#   {"record": "list", "client": "c", "rv": 10, "items": [{"namespace": "a", "name": "x", "rv": 5}]}
#   {"record": "watch", "client": "c", "rv": 10}            (rv null: WatchList)
#   {"record": "event", "client": "c", "type": "MODIFIED", "namespace": "a", "name": "x", "rv": 12}
#   {"record": "bookmark", "client": "c", "rv": 19, "initial_events_end": false}
#   {"record": "expired", "client": "c"}
#   {"record": "ended", "client": "c"}
#   {"record": "final", "client": "c", "items": [...]}


def _item(raw: Any) -> Item:
    return Item(
        namespace=str(raw["namespace"]),
        name=str(raw["name"]),
        rv=int(raw["rv"]),
        labels={str(k): str(v) for k, v in (raw.get("labels") or {}).items()},
    )


def _observation(raw: Any) -> Observation:
    record = raw["record"]
    if record == "event":
        return Received(
            type=EventType(raw["type"]),
            namespace=str(raw["namespace"]),
            name=str(raw["name"]),
            rv=int(raw["rv"]),
        )
    if record == "bookmark":
        return Bookmarked(rv=int(raw["rv"]), initial_events_end=bool(raw.get("initial_events_end")))
    if record == "list":
        return Listed(rv=int(raw["rv"]), items=[_item(item) for item in raw["items"]])
    if record == "watch":
        return WatchStarted(rv=None if raw.get("rv") is None else int(raw["rv"]))
    if record == "expired":
        return Expired()
    if record == "ended":
        return StreamEnded()
    raise ValueError(f"unknown record {record!r}")


def parse_run(lines: Iterable[str | bytes]) -> Run:
    """A run from its JSON lines (format above); blank lines are skipped."""
    faults = 0
    initial_rv, initial = 0, list[Item]()
    changes: list[Change] = []
    relists: list[UpstreamRelist] = []
    apiserver_final: list[Item] | None = None
    declared: dict[str, Any] = {}
    observed: dict[str, list[Observation]] = {}
    finals: dict[str, list[Item]] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        raw = orjson.loads(line)
        record = raw.get("record")
        try:
            if record == "run":
                faults = int(raw.get("faults", 0))
            elif record == "initial":
                initial_rv, initial = int(raw["rv"]), [_item(item) for item in raw["items"]]
            elif record == "change":
                changes.append(
                    Change(
                        type=EventType(raw["type"]),
                        namespace=str(raw["namespace"]),
                        name=str(raw["name"]),
                        rv=int(raw["rv"]),
                        labels={str(k): str(v) for k, v in (raw.get("labels") or {}).items()},
                    )
                )
            elif record == "relist":
                reached = raw.get("reached")
                relists.append(
                    UpstreamRelist(
                        rv=int(raw["rv"]),
                        reached=None if reached is None else int(reached),
                        shape=str(raw.get("shape", "")),
                    )
                )
            elif record == "apiserver_final":
                apiserver_final = [_item(item) for item in raw["items"]]
            elif record == "client":
                declared[str(raw["client"])] = raw
                observed[str(raw["client"])] = []
            elif record == "final":
                finals[str(raw["client"])] = [_item(item) for item in raw["items"]]
            else:
                observed[str(raw["client"])].append(_observation(raw))
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"line {number}: {error!r}: {line!r}") from error
    clients = [
        ClientLog(
            name=name,
            namespace=raw.get("namespace"),
            label_selector=str(raw.get("label_selector", "")),
            shape=str(raw.get("shape", "")),
            observations=observed[name],
            final=finals.get(name),
        )
        for name, raw in declared.items()
    ]
    return Run(
        reference=Reference(initial_rv=initial_rv, initial=initial, changes=changes),
        clients=clients,
        relists=relists,
        apiserver_final=apiserver_final,
        faults=faults,
    )


def _items_json(items: Iterable[Item], *, labels: bool) -> list[dict[str, Any]]:
    return [
        {"namespace": item.namespace, "name": item.name, "rv": item.rv}
        | ({"labels": dict(item.labels)} if labels else {})
        for item in items
    ]


def _observation_json(observation: Observation) -> dict[str, Any]:
    match observation:
        case Received():
            return {
                "record": "event",
                "type": str(observation.type),
                "namespace": observation.namespace,
                "name": observation.name,
                "rv": observation.rv,
            }
        case Bookmarked():
            return {
                "record": "bookmark",
                "rv": observation.rv,
                "initial_events_end": observation.initial_events_end,
            }
        case Listed():
            return {
                "record": "list",
                "rv": observation.rv,
                "items": _items_json(observation.items, labels=False),
            }
        case WatchStarted():
            return {"record": "watch", "rv": observation.rv}
        case Expired():
            return {"record": "expired"}
        case StreamEnded():
            return {"record": "ended"}


def format_run(run: Run) -> Iterator[str]:
    """The JSON lines of ``run`` (what :func:`parse_run` reads), without line ends."""

    def line(record: dict[str, Any]) -> str:
        return orjson.dumps(record).decode()

    yield line({"record": "run", "faults": run.faults})
    reference = run.reference
    yield line(
        {
            "record": "initial",
            "rv": reference.initial_rv,
            "items": _items_json(reference.initial, labels=True),
        }
    )
    for change in reference.changes:
        yield line(
            {
                "record": "change",
                "type": str(change.type),
                "namespace": change.namespace,
                "name": change.name,
                "rv": change.rv,
                "labels": dict(change.labels),
            }
        )
    for relist in run.relists:
        yield line(
            {"record": "relist", "rv": relist.rv, "reached": relist.reached, "shape": relist.shape}
        )
    if run.apiserver_final is not None:
        yield line(
            {"record": "apiserver_final", "items": _items_json(run.apiserver_final, labels=True)}
        )
    for client in run.clients:
        yield line(
            {
                "record": "client",
                "client": client.name,
                "namespace": client.namespace,
                "label_selector": client.label_selector,
                "shape": client.shape,
            }
        )
        for observation in client.observations:
            yield line({"client": client.name} | _observation_json(observation))
        if client.final is not None:
            yield line(
                {
                    "record": "final",
                    "client": client.name,
                    "items": _items_json(client.final, labels=False),
                }
            )


def read_run(path: Path) -> Run:
    """Load a recorded run (JSON lines)."""
    with path.open("rb") as lines:
        return parse_run(lines)
