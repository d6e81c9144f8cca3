"""The fault checker (loadtest/checking.py) on recorded and modelled histories.

``histories/clean_run.jsonl`` is a clean run: three clients (everything; ``app=web`` through
WatchList; namespace ``team-a``) across a warmwatch kill -9, an upstream relist at RV 30 (etcd
compacted while the apiserver was down: web-1's version 24 collapses into 26, db's deletion at
25 is reported at 30, team-a/tmp lives and dies unseen, web-3 stops matching ``app=web`` inside
the window), a replay of the relist batch on a resume from 30, selector transitions both ways,
and two clients that fall out of the log (410) and relist. Each broken build below is that run
with what the bug would have changed, and each test names the rule, object and RVs it expects.

A small model of warmwatch (its log with relist batches, its resume positions, its filtering)
then generates random clean runs, which must pass, and runs with one event dropped, which must not.
"""

from __future__ import annotations

import random
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from loadtest.checking import (
    Bookmarked,
    Change,
    ClientLog,
    EventType,
    Expired,
    Item,
    Listed,
    Observation,
    Received,
    Reference,
    Report,
    Rule,
    Run,
    StreamEnded,
    UpstreamRelist,
    Violation,
    WatchStarted,
    check,
    check_run,
    format_run,
    parse_run,
    read_run,
)

HISTORIES = Path(__file__).parent / "histories"
ADDED, MODIFIED, DELETED = EventType.ADDED, EventType.MODIFIED, EventType.DELETED

Found = tuple[Rule, str, str, tuple[int, ...]]


def clean_run() -> Run:
    return read_run(HISTORIES / "clean_run.jsonl")


def event(kind: EventType, key: str, rv: int) -> Received:
    namespace, name = key.split("/")
    return Received(type=kind, namespace=namespace, name=name, rv=rv)


def item(key: str, rv: int, **labels: str) -> Item:
    namespace, name = key.split("/")
    return Item(namespace=namespace, name=name, rv=rv, labels=labels)


def edited(run: Run, client: str, edit: Callable[[list[Observation]], None]) -> Run:
    """``run`` with one client's observations changed in place by ``edit``."""
    clients = []
    for log in run.clients:
        if log.name == client:
            observations = list(log.observations)
            edit(observations)
            log = replace(log, observations=observations)
        clients.append(log)
    return replace(run, clients=clients)


def found(report: Report) -> set[Found]:
    return {(v.rule, v.client, v.key, v.rvs) for v in report.violations}


# ============================================================================ the clean run


def test_clean_run_has_no_violations() -> None:
    report = check_run(clean_run())
    assert report.violations == ()
    assert report.counts.events == 32
    assert report.counts.snapshots == 5
    assert report.counts.expired == 2
    assert report.counts.relists == 1
    assert report.summary_line() == "faults=4 events=32 violations=0"
    assert report.details() == []


def test_recorded_run_round_trips() -> None:
    lines = (HISTORIES / "clean_run.jsonl").read_text().splitlines()
    assert list(format_run(parse_run(lines))) == lines


def test_collapse_is_allowed_only_inside_the_relist_window() -> None:
    """Without the relist, the collapsed versions and the DELETED at 30 are violations."""
    report = check_run(replace(clean_run(), relists=[]))
    assert (Rule.COMPLETE, "all", "team-a/web-1", (24,)) in found(report)
    assert (Rule.COMPLETE, "all", "team-a/tmp", (27,)) in found(report)
    assert (Rule.COMPLETE, "team-a", "team-a/db", (30,)) in found(report)
    assert (Rule.UNIQUE, "all", "team-a/db", (30,)) in found(report)  # no relist, no replay


# ============================================================================ broken builds


def test_publish_before_commit_resumed_stream_travels_back() -> None:
    """(a) warmwatch sent 22 and 23 before committing them and was killed; restarted at 21,
    it streams the resumed watch from 21: the client, at 23, gets 22 again."""

    def edit(observations: list[Observation]) -> None:
        crash = observations.index(StreamEnded())
        del observations[crash : crash + 2]  # no crash between 21 and 22 any more
        after = observations.index(event(MODIFIED, "team-a/web-2", 23)) + 1
        observations[after:after] = [
            StreamEnded(),
            WatchStarted(rv=23),
            event(MODIFIED, "team-a/web-1", 22),
            event(MODIFIED, "team-a/web-2", 23),
        ]

    report = check_run(edited(clean_run(), "all", edit))
    assert found(report) == {
        (Rule.NO_TIME_TRAVEL, "all", "team-a/web-1", (22, 23)),
        (Rule.UNIQUE, "all", "team-a/web-2", (23,)),
    }


def test_publish_before_commit_relist_travels_back() -> None:
    """(a) the same crash seen by a client that relists: warmwatch restarted at 21 answers its
    resume from 23 with 410 and its LIST with RV 21, older than what it had."""

    def edit(observations: list[Observation]) -> None:
        observations[:] = [
            Listed(rv=21, items=[item("team-a/db", 14), item("team-a/web-1", 12)]),
            WatchStarted(rv=21),
            event(MODIFIED, "team-a/web-1", 22),
            event(MODIFIED, "team-a/web-2", 23),
            StreamEnded(),
            WatchStarted(rv=23),
            Expired(),
            Listed(
                rv=21,
                items=[item("team-a/db", 14), item("team-a/web-1", 12), item("team-a/web-2", 20)],
            ),
            *observations[1:],
        ]

    report = check_run(edited(clean_run(), "team-a", edit))
    assert found(report) == {
        (Rule.COMPLETE, "team-a", "team-a/web-2", (20, 21)),  # first list lacks web-2
        (Rule.NO_TIME_TRAVEL, "team-a", "", (21, 23)),
    }


def test_relist_without_diff_leaves_deleted_object() -> None:
    """(b) the relist at 30 appends no DELETED: db, deleted upstream at 25, stays with the
    clients (and in warmwatch's cache, so team-a's later list still has it)."""
    run = clean_run()
    for client in ("all", "team-a"):
        run = edited(run, client, lambda o: _remove_all(o, event(DELETED, "team-a/db", 30)))

    def stale_list(observations: list[Observation]) -> None:
        at = observations.index(Listed(rv=33, items=[item("team-a/web-2", 32)]))
        observations[at] = Listed(rv=33, items=[item("team-a/web-2", 32), item("team-a/db", 14)])

    report = check_run(edited(run, "team-a", stale_list))
    assert found(report) == {
        (Rule.COMPLETE, "all", "team-a/db", (25,)),
        (Rule.CONVERGENT, "all", "team-a/db", (14,)),
        (Rule.COMPLETE, "team-a", "team-a/db", (25,)),
        (Rule.COMPLETE, "team-a", "team-a/db", (14, 33)),
        (Rule.CONVERGENT, "team-a", "team-a/db", (14,)),
    }
    (missing,) = [v for v in report.violations if v.client == "all" and v.rvs == (25,)]
    assert "never received DELETED team-a/db@25" in missing.detail
    assert "relist at RV 30" in missing.detail


def _remove_all(observations: list[Observation], removed: Observation) -> None:
    observations[:] = [o for o in observations if o != removed]


def test_duplicate_delivery_on_resume() -> None:
    """(c) the resume cursor is off by one: a watch from 21 sends the event at 21 again."""

    def edit(observations: list[Observation]) -> None:
        at = observations.index(WatchStarted(rv=21)) + 1
        observations.insert(at, event(MODIFIED, "team-b/web-3", 21))

    report = check_run(edited(clean_run(), "all", edit))
    assert found(report) == {(Rule.UNIQUE, "all", "team-b/web-3", (21,))}


def test_events_out_of_order() -> None:
    """(d) 13 is sent before 12."""

    def edit(observations: list[Observation]) -> None:
        at = observations.index(event(MODIFIED, "team-a/web-1", 12))
        observations[at], observations[at + 1] = observations[at + 1], observations[at]

    report = check_run(edited(clean_run(), "all", edit))
    assert found(report) == {(Rule.ORDERED, "all", "team-a/web-1", (12, 13))}


def test_selector_transition_not_turned_into_deleted() -> None:
    """(e) the broad shape's filter looks at the new labels only: web-2 leaving ``app=web``
    at 20 is dropped instead of DELETED, its return at 23 passes as MODIFIED, and web-3 leaving
    in the relist batch (29) is dropped."""

    def edit(observations: list[Observation]) -> None:
        _remove_all(observations, event(DELETED, "team-a/web-2", 20))
        _remove_all(observations, event(DELETED, "team-b/web-3", 29))
        at = observations.index(event(ADDED, "team-a/web-2", 23))
        observations[at] = event(MODIFIED, "team-a/web-2", 23)

    report = check_run(edited(clean_run(), "web", edit))
    assert found(report) == {
        (Rule.COMPLETE, "web", "team-a/web-2", (20,)),
        (Rule.COMPLETE, "web", "team-a/web-2", (23,)),
        (Rule.COMPLETE, "web", "team-b/web-3", (29,)),
    }
    details = "\n".join(report.details())
    assert "never received DELETED team-a/web-2@20" in details
    assert "received MODIFIED team-a/web-2@23 where the change is a ADDED" in details


def test_selector_transition_missing_without_a_later_relist_breaks_convergence() -> None:
    """(e) the same bug for a client that never falls out of the log and relists: it keeps
    web-3, which left ``app=web`` in the relist batch."""
    run = clean_run()
    web = next(c for c in run.clients if c.name == "web")
    cut = list(web.observations).index(WatchStarted(rv=32)) - 1  # before the 410
    observations = [
        o
        for o in web.observations[:cut]
        if o not in (event(DELETED, "team-a/web-2", 20), event(DELETED, "team-b/web-3", 29))
    ]
    observations = [
        event(MODIFIED, "team-a/web-2", 23) if o == event(ADDED, "team-a/web-2", 23) else o
        for o in observations
    ]
    observations += [event(DELETED, "team-a/web-1", 33), Bookmarked(rv=40)]
    report = check_run(replace(run, clients=[replace(web, observations=observations)]))
    assert found(report) == {
        (Rule.COMPLETE, "web", "team-a/web-2", (20,)),
        (Rule.COMPLETE, "web", "team-a/web-2", (23,)),
        (Rule.COMPLETE, "web", "team-b/web-3", (29,)),
        (Rule.CONVERGENT, "web", "team-b/web-3", (21,)),
    }


def test_gap_in_the_middle() -> None:
    """(f) one event dropped from the middle of a stream."""

    def edit(observations: list[Observation]) -> None:
        observations.remove(event(MODIFIED, "team-a/web-1", 12))

    report = check_run(edited(clean_run(), "all", edit))
    assert found(report) == {(Rule.COMPLETE, "all", "team-a/web-1", (12,))}


def test_gap_before_a_relist_window_is_not_excused_by_collapse() -> None:
    """(f) db's MODIFIED at 14 dropped: db's versions up to the relist at 30 could collapse,
    but the clients observed RV 23 before it, so warmwatch's log held everything up to 23."""

    def edit(observations: list[Observation]) -> None:
        observations.remove(event(MODIFIED, "team-a/db", 14))

    report = check_run(edited(clean_run(), "all", edit))
    assert found(report) == {(Rule.COMPLETE, "all", "team-a/db", (14,))}


def test_resume_that_skips() -> None:
    """(g) the watch resumed from 21 starts after 22."""

    def edit(observations: list[Observation]) -> None:
        observations.remove(event(MODIFIED, "team-a/web-1", 22))

    report = check_run(edited(clean_run(), "all", edit))
    assert found(report) == {(Rule.RESUMABLE, "all", "team-a/web-1", (22, 21, 23))}
    (violation,) = report.violations
    assert violation.detail == (
        "watch resumed from RV 21 continued at RV 23, skipping MODIFIED team-a/web-1@22"
    )


# ============================================================================ finer points


def _small_run(observations: list[Observation], *, relists: tuple[int, ...] = ()) -> Report:
    """Two objects, both deleted upstream (x at 12, y at 13) before a relist at 20."""
    reference = Reference(
        initial_rv=10,
        initial=[item("a/x", 5), item("a/y", 6)],
        changes=[
            Change(type=DELETED, namespace="a", name="x", rv=12),
            Change(type=DELETED, namespace="a", name="y", rv=13),
            Change(type=ADDED, namespace="a", name="z", rv=21),
        ],
    )
    client = ClientLog(name="c", observations=observations)
    return check(
        reference=reference,
        clients=[client],
        relists=[UpstreamRelist(rv=r) for r in relists],
    )


def test_relist_deletions_share_the_relist_rv() -> None:
    start: list[Observation] = [
        Listed(rv=10, items=[item("a/x", 5), item("a/y", 6)]),
        WatchStarted(rv=10),
    ]
    deletions: list[Observation] = [event(DELETED, "a/x", 20), event(DELETED, "a/y", 20)]
    rest: list[Observation] = [Bookmarked(rv=20), event(ADDED, "a/z", 21)]
    assert _small_run([*start, *deletions, *rest], relists=(20,)).ok
    # without a relist at 20 the shared RV is out of order (and the RVs are wrong)
    report = _small_run([*start, *deletions, *rest])
    assert (Rule.ORDERED, "c", "a/y", (20,)) in found(report)


def test_replay_after_list_at_relist_rv() -> None:
    """A LIST answered at the relist RV, then a watch from it: the batch's DELETEDs come again
    (for objects the list no longer has) — allowed, but only events the batch could hold."""
    observations: list[Observation] = [
        Listed(rv=20, items=[]),
        WatchStarted(rv=20),
        event(DELETED, "a/x", 20),
        event(DELETED, "a/y", 20),
        event(ADDED, "a/z", 21),
    ]
    assert _small_run(observations, relists=(20,)).ok
    bogus = [*observations[:2], event(MODIFIED, "a/z", 20), *observations[4:]]
    assert found(_small_run(bogus, relists=(20,))) == {(Rule.COMPLETE, "c", "a/z", (20,))}


def test_batch_cut_short_at_the_relist_rv() -> None:
    """The stream breaks after the first of the batch's DELETEDs at 20: y's is not due yet (its
    RV is the client's last). A bookmark at 20 would have promised it."""
    start: list[Observation] = [
        Listed(rv=10, items=[item("a/x", 5), item("a/y", 6)]),
        WatchStarted(rv=10),
    ]
    relist: list[Observation] = [
        Listed(rv=21, items=[item("a/z", 21)]),
        WatchStarted(rv=21),
        Bookmarked(rv=21),
    ]
    cut: list[Observation] = [
        event(DELETED, "a/x", 20),
        StreamEnded(),
        WatchStarted(rv=20),
        Expired(),
    ]
    assert _small_run([*start, *cut, *relist], relists=(20,)).ok
    promised = [event(DELETED, "a/x", 20), Bookmarked(rv=20), StreamEnded(), *cut[1:]]
    assert found(_small_run([*start, *promised, *relist], relists=(20,))) == {
        (Rule.COMPLETE, "c", "a/y", (13,))
    }


def test_watch_must_start_after_its_rv() -> None:
    """A watch from 12 (not a relist RV) that sends the change at 12 again."""
    observations: list[Observation] = [
        Listed(rv=12, items=[item("a/y", 6)]),
        WatchStarted(rv=12),
        event(DELETED, "a/x", 12),
        event(DELETED, "a/y", 13),
        event(ADDED, "a/z", 21),
    ]
    assert found(_small_run(observations)) == {(Rule.RESUMABLE, "c", "a/x", (12,))}


def test_an_object_twice_in_a_list() -> None:
    observations: list[Observation] = [
        Listed(rv=10, items=[item("a/x", 5), item("a/y", 6), item("a/x", 5)]),
        WatchStarted(rv=10),
        event(DELETED, "a/x", 12),
        event(DELETED, "a/y", 13),
        event(ADDED, "a/z", 21),
    ]
    assert found(_small_run(observations)) == {(Rule.UNIQUE, "c", "a/x", (5, 5))}


def test_event_at_a_bookmarked_rv_is_out_of_order() -> None:
    observations: list[Observation] = [
        Listed(rv=10, items=[item("a/x", 5), item("a/y", 6)]),
        WatchStarted(rv=10),
        event(DELETED, "a/x", 12),
        Bookmarked(rv=13),  # wrong: y's deletion at 13 not yet sent
        event(DELETED, "a/y", 13),
        event(ADDED, "a/z", 21),
    ]
    assert found(_small_run(observations)) == {(Rule.ORDERED, "c", "a/y", (13,))}


def test_list_content_is_checked_against_the_reference() -> None:
    observations: list[Observation] = [
        Listed(rv=12, items=[item("a/x", 5), item("a/y", 5)]),
        WatchStarted(rv=12),
        event(DELETED, "a/y", 13),
        event(ADDED, "a/z", 21),
    ]
    assert found(_small_run(observations)) == {
        (Rule.COMPLETE, "c", "a/x", (5, 12)),  # x was deleted at 12
        (Rule.COMPLETE, "c", "a/y", (5, 6, 12)),  # y's version was 6
        (Rule.CONVERGENT, "c", "a/x", (5,)),  # and x stays in the client's store
    }


def test_convergence_uses_the_given_final_states() -> None:
    run = clean_run()
    clients = [
        replace(c, final=[item("team-a/web-2", 32), item("team-b/web-4", 30)])
        if c.name == "web"
        else c
        for c in run.clients
    ]
    report = check_run(replace(run, clients=clients))
    assert found(report) == {(Rule.CONVERGENT, "web", "team-b/web-4", (30, 31))}


def test_an_incomplete_reference_is_reported() -> None:
    run = clean_run()
    final = [*(run.apiserver_final or ()), item("team-b/late", 50, app="db")]
    report = check_run(replace(run, apiserver_final=final))
    assert found(report) == {
        (Rule.CONVERGENT, "(reference)", "team-b/late", (50,)),
        (Rule.CONVERGENT, "all", "team-b/late", (50,)),  # the others' filters exclude it
    }


def test_details_are_capped() -> None:
    violations = tuple(
        Violation(rule=Rule.COMPLETE, client="c", detail=f"never received ADDED a/o{i}@{i}")
        for i in range(60)
    )
    report = replace(check_run(clean_run()), violations=violations, faults=7)
    details = report.details()
    assert len(details) == 51
    assert details[0] == "[complete] c: never received ADDED a/o0@0"
    assert details[-1] == "... and 10 more"
    assert report.summary_line() == "faults=7 events=32 violations=60"
    assert report.by_rule() == {Rule.COMPLETE: 60}


def test_malformed_input_is_refused() -> None:
    with pytest.raises(ValueError, match="strictly increase"):
        check(
            reference=Reference(
                changes=[
                    Change(type=ADDED, namespace="a", name="x", rv=5),
                    Change(type=DELETED, namespace="a", name="x", rv=5),
                ]
            ),
            clients=[],
        )
    with pytest.raises(ValueError, match="outside a watch"):
        check(
            reference=Reference(changes=[]),
            clients=[ClientLog(name="c", observations=[event(ADDED, "a/x", 1)])],
        )


# ============================================================================ a model of warmwatch

Labels = Mapping[str, str]
Key = tuple[str, str]
SELECTORS: tuple[tuple[str, Callable[[Labels], bool]], ...] = (
    ("", lambda labels: True),
    ("app=web", lambda labels: labels.get("app") == "web"),
    ("app in (web,canary)", lambda labels: labels.get("app") in ("web", "canary")),
    ("app!=db", lambda labels: labels.get("app") != "db"),
    ("!app", lambda labels: "app" not in labels),
)
LABEL_SETS: tuple[Labels, ...] = ({"app": "web"}, {"app": "db"}, {"app": "canary"}, {})


@dataclass(frozen=True, kw_only=True, slots=True)
class Entry:
    """One record of warmwatch's log for the shape (what proxy/cache/writing.py appends)."""

    rv: int
    type: str  # ADDED, MODIFIED, DELETED or BOOKMARK
    key: Key = ("", "")
    labels: Labels = field(default_factory=dict)
    prev_labels: Labels | None = None
    batch: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class Model:
    reference: Reference
    initial: dict[Key, tuple[int, Labels]]
    entries: list[Entry]
    rvs: list[int]
    boundaries: list[int]
    """Log positions where the cache is a committed state (a LIST may be answered there)."""
    relists: list[UpstreamRelist]
    final: list[Item]

    def rv_at(self, position: int) -> int:
        return self.entries[position - 1].rv if position else self.reference.initial_rv

    def resume_at(self, rv: int) -> int:
        """Where a watch from ``rv`` starts (store.watch_start): after ``rv``, or at the relist
        batch stamped ``rv`` (its replay)."""
        if any(r.rv == rv for r in self.relists):
            return bisect_left(self.rvs, rv)
        return bisect_right(self.rvs, rv)


def model_reference(rng: random.Random, *, changes: int, keys: int) -> Reference:
    state: dict[Key, Labels] = {}
    initial = []
    for index in range(keys // 2):
        key = (rng.choice("ab"), f"o{index}")
        if key not in state:
            state[key] = rng.choice(LABEL_SETS)
            initial.append(Item(namespace=key[0], name=key[1], rv=10 + index, labels=state[key]))
    rv = 100
    out = []
    for _ in range(changes):
        rv += rng.choice((1, 1, 1, 2, 5))
        key = (rng.choice("ab"), f"o{rng.randrange(keys)}")
        if key not in state:
            kind, labels = ADDED, rng.choice(LABEL_SETS)
            state[key] = labels
        elif rng.random() < 0.15:
            kind, labels = DELETED, state.pop(key)
        else:
            kind = MODIFIED
            labels = rng.choice(LABEL_SETS) if rng.random() < 0.3 else state[key]
            state[key] = labels
        out.append(Change(type=kind, namespace=key[0], name=key[1], rv=rv, labels=labels))
    return Reference(initial_rv=100, initial=initial, changes=out)


def model_log(rng: random.Random, reference: Reference, *, relists: int, exact: bool) -> Model:
    """warmwatch's log: upstream changes one by one, upstream bookmarks, and relists that
    replace a run of changes by the diff (ADDED/MODIFIED in RV order, DELETED at R, bookmark)."""
    changes = list(reference.changes)
    cache: dict[Key, tuple[int, Labels]] = {i.key: (i.rv, i.labels) for i in reference.initial}
    initial = dict(cache)
    windows: dict[int, int] = {}
    for start in sorted(rng.sample(range(5, len(changes) - 5), relists)):
        if all(start >= end for end in windows.values()):  # back-to-back relists too
            windows[start] = min(start + rng.randint(1, 20), len(changes) - 1)
    entries: list[Entry] = []
    boundaries = [0]
    done: list[UpstreamRelist] = []
    position_rv = reference.initial_rv
    index = 0
    while index < len(changes):
        if index in windows:
            end = windows[index]
            top = changes[end - 1].rv
            relist_rv = top + 1 if rng.random() < 0.5 and top + 1 < changes[end].rv else top
            target = dict(cache)
            for change in changes[index:end]:
                if change.type is DELETED:
                    target.pop((change.namespace, change.name), None)
                else:
                    target[(change.namespace, change.name)] = (change.rv, change.labels)
            changed = sorted(
                (v[0], k) for k, v in target.items() if k not in cache or cache[k][0] != v[0]
            )
            for rv, key in changed:
                entries.append(
                    Entry(
                        rv=rv,
                        type="MODIFIED" if key in cache else "ADDED",
                        key=key,
                        labels=target[key][1],
                        prev_labels=cache[key][1] if key in cache else None,
                        batch=True,
                    )
                )
            for key in sorted(k for k in cache if k not in target):
                entries.append(
                    Entry(
                        rv=relist_rv,
                        type="DELETED",
                        key=key,
                        labels=cache[key][1],
                        prev_labels=cache[key][1],
                        batch=True,
                    )
                )
            entries.append(Entry(rv=relist_rv, type="BOOKMARK", batch=True))
            boundaries.append(len(entries))
            done.append(UpstreamRelist(rv=relist_rv, reached=position_rv if exact else None))
            cache, position_rv, index = target, relist_rv, end
            continue
        change = changes[index]
        key = (change.namespace, change.name)
        previous = cache.get(key)
        entries.append(
            Entry(
                rv=change.rv,
                type=str(change.type),
                key=key,
                labels=previous[1] if previous and change.type is DELETED else change.labels,
                prev_labels=previous[1] if previous else None,
            )
        )
        if change.type is DELETED:
            cache.pop(key, None)
        else:
            cache[key] = (change.rv, change.labels)
        position_rv = change.rv
        boundaries.append(len(entries))
        following = changes[index + 1].rv if index + 1 < len(changes) else change.rv + 5
        if rng.random() < 0.1 and index + 1 not in windows:
            position_rv = rng.randrange(change.rv, following)
            entries.append(Entry(rv=position_rv, type="BOOKMARK"))
            boundaries.append(len(entries))
        index += 1
    final = [
        Item(namespace=k[0], name=k[1], rv=rv, labels=labels) for k, (rv, labels) in cache.items()
    ]
    return Model(
        reference=reference,
        initial=initial,
        entries=entries,
        rvs=[e.rv for e in entries],
        boundaries=boundaries,
        relists=done,
        final=final,
    )


def filtered(
    entry: Entry, *, namespace: str | None, matches: Callable[[Labels], bool]
) -> str | None:
    """What a client is sent for a log entry (proxy/cache/filtering.py's ``event_for``)."""
    if namespace is not None and entry.key[0] != namespace:
        return None
    if entry.type == "DELETED":
        last = entry.prev_labels if entry.prev_labels is not None else entry.labels
        return "DELETED" if matches(last) else None
    now = matches(entry.labels)
    before = entry.prev_labels is not None and matches(entry.prev_labels)
    if now and before:
        return "MODIFIED"
    if now:
        return "ADDED"
    return "DELETED" if before else None


def model_client(
    rng: random.Random,
    model: Model,
    *,
    name: str,
    namespace: str | None,
    selector: int,
    watch_list: bool,
    p_end: float = 0.03,
    p_expire: float = 0.01,
) -> ClientLog:
    """A client-go-like client: snapshot, watch, resume from its last RV when the stream ends,
    relist (later, from the cache as it is then) after a 410."""
    text, matches = SELECTORS[selector]
    entries = model.entries
    replica = dict(model.initial)
    applied = 0
    observations: list[Observation] = []

    def snapshot(position: int) -> tuple[int, int]:
        nonlocal applied
        for entry in entries[applied:position]:
            if entry.type == "DELETED":
                replica.pop(entry.key, None)
            elif entry.type != "BOOKMARK":
                replica[entry.key] = (entry.rv, entry.labels)
        applied = position
        rv = model.rv_at(position)
        items = [
            Item(namespace=k[0], name=k[1], rv=v[0])
            for k, v in sorted(replica.items())
            if (namespace is None or k[0] == namespace) and matches(v[1])
        ]
        if watch_list:
            observations.append(WatchStarted(rv=None))
            observations.extend(
                Received(type=ADDED, namespace=i.namespace, name=i.name, rv=i.rv) for i in items
            )
            observations.append(Bookmarked(rv=rv, initial_events_end=True))
            return position, rv
        observations.extend((Listed(rv=rv, items=items), WatchStarted(rv=rv)))
        return model.resume_at(rv), rv

    at, last = snapshot(model.boundaries[rng.randrange(min(len(model.boundaries), 20))])
    while at < len(entries):
        entry = entries[at]
        at += 1
        if entry.type == "BOOKMARK":
            if rng.random() < 0.5:
                observations.append(Bookmarked(rv=entry.rv))
                last = entry.rv
        elif kind := filtered(entry, namespace=namespace, matches=matches):
            observations.append(
                Received(
                    type=EventType(kind), namespace=entry.key[0], name=entry.key[1], rv=entry.rv
                )
            )
            last = entry.rv
        chance = rng.random()
        if chance < p_end:
            observations += [StreamEnded(), WatchStarted(rv=last)]
            at = model.resume_at(last)
        elif chance < p_end + p_expire:
            observations += [StreamEnded(), WatchStarted(rv=last), Expired()]
            later = bisect_left(model.boundaries, at + rng.randrange(20))
            at, last = snapshot(model.boundaries[min(later, len(model.boundaries) - 1)])
    observations.append(Bookmarked(rv=model.rv_at(len(entries))))  # the driver waits for it
    return ClientLog(name=name, namespace=namespace, label_selector=text, observations=observations)


def model_run(seed: int, *, changes: int = 400, keys: int = 30, clients: int = 4) -> Run:
    rng = random.Random(seed)
    reference = model_reference(rng, changes=changes, keys=keys)
    model = model_log(rng, reference, relists=rng.randint(0, 4), exact=seed % 2 == 0)
    logs = [
        model_client(
            rng,
            model,
            name=f"c{number}",
            namespace=rng.choice((None, None, "a", "b")),
            selector=rng.randrange(len(SELECTORS)),
            watch_list=rng.random() < 0.5,
        )
        for number in range(clients)
    ]
    return Run(
        reference=reference,
        clients=logs,
        relists=model.relists,
        apiserver_final=model.final,
        faults=len(model.relists),
    )


@pytest.mark.parametrize("seed", range(60))
def test_model_of_warmwatch_passes(seed: int) -> None:
    report = check_run(model_run(seed))
    assert report.ok, "\n".join(report.details())


def _droppable(log: ClientLog, relist_rvs: set[int]) -> list[int]:
    """Indices of live events delivered once (not initial events, not relist replays)."""
    times: dict[tuple[Key, int], int] = {}
    initial = False
    live: list[tuple[int, Received]] = []
    for index, observation in enumerate(log.observations):
        if isinstance(observation, WatchStarted):
            initial = observation.rv is None
        elif isinstance(observation, Bookmarked) and observation.initial_events_end:
            initial = False
        elif isinstance(observation, Received) and not initial:
            seen = (observation.key, observation.rv)
            times[seen] = times.get(seen, 0) + 1
            if observation.rv not in relist_rvs:
                live.append((index, observation))
    return [index for index, o in live if times[(o.key, o.rv)] == 1]


@pytest.mark.parametrize("seed", range(0, 60, 2))  # even seeds: the relists' ``reached`` is known
def test_model_with_one_event_dropped_is_caught(seed: int) -> None:
    run = model_run(seed)
    rng = random.Random(seed)
    relist_rvs = {r.rv for r in run.relists}
    order = list(range(len(run.clients)))
    rng.shuffle(order)
    # The first client (in a seeded order) that has a live event to drop: every seed tests one.
    number = next(n for n in order if _droppable(run.clients[n], relist_rvs))
    log = run.clients[number]
    candidates = _droppable(log, relist_rvs)
    index = rng.choice(candidates)
    dropped = log.observations[index]
    assert isinstance(dropped, Received)
    observations = [o for i, o in enumerate(log.observations) if i != index]
    clients = list(run.clients)
    clients[number] = replace(log, observations=observations)
    report = check_run(replace(run, clients=clients))
    key = f"{dropped.namespace}/{dropped.name}"
    assert any(
        v.rule in (Rule.COMPLETE, Rule.RESUMABLE) and v.client == log.name and v.key == key
        for v in report.violations
    ), (dropped, report.details())


def test_a_large_clean_run_passes() -> None:
    """Tens of thousands of events with resumes and relists: no false positives at scale.
    (Speed is not asserted here: unit tests do not time things.)"""
    reference = model_reference(random.Random(7), changes=20_000, keys=2_000)
    model = model_log(random.Random(1), reference, relists=3, exact=False)
    rng = random.Random(2)
    quiet = {"p_end": 0.002, "p_expire": 0.0002}
    clients = [
        model_client(rng, model, name="all", namespace=None, selector=0, watch_list=False, **quiet),
        model_client(rng, model, name="web", namespace=None, selector=1, watch_list=True, **quiet),
    ]
    run = Run(
        reference=reference, clients=clients, relists=model.relists, apiserver_final=model.final
    )
    report = check_run(run)
    assert report.ok, "\n".join(report.details())
    assert report.counts.events > 20_000
