"""loadtest.goclient.GoClient: waiting for the ``synced`` line does not scan the event lines.

A synced informer of N objects prints N event lines first. A wait that scans every line at
each new one is quadratic in N: at 300,000 objects the benchmark harness spent longer reading
than the client syncing. The program here is a stand-in printing what tests/goclient prints.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any

from loadtest.goclient import GoClient

EVENTS = 2000

PRINTER = f"""
import json, sys
print(json.dumps({{"kind": "start", "watchList": True}}), flush=True)
for i in range({EVENTS}):
    print(json.dumps({{"kind": "event", "type": "ADDED", "name": f"cm-{{i}}"}}))
print(json.dumps({{"kind": "synced", "resource": "v1/configmaps", "count": {EVENTS}}}), flush=True)
sys.stdin.read()
"""


class CountingLines(list[dict[str, Any]]):
    """``GoClient.lines`` that counts how many lines its readers looked at."""

    looked = 0

    def __iter__(self) -> Any:
        for line in super().__iter__():
            CountingLines.looked += 1
            yield line


def start_printer() -> GoClient:
    process = subprocess.Popen(
        [sys.executable, "-c", PRINTER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    client = GoClient(process=process, lines=CountingLines())
    threading.Thread(target=client._read, daemon=True).start()
    return client


def test_wait_synced_looks_at_no_event_line() -> None:
    CountingLines.looked = 0
    client = start_printer()
    try:
        synced = client.wait_synced(timeout=60)
        start = client.start_line(timeout=60)
    finally:
        client.stop()
    assert synced == [{"kind": "synced", "resource": "v1/configmaps", "count": EVENTS}]
    assert start["watchList"] is True
    assert CountingLines.looked == 0


def test_lines_by_kind_keep_every_line_in_order() -> None:
    client = start_printer()
    try:
        client.wait_synced(timeout=60)
        with client.condition:
            events = list(client.of_kind["event"])
            every = list.copy(client.lines)
    finally:
        client.stop()
    assert [e["name"] for e in events] == [f"cm-{i}" for i in range(EVENTS)]
    assert len(every) == EVENTS + 2
    assert client.events() == events
