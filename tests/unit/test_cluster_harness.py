"""The control-plane harness's own robustness: ports no outgoing connection takes, and an
apiserver that exits while starting is started again (loadtest/ports.py, loadtest/cluster.py)."""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

import pytest

from loadtest import cluster, ports


def test_free_ports_are_below_the_ephemeral_range_and_bindable() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(50):
        port = ports.free_port()
        assert ports.LOWEST <= port < low
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))


def test_a_taken_port_is_not_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken, socket.socket() as spare:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        spare.bind(("127.0.0.1", 0))
        free = spare.getsockname()[1]
        spare.close()
        choices = iter([taken.getsockname()[1], free])
        monkeypatch.setattr(ports.random, "randrange", lambda low, high: next(choices))
        assert ports.free_port() == free


class _Plane(cluster.ControlPlane):
    """A plane whose apiserver "processes" exit at once for the first ``failures`` starts."""

    def __init__(self, directory: Path, *, failures: int) -> None:
        super().__init__(directory)
        self.failures = failures
        self.spawned = 0
        self.logs.mkdir(parents=True)
        (self.logs / "kube-apiserver.log").write_text("E1201 failed to listen: in use\n")

    def _spawn(self, name: str, argv: list[str]) -> int:
        self.spawned += 1
        return self.spawned

    def _alive(self, pid: int | None) -> bool:
        return pid is not None and pid > self.failures

    def _ready(self) -> bool:
        return self.spawned > self.failures


def _state() -> cluster.State:
    return cluster.State(etcd_port=1, etcd_peer_port=2, apiserver_port=3, binaries="", full=True)


def test_an_apiserver_that_exits_while_starting_is_started_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plane = _Plane(tmp_path, failures=cluster.APISERVER_ATTEMPTS - 1)
    plane._start_apiserver(_state())
    assert plane.spawned == cluster.APISERVER_ATTEMPTS
    assert "failed to listen: in use" in capsys.readouterr().err  # each exit is reported


def test_an_apiserver_that_keeps_exiting_fails_the_start_with_its_log(tmp_path: Path) -> None:
    plane = _Plane(tmp_path, failures=cluster.APISERVER_ATTEMPTS)
    with pytest.raises(cluster.ProcessExited, match="failed to listen"):
        plane._start_apiserver(_state())
    assert plane.spawned == cluster.APISERVER_ATTEMPTS


def test_a_started_process_counts_as_alive_once_spawn_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before its exec, a child shows the harness's command line, which does not name the
    plane's directory: taken for dead there, a second apiserver was started beside the first
    ("address already in use"). This child names the directory only after an exec 0.5 s in."""
    plane = cluster.ControlPlane(tmp_path)
    monkeypatch.setenv("WARMWATCH_TEST_DIR", str(tmp_path))
    script = (
        "import os, sys, time; time.sleep(0.5); os.execv(sys.executable, [sys.executable, "
        "'-c', 'import time; time.sleep(30)', os.environ['WARMWATCH_TEST_DIR']])"
    )
    pid = plane._spawn("late-exec", [sys.executable, "-c", script])
    try:
        assert plane._alive(pid)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
