"""Benchmarks of warmwatch side by side with the apiserver, one command
(``python -m loadtest.bench``, see each module):

- ``throughput``: memory and LIST throughput (the default);
- ``clients`` (``--clients``): time-to-synced of client kinds on fast and slow links;
- ``million`` (``--million``): the million-object bar;
- ``seeding`` (``--seeding``): a controller's restart with a new warmwatch (cold), one seeded
  from a peer, and one on its own database (warm), over a slow link.

Nothing is asserted: these are measurements, not tests.
"""

from __future__ import annotations

import sys
from pathlib import Path


def say(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def scan_log(log: Path) -> list[str]:
    """Lines of a warmwatch log worth a look: warnings, errors, tracebacks."""
    if not log.exists():
        return []
    return [
        line
        for line in log.read_text(errors="replace").splitlines()
        if any(mark in line for mark in (" WARNING ", " ERROR ", " CRITICAL ", "Traceback"))
        and "--client-auth none" not in line  # the expected warning of a test setup
    ]
