"""Build and drive the controller-runtime manager in tests/crmanager, and any controller process
that reports JSON lines on stdout (the kopf operator in tests/e2e/kopf_operator.py too).

binary = crmanager.build()    # cached under ~/.cache/warmwatch/crmanager-<hash of its sources>
manager = crmanager.start_manager(binary, kubeconfig=..., namespace="ns", log=tmp / "m.log")
manager.wait_for(lambda lines: any(x["kind"] == "synced" for x in lines))
manager.stop()

A ``ControllerProcess`` collects the program's stdout lines on a thread (a line that is not JSON
is kept as ``{"kind": "text", "text": ...}``) and appends its stderr, the program's own log, to
``log``.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest import goclient, processes

SOURCE = Path(__file__).resolve().parents[1] / "tests" / "crmanager"

Lines = list[dict[str, Any]]


def build() -> Path:
    """The manager's binary, built once per content of tests/crmanager."""
    return goclient.build(SOURCE, "crmanager")


@dataclass
class ControllerProcess:
    """One running controller; ``lines`` grows as it prints."""

    name: str
    process: subprocess.Popen[str]
    log: Path
    lines: Lines = field(default_factory=list)
    condition: threading.Condition = field(default_factory=threading.Condition)

    @classmethod
    def start(
        cls,
        argv: Sequence[str],
        *,
        name: str,
        log: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> ControllerProcess:
        with open(log, "ab") as stderr:
            process = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env=dict(env) if env is not None else None,
                cwd=cwd,
            )
        controller = cls(name=name, process=process, log=log)
        threading.Thread(target=controller._read, daemon=True, name=f"{name}-reader").start()
        return controller

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            try:
                line = json.loads(raw)
            except json.JSONDecodeError:
                line = None
            if not isinstance(line, dict):
                line = {"kind": "text", "text": raw.rstrip("\n")}
            with self.condition:
                self.lines.append(line)
                self.condition.notify_all()
        with self.condition:
            self.condition.notify_all()

    def snapshot(self) -> Lines:
        with self.condition:
            return list(self.lines)

    def of_kind(self, kind: str) -> Lines:
        return [x for x in self.snapshot() if x.get("kind") == kind]

    def wait_for(self, predicate: Callable[[Lines], bool], *, timeout: float = 60) -> Lines:
        """Wait until ``predicate(lines)`` holds; fail early if the program exits."""
        deadline = time.monotonic() + timeout
        with self.condition:
            while not predicate(self.lines):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"{self.name}: condition not met in {timeout:.0f}s; "
                        f"last lines {self.lines[-5:]}; log tail:\n{self.log_tail()}"
                    )
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"{self.name} exited {self.process.returncode}: {self.lines[-5:]}; "
                        f"log tail:\n{self.log_tail()}"
                    )
                self.condition.wait(min(remaining, 0.5))
            return list(self.lines)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_text()[-chars:]

    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 20) -> int:
        """SIGTERM (both programs shut down gracefully on it), then SIGKILL after ``timeout``."""
        return processes.stop(self.process, timeout=timeout)


def start_manager(
    binary: Path, *, kubeconfig: Path, namespace: str, log: Path, verbosity: int = 2
) -> ControllerProcess:
    """The manager, watching ``namespace`` through ``kubeconfig``; klog goes to ``log``."""
    return ControllerProcess.start(
        [str(binary), f"--kubeconfig={kubeconfig}", f"--namespace={namespace}", f"-v={verbosity}"],
        name="crmanager",
        log=log,
        env=os.environ,
    )
