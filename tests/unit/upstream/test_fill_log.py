"""Progress of a long list: objects, rate, time left; at most one line per interval."""

from __future__ import annotations

import logging

import pytest

from proxy.upstream.reflecting import FillLog


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_lines_at_most_every_interval_with_rate_and_time_left(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    log = FillLog(resource="v1/configmaps", expected=None, interval=5.0, clock=clock)
    caplog.set_level(logging.INFO, logger="proxy.upstream.reflecting")
    clock.now += 1
    assert log.add(500, remaining=9500) is None  # too soon
    clock.now += 4
    fields = log.add(500, remaining=9000)  # 1,000 of 10,000 after 5 s
    assert fields == {
        "resource": "v1/configmaps",
        "objects": 1000,
        "objectsPerSecond": 200.0,
        "expectedObjects": 10000,
        "secondsLeft": 45.0,
    }
    clock.now += 1
    assert log.add(1000) is None
    (record,) = caplog.records
    assert record.getMessage() == (
        "v1/configmaps: listing: 1000 objects of about 10000, 45s left (200 objects/s)"
    )
    assert record.objects == 1000  # type: ignore[attr-defined]


def test_without_a_total_no_time_left() -> None:
    clock = Clock()
    log = FillLog(resource="v1/pods", expected=None, interval=5.0, clock=clock)
    clock.now += 10
    fields = log.add(3000)
    assert fields is not None and fields["objectsPerSecond"] == 300.0
    assert "secondsLeft" not in fields


def test_a_relist_expects_what_the_shape_held() -> None:
    clock = Clock()
    log = FillLog(resource="v1/pods", expected=2000, interval=5.0, clock=clock)
    clock.now += 5
    fields = log.add(1000)
    assert fields is not None and fields["secondsLeft"] == 5.0
