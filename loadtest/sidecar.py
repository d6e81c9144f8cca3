"""Run warmwatch as a separate process, the way a pod runs it: for e2e tests, benchmarks, demo.

sidecar = Sidecar.start(upstream_kubeconfig=..., db=..., resources=["v1/configmaps"])
sidecar.kubeconfig      # for clients: http://127.0.0.1:<port>
sidecar.metric("warmwatch_upstream_requests_total", {"verb": "LIST", "code": "200"})
sidecar.stop()          # SIGTERM (graceful); sidecar.kill() is kill -9
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtest import exposition, processes
from loadtest.kubeapi import kubeconfig_for
from loadtest.ports import free_port

READY_TIMEOUT = 180.0


@dataclass
class Sidecar:
    process: subprocess.Popen[bytes]
    port: int
    metrics_port: int
    db: Path
    kubeconfig: Path
    log: Path
    argv: list[str]

    @classmethod
    def start(
        cls,
        *,
        upstream_kubeconfig: Path,
        db: Path,
        resources: Sequence[str] = (),
        extra: Sequence[str] = (),
        port: int | None = None,
        wait_ready: bool = True,
    ) -> Sidecar:
        port = port or free_port()
        metrics_port = free_port()
        log = db.with_suffix(".log")
        argv = [
            sys.executable,
            "-m",
            "proxy",
            f"--kubeconfig={upstream_kubeconfig}",
            f"--listen=127.0.0.1:{port}",
            f"--metrics-listen=127.0.0.1:{metrics_port}",
            f"--db={db}",
            "--client-auth=none",
            *(f"--resource={r}" for r in resources),
            *extra,
        ]
        sidecar = cls(
            process=cls._spawn(argv, log),
            port=port,
            metrics_port=metrics_port,
            db=db,
            kubeconfig=kubeconfig_for(
                f"http://127.0.0.1:{port}", path=db.with_suffix(".kubeconfig")
            ),
            log=log,
            argv=argv,
        )
        if wait_ready:
            sidecar.wait_ready()
        return sidecar

    @staticmethod
    def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            return subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=Path(__file__).resolve().parents[1],
            )

    def restart(self, *, wait_ready: bool = True) -> None:
        """Start again with the same flags, port and database."""
        assert self.process.poll() is not None, "still running"
        self.process = self._spawn(self.argv, self.log)
        if wait_ready:
            self.wait_ready()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.metrics_port}{path}", timeout=5
            ) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"warmwatch exited {self.process.returncode}:\n" + self.log.read_text()[-4000:]
                )
            try:
                if self.readyz()[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError("warmwatch not ready:\n" + self.log.read_text()[-4000:])

    def readyz(self) -> tuple[int, str]:
        """``/readyz``: its status code and text."""
        return self._get("/readyz")

    def metrics(self) -> str:
        return self._get("/metrics")[1]

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels`` (0 when none)."""
        return exposition.total(self.metrics(), name, labels)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM (graceful), SIGKILL after ``timeout``; the exit code."""
        return processes.stop(self.process, timeout=timeout)

    def kill(self) -> None:
        """kill -9: no chance to clean up, as in a crash."""
        processes.kill(self.process)

    def rss_bytes(self) -> int:
        return processes.rss_bytes(self.process.pid)
