"""Build and drive the Go informer program in tests/goclient ("the existing controller").

The binary is cached under ~/.cache/warmwatch/goclient-<hash of its sources>, so a second run of
the suite does not rebuild it. The program prints JSON lines (see tests/goclient/README.md); the
runner collects them on a thread so tests can wait for "synced", events or a digest.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest.building import cache_root

SOURCE = Path(__file__).resolve().parents[1] / "tests" / "goclient"


def build(source: Path = SOURCE, name: str = "goclient") -> Path:
    """Build the Go program in ``source`` (its own module) once per content of its sources:
    cached as ``<cache_root>/<name>-<hash>/<name>``. Also builds tests/crmanager and
    loadtest/fanoutwatch."""
    digest = hashlib.sha256()
    for path in sorted(source.rglob("*")):
        if path.is_file() and path.suffix in {".go", ".mod", ".sum"}:
            digest.update(path.relative_to(source).as_posix().encode())
            digest.update(path.read_bytes())
    binary = cache_root() / f"{name}-{digest.hexdigest()[:16]}" / name
    if not binary.exists():
        binary.parent.mkdir(parents=True, exist_ok=True)
        partial = binary.with_name(f"{name}.partial")
        subprocess.run(
            ["go", "build", "-trimpath", "-o", str(partial), "."],
            cwd=source,
            check=True,
            env=os.environ | {"CGO_ENABLED": "0"},
        )
        partial.rename(binary)
    return binary


@dataclass
class GoClient:
    """One running informer program; ``lines`` grows as it prints."""

    process: subprocess.Popen[str]
    lines: list[dict[str, Any]] = field(default_factory=list)
    condition: threading.Condition = field(default_factory=threading.Condition)
    of_kind: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """The same lines by their ``kind``, so that waiting for a ``synced`` or ``start`` line
    costs the same however many event lines came before it: a predicate that scans
    ``lines`` is evaluated at every line, quadratic in the objects synced (at 300,000 it
    took the harness longer than the client's sync)."""

    @classmethod
    def start(
        cls,
        binary: Path,
        *,
        kubeconfig: Path,
        resources: Sequence[str],
        watch_list: bool | None = None,
        mode: str = "informer",
        protobuf: bool = False,
        object_digest: bool = False,
        extra: Sequence[str] = (),
    ) -> GoClient:
        """``protobuf``: the typed/metadata clients' rest.Config asks for protobuf, as
        kube-controller-manager's does; ``object_digest``: digests also hash whole objects."""
        env = dict(os.environ)
        env.pop("KUBE_FEATURE_WatchListClient", None)
        if watch_list is not None:
            env["KUBE_FEATURE_WatchListClient"] = "true" if watch_list else "false"
        argv = [str(binary), f"--kubeconfig={kubeconfig}", f"--mode={mode}"]
        if protobuf:
            argv.append("--protobuf")
        if object_digest:
            argv.append("--object-digest")
        argv += extra
        argv += [f"--resource={r}" for r in resources]
        process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        client = cls(process=process)
        threading.Thread(target=client._read, daemon=True, name="goclient-reader").start()
        return client

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = json.loads(raw)
            with self.condition:
                self.lines.append(line)
                self.of_kind.setdefault(line["kind"], []).append(line)
                self.condition.notify_all()
        with self.condition:
            self.condition.notify_all()

    def wait_for(
        self, predicate: Callable[[list[dict[str, Any]]], bool], *, timeout: float = 60
    ) -> list[dict[str, Any]]:
        with self.condition:
            self._wait(lambda: predicate(self.lines), timeout=timeout)
            return list(self.lines)

    def _wait(self, met: Callable[[], bool], *, timeout: float) -> None:
        """Wait, holding :attr:`condition`, until ``met()`` (evaluated at every new line)."""
        deadline = time.monotonic() + timeout
        while not met():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"goclient: condition not met; last lines {self.lines[-5:]}")
            if self.process.poll() is not None and not met():
                raise RuntimeError(f"goclient exited {self.process.returncode}: {self.lines[-5:]}")
            self.condition.wait(min(remaining, 0.5))

    def wait_kind(self, kind: str, count: int = 1, *, timeout: float = 60) -> list[dict[str, Any]]:
        """The lines of ``kind`` once there are ``count`` of them (:attr:`of_kind`)."""
        with self.condition:
            self._wait(lambda: len(self.of_kind.get(kind, ())) >= count, timeout=timeout)
            return list(self.of_kind[kind])

    def wait_synced(self, count: int = 1, *, timeout: float = 120) -> list[dict[str, Any]]:
        return self.wait_kind("synced", count, timeout=timeout)

    def events(self) -> list[dict[str, Any]]:
        with self.condition:
            return [x for x in self.lines if x["kind"] == "event"]

    def digest(self, *, timeout: float = 60) -> dict[str, dict[str, Any]]:
        """Ask for a digest now (the program keeps running); one entry per resource."""
        with self.condition:
            seen = len(self.lines)
        assert self.process.stdin is not None
        self.process.stdin.write("digest\n")
        self.process.stdin.flush()
        synced = {x["resource"] for x in self.lines if x["kind"] == "synced"}
        lines = self.wait_for(
            lambda ls: {x["resource"] for x in ls[seen:] if x["kind"] == "digest"} >= synced,
            timeout=timeout,
        )
        return {x["resource"]: x for x in lines[seen:] if x["kind"] == "digest"}

    def dump(self, *, timeout: float = 60) -> dict[tuple[str, str, str], dict[str, Any]]:
        """Every informer's objects, whole, as the program holds them:
        (resource, namespace, name) -> object."""
        with self.condition:
            seen = len(self.lines)
        assert self.process.stdin is not None
        self.process.stdin.write("dump\n")
        self.process.stdin.flush()
        lines = self.wait_for(
            lambda ls: any(x["kind"] == "dumped" for x in ls[seen:]), timeout=timeout
        )
        return {
            (x["resource"], x["namespace"], x["name"]): x["object"]
            for x in lines[seen:]
            if x["kind"] == "object"
        }

    def start_line(self, *, timeout: float = 60) -> dict[str, Any]:
        return self.wait_kind("start", timeout=timeout)[0]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def fidelity(
    binary: Path,
    *,
    kubeconfig: Path,
    other_kubeconfig: Path,
    resources: Sequence[str],
    checks: Sequence[str] = ("list", "watchlist", "metadata-list"),
    extra: Sequence[str] = (),
    timeout: float = 120,
) -> list[dict[str, Any]]:
    """Run the program's fidelity mode: the same protobuf LIST / WatchList / metadata LIST
    from both servers, compared; one ``{"kind":"fidelity",...}`` line per resource and check
    (tests/goclient/README.md)."""
    argv = [
        str(binary),
        "--mode=fidelity",
        f"--kubeconfig={kubeconfig}",
        f"--other-kubeconfig={other_kubeconfig}",
        f"--checks={','.join(checks)}",
        *(f"--resource={r}" for r in resources),
        *extra,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    if done.returncode not in (0, 1) or not lines or lines[-1]["kind"] != "exit":
        raise RuntimeError(
            f"goclient fidelity exited {done.returncode}: {done.stdout}{done.stderr}"
        )
    return [x for x in lines if x["kind"] == "fidelity"]
