"""Stopping the processes the harness starts (warmwatch, controllers, toxiproxy), one way;
and placing them on CPUs."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Set
from pathlib import Path
from typing import Any


def stop(process: subprocess.Popen[Any], *, timeout: float) -> int:
    """SIGTERM, so the program shuts down cleanly; SIGKILL after ``timeout``. Its exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def kill(process: subprocess.Popen[Any]) -> None:
    """kill -9: no chance to clean up, as in a crash."""
    if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()


def pin(pid: int, cpus: Set[int]) -> None:
    """Run every thread of ``pid`` on ``cpus`` only (threads it starts later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):  # a thread that has just ended
            os.sched_setaffinity(int(task.name), cpus)


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (/proc/PID/stat), seconds; 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int, field_name: str = "VmRSS") -> int:
    """A memory figure of ``pid`` from /proc/PID/status (``VmRSS``, ``VmHWM``: its peak),
    bytes; 0 when it is gone."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field_name}:"):
                return int(line.split()[1]) * 1024
    return 0
