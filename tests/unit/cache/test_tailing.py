"""The in-memory tail of a shape's log and its parked followers (cache/tailing.py), without
sockets: what is published after commit is offered to each parked follower in order; one that
cannot take it is woken to read it itself, and the writer never fails for a follower."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from proxy.cache.records import ChangeType, EventRecord
from proxy.cache.tailing import ShapeLog


def record(seq: int) -> EventRecord:
    return EventRecord(
        seq=seq,
        type=ChangeType.MODIFIED,
        rv=str(100 + seq),
        batch=False,
        namespace="a",
        name=f"cm-{seq}",
        labels=b"{}",
        prev_labels=b"{}",
        prev_raw=None,
        raw=b"{}",
    )


class Follower:
    """Takes what follows its cursor while ``accepting``."""

    def __init__(self, *, cursor: int, accepting: bool = True, fails: bool = False) -> None:
        self.cursor = cursor
        self.accepting = accepting
        self.fails = fails
        self.taken: list[int] = []
        self.woken = 0

    def offer(self, records: Sequence[EventRecord]) -> bool:
        if self.fails:
            raise RuntimeError("a broken watcher")
        if not self.accepting or records[0].seq != self.cursor + 1:
            return False
        self.taken += [r.seq for r in records]
        self.cursor = records[-1].seq
        return True

    def wake(self) -> None:
        self.woken += 1


async def test_parked_followers_take_each_published_batch_in_order_and_stay_parked() -> None:
    log = ShapeLog(last_seq=0)
    followers = [Follower(cursor=0) for _ in range(3)]
    for follower in followers:
        assert log.park(follower, cursor=follower.cursor)
    log.publish(last_seq=2, records=[record(1), record(2)])
    log.publish(last_seq=3, records=[record(3)])
    for follower in followers:
        assert follower.taken == [1, 2, 3] and follower.woken == 0
    assert set(log._parked) == set(followers)


async def test_a_follower_that_cannot_take_a_batch_is_woken_and_unparked() -> None:
    log = ShapeLog(last_seq=0)
    keeping_up, behind = Follower(cursor=0), Follower(cursor=0, accepting=False)
    log.park(keeping_up, cursor=0)
    log.park(behind, cursor=0)
    log.publish(last_seq=1, records=[record(1)])
    assert behind.woken == 1 and behind.taken == []
    assert list(log._parked) == [keeping_up]
    log.publish(last_seq=2, records=[record(2)])
    assert behind.woken == 1  # no longer parked: it reads for itself now
    assert keeping_up.taken == [1, 2]


async def test_a_gap_in_what_is_published_wakes_the_follower_to_read_from_the_database() -> None:
    log = ShapeLog(last_seq=0, ring_size=2)
    follower = Follower(cursor=0)
    log.park(follower, cursor=0)
    # A large commit publishes only its tail: records 1-3 are in the database alone.
    log.publish(last_seq=5, records=[record(4), record(5)])
    assert follower.woken == 1 and follower.taken == []


async def test_a_follower_that_fails_is_woken_and_the_writer_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = ShapeLog(last_seq=0)
    broken, fine = Follower(cursor=0, fails=True), Follower(cursor=0)
    log.park(broken, cursor=0)
    log.park(fine, cursor=0)
    log.publish(last_seq=1, records=[record(1)])  # does not raise
    assert broken.woken == 1 and fine.taken == [1]
    assert "failed to take published events" in caplog.text


async def test_parking_is_refused_behind_the_log_and_after_it_closed() -> None:
    log = ShapeLog(last_seq=5)
    assert not log.park(Follower(cursor=4), cursor=4)  # record 5 must be read first
    follower = Follower(cursor=5)
    assert log.park(follower, cursor=5)
    log.close()
    assert follower.woken == 1 and not log._parked
    assert not log.park(Follower(cursor=5), cursor=5)


async def test_an_unparked_follower_is_offered_nothing() -> None:
    log = ShapeLog(last_seq=0)
    follower = Follower(cursor=0)
    log.park(follower, cursor=0)
    log.unpark(follower)
    log.publish(last_seq=1, records=[record(1)])
    assert follower.taken == [] and follower.woken == 0


def test_the_ring_answers_from_memory_while_it_reaches_back() -> None:
    log = ShapeLog(last_seq=0, ring_size=3)
    log.publish(last_seq=4, records=[record(1), record(2), record(3), record(4)])
    assert log.read_after(4, limit=10) == []  # nothing new
    assert [r.seq for r in log.read_after(1, limit=10) or []] == [2, 3, 4]
    assert [r.seq for r in log.read_after(2, limit=1) or []] == [3]
    assert log.read_after(0, limit=10) is None  # record 1 left the ring: the database


def test_a_tail_only_publish_keeps_the_ring_contiguous() -> None:
    log = ShapeLog(last_seq=0, ring_size=8)
    log.publish(last_seq=2, records=[record(1), record(2)])
    log.publish(last_seq=9, records=[record(8), record(9)])  # 3-7 only in the database
    assert log.read_after(2, limit=10) is None
    assert [r.seq for r in log.read_after(7, limit=10) or []] == [8, 9]


def test_the_ring_is_bounded_in_bytes_too() -> None:
    log = ShapeLog(last_seq=0, ring_size=1000, ring_bytes=10_000)
    records = [dataclasses.replace(record(seq), raw=b"x" * 1000) for seq in range(1, 101)]
    log.publish(last_seq=100, records=records)
    kept = log.read_after(92, limit=100)  # 8 records of ~1.2 KB fit in 10 KB
    assert kept is not None and [r.seq for r in kept] == list(range(93, 101))
    assert log.read_after(91, limit=100) is None
