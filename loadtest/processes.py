"""Stopping the processes the harness starts (warmwatch, controllers, toxiproxy), one way."""

from __future__ import annotations

import os
import signal
import subprocess
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
