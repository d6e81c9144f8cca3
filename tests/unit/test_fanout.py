"""loadtest/fanout.py's reading of loadtest/fanoutwatch's records (the two programs' contract)."""

from __future__ import annotations

from array import array

import pytest

from loadtest.fanout import WatcherLine, read_records


def _line(selector: str, events: int) -> WatcherLine:
    return WatcherLine(
        kind="watcher",
        selector=selector,
        events=events,
        types={"MODIFIED": events},
        lines=events + 1,
        bookmarks=1,
        errors=[],
        ends=0,
        last_rv="9",
    )


def test_records_split_per_watcher_in_order() -> None:
    data = b"".join(
        [
            array("q", [7, 9]).tobytes(),
            array("d", [1.5, 2.5]).tobytes(),
            b"",  # a watcher that received nothing
            array("q", [8]).tobytes(),
            array("d", [3.25]).tobytes(),
        ]
    )
    records = read_records("via", [_line("", 2), _line("tier=a", 0), _line("tier!=c", 1)], data)
    assert [(r.selector, list(r.rvs), list(r.times)) for r in records] == [
        (None, [7, 9], [1.5, 2.5]),
        ("tier=a", [], []),
        ("tier!=c", [8], [3.25]),
    ]
    assert records[0].group == "via"
    assert records[0].lines - records[0].bookmarks - len(records[0].rvs) == 0


def test_records_of_another_length_are_refused() -> None:
    data = array("q", [7]).tobytes() + array("d", [1.5]).tobytes()
    with pytest.raises(ValueError, match="16 bytes, 32 expected"):
        read_records("via", [_line("", 2)], data)
    with pytest.raises(ValueError, match="16 bytes, 0 expected"):
        read_records("via", [_line("", 0)], data)
