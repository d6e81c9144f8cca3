"""The randomized fault run (``python -m loadtest.faults``) at CI size.

Five minutes of traffic while warmwatch is killed, the apiserver restarts and goes away, etcd is
compacted and clients stay away until warmwatch's log has forgotten them; every client's
observations are then held to docs/design.md §5a by ``loadtest.checking``. The driver runs as a
subprocess with its own control plane (in the test's temporary directory), which it stops at
the end; the test stops it too should the driver itself be killed.

The shorter upstream outage (8 s instead of 30), the shorter event log (1000 entries, so a
client away for about a minute falls out of it) and the modest write rate keep the run inside
about seven minutes on two shared cores.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.cluster import ControlPlane
from loadtest.faults import FAULT_KINDS

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SUMMARY = re.compile(r"^faults=(\d+) events=(\d+) violations=(\d+)$")
MIN_FAULTS = 20


@pytest.mark.timeout(1200)
def test_no_watch_guarantee_breaks_under_faults(tmp_path: Path) -> None:
    directory = tmp_path / "run"
    log = tmp_path / "faults.log"
    argv = [
        sys.executable,
        "-m",
        "loadtest.faults",
        "--dir",
        str(directory),
        "--minutes",
        "5",
        "--seed",
        "20261130",
        "--rate",
        "100",
        "--outage",
        "8",
        "--retention-events",
        "1000",
        "--gap",
        "1,4",
        "--min-faults",
        str(MIN_FAULTS),
    ]
    # Its own process group: should it hang, the driver, its warmwatch and its Go programs are
    # stopped together (the control plane's processes have their own sessions: `down` below).
    with log.open("w") as stderr:
        driver = subprocess.Popen(
            argv,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,
        )
    try:
        stdout, _ = driver.communicate(timeout=1000)
    except subprocess.TimeoutExpired:
        driver.send_signal(signal.SIGTERM)  # the driver cleans up after itself on SIGTERM
        try:
            driver.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.communicate()
        raise
    finally:
        ControlPlane(directory / "cp").down()  # the driver stops it; this is for a killed driver

    output = stdout.splitlines()
    context = f"stdout:\n{stdout[-5000:]}\nstderr (tail):\n{log.read_text()[-8000:]}"
    summaries = [line for line in output if SUMMARY.match(line)]
    assert len(summaries) == 1 and output[-1] == summaries[0], context
    match = SUMMARY.match(summaries[0])
    assert match is not None
    faults, events, violations = (int(group) for group in match.groups())
    assert driver.returncode == 0, context
    assert violations == 0, context
    assert faults >= MIN_FAULTS, context
    assert events >= 10_000, context

    summary = json.loads((directory / "summary.json").read_text())
    assert {kind for kind, count in summary["faults"].items() if count} == set(FAULT_KINDS), context
    # warmwatch relisted after the apiserver lost its watch cache, for both resources
    assert all(count > 0 for count in summary["relists"].values()), summary
    # clients that stayed away got 410 and relisted
    assert sum(summary["client_expired"].values()) >= summary["faults"]["client-away"], summary
    # the recorded runs check the same offline
    recheck = subprocess.run(
        [sys.executable, "-m", "loadtest.faults", "--recheck", str(directory)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert recheck.returncode == 0, recheck.stdout + recheck.stderr
    assert recheck.stdout.splitlines()[-1].endswith(" violations=0"), recheck.stdout
