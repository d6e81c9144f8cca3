"""Drive a real kube-controller-manager (the harness's own build) against any kubeconfig.

    kcm = ControllerManager.start(
        binaries=Path(plane.state().binaries),
        kubeconfig=sidecar.kubeconfig,           # through warmwatch, or plane.admin_kubeconfig
        service_account_key=plane.pki.service_account_key,
        root_ca=plane.pki.ca_cert,
        log=tmp_path / "kcm.log",
    )
    seconds = kcm.wait_synced(timeout=120)       # process start -> every controller synced
    kcm.stop()                                   # SIGTERM; kcm.kill() is kill -9

"Synced" is read from the log lines kube-controller-manager v1.37.2 prints (klog text format,
``--v=1`` or more). Each controller logs ``"Controller starting..." controller="deployment-
controller"``, then waits for its informers with ``cache.WaitForNamedCacheSyncWithContext``,
which logs ``"Waiting for caches to sync"`` and later ``"Caches are synced"`` — without the
controller's name: v1.37.2 names a controller's logger only while constructing it, not in the
context its Run gets. So the whole set counts as synced at the first line after which

- every requested controller has logged "Controller starting...",
- as many "Waiting for caches to sync" lines were logged as controllers were requested, plus one
  for each garbage-collector or quota resync (``"syncing garbage collector with updated
  resources from discovery"``, ``"syncing resource quota controller ..."``, ``--v=2``), each of
  which waits once more,
- every "Waiting for caches to sync" has its "Caches are synced" (a wait that fails logs none),
- and the garbage collector, if requested, logged ``"Garbage collector: all resource monitors
  have synced"``. After 30 s it gives up instead (``"... not all resource monitors could be
  synced, proceeding anyways"``): ``wait_synced`` fails then.

Times come from the lines' own klog timestamps, so the polling interval does not add to them.
"""

from __future__ import annotations

import datetime
import re
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest import processes
from loadtest.cluster import CONTROLLER_MANAGER_BURST, CONTROLLER_MANAGER_QPS

TEST_CONTROLLERS = (
    "deployment",
    "replicaset",
    "job",
    "cronjob",
    "statefulset",
    "daemonset",
    "endpointslice",
    "garbagecollector",
    # What the harness's own kube-controller-manager runs (loadtest.cluster): a test pauses that
    # one, so this one must create service accounts (Pods are refused without "default"), their
    # tokens, and finish namespace deletion.
    "serviceaccount",
    "serviceaccount-token",
    "namespace",
)
"""The controllers the tests and the benchmark run: the workload controllers, whose informers
cover pods, replicasets, deployments, jobs, cronjobs, statefulsets, daemonsets, controller
revisions, PVCs, services, nodes and endpointslices, and the garbage collector, which watches
the metadata of every deletable resource."""

CONTROLLER_NAMES = {
    "deployment": "deployment-controller",
    "replicaset": "replicaset-controller",
    "job": "job-controller",
    "cronjob": "cronjob-controller",
    "statefulset": "statefulset-controller",
    "daemonset": "daemonset-controller",
    "endpointslice": "endpointslice-controller",
    "garbagecollector": "garbage-collector-controller",
    "resourcequota": "resourcequota-controller",
    "serviceaccount": "serviceaccount-controller",
    "serviceaccount-token": "serviceaccount-token-controller",
    "namespace": "namespace-controller",
}
"""``--controllers`` alias -> the controller's name (cmd/kube-controller-manager/names), which
"Controller starting..." logs. Canonical names (``...-controller``) may be passed as they are."""

GARBAGE_COLLECTOR = "garbage-collector-controller"
CONTROLLER_STARTING = "Controller starting..."
WAITING_FOR_CACHES = "Waiting for caches to sync"
CACHES_SYNCED = "Caches are synced"
GC_RESYNC = "syncing garbage collector with updated resources from discovery"
QUOTA_RESYNC = "syncing resource quota controller with updated resources from discovery"
GC_SYNCED = "Garbage collector: all resource monitors have synced"
GC_GAVE_UP = "Garbage collector: not all resource monitors could be synced"
LEASE_ACQUIRED = "Successfully acquired lease"
APISERVER_UNHEALTHY = "failed to wait for apiserver being healthy"

_KLOG = re.compile(
    r"^(?P<severity>[IWEF])(?P<month>\d\d)(?P<day>\d\d) "
    r"(?P<clock>\d\d:\d\d:\d\d\.\d{6})\s+\d+\s+(?P<source>[^\]]+)\] (?P<message>.*)$"
)
_CHATTER = ('"Processing item"', "\"item doesn't have an owner", '"Caches populated"')
_CONTROLLER = re.compile(r'\bcontroller="(?P<name>[^"]+)"')


@dataclass(frozen=True, slots=True)
class LogLine:
    at: float
    """Wall-clock seconds (the klog timestamp; local time, as klog writes it)."""
    severity: str
    message: str


def parse_klog(line: str, *, year: int | None = None) -> LogLine | None:
    """One klog text line, or None for anything else (continuation lines, panics)."""
    match = _KLOG.match(line)
    if match is None:
        return None
    now = datetime.datetime.now()
    clock = datetime.datetime.strptime(
        f"{year or now.year}-{match['month']}-{match['day']} {match['clock']}",
        "%Y-%m-%d %H:%M:%S.%f",
    )
    if year is None and clock - now > datetime.timedelta(days=1):  # logged last December
        clock = clock.replace(year=now.year - 1)
    return LogLine(at=clock.timestamp(), severity=match["severity"], message=match["message"])


def controller_name(controller: str) -> str:
    return CONTROLLER_NAMES.get(controller, controller)


@dataclass
class SyncProgress:
    """What the log says so far about the controllers' caches."""

    expected: tuple[str, ...]
    started: set[str] = field(default_factory=set)
    waits: int = 0
    synced: int = 0
    resyncs: int = 0
    gc_synced_at: float | None = None
    gc_gave_up: bool = False
    all_synced_at: float | None = None
    """Wall-clock time of the line after which every controller counted as synced."""

    def feed(self, line: LogLine) -> None:
        message = line.message
        if message.startswith(f'"{CONTROLLER_STARTING}"'):
            found = _CONTROLLER.search(message)
            if found:
                self.started.add(found["name"])
        elif message.startswith(f'"{WAITING_FOR_CACHES}"'):
            self.waits += 1
        elif message.startswith(f'"{CACHES_SYNCED}"'):
            self.synced += 1
        elif message.startswith((f'"{GC_RESYNC}"', f'"{QUOTA_RESYNC}"')):
            self.resyncs += 1
        elif message.startswith(f'"{GC_SYNCED}"'):
            self.gc_synced_at = line.at
        elif message.startswith(f'"{GC_GAVE_UP}'):
            self.gc_gave_up = True
        if self.all_synced_at is None and self.complete():
            self.all_synced_at = line.at

    def complete(self) -> bool:
        gc_expected = GARBAGE_COLLECTOR in self.expected
        return (
            all(name in self.started for name in self.expected)
            and self.waits >= len(self.expected) + self.resyncs
            and self.synced >= self.waits
            and (self.gc_synced_at is not None or not gc_expected)
        )

    def describe(self) -> str:
        missing = [name for name in self.expected if name not in self.started]
        return (
            f"not started: {missing or 'none'}; caches synced {self.synced} of {self.waits} "
            f"waits (expected {len(self.expected) + self.resyncs}); garbage collector "
            + (
                "gave up"
                if self.gc_gave_up
                else "synced"
                if self.gc_synced_at is not None
                else "not synced"
            )
        )


class NotSynced(AssertionError):
    """kube-controller-manager exited or gave up before every controller synced."""


@dataclass
class ControllerManager:
    """One running kube-controller-manager; its output goes to ``log`` (appended)."""

    process: subprocess.Popen[bytes]
    argv: list[str]
    log: Path
    controllers: tuple[str, ...]
    started_at: float
    """Wall-clock seconds just before the process was started."""
    log_offset: int
    """Where this process's output starts in ``log``."""
    progress: SyncProgress
    _read: int = 0
    _partial: str = ""
    _lines: list[str] = field(default_factory=list)

    @classmethod
    def start(
        cls,
        *,
        binaries: Path,
        kubeconfig: Path,
        service_account_key: Path,
        root_ca: Path,
        log: Path,
        controllers: Sequence[str] = TEST_CONTROLLERS,
        leader_elect: bool = False,
        verbosity: int = 2,
        extra: Sequence[str] = (),
    ) -> ControllerManager:
        if verbosity < 2:
            raise ValueError("--v=2 or more: sync detection reads V(1) and V(2) lines")
        names = tuple(controller_name(c) for c in controllers)
        argv = [
            str(binaries / "kube-controller-manager"),
            f"--kubeconfig={kubeconfig}",
            f"--controllers={','.join(controllers)}",
            f"--service-account-private-key-file={service_account_key}",
            f"--root-ca-file={root_ca}",
            f"--leader-elect={'true' if leader_elect else 'false'}",
            "--bind-address=127.0.0.1",
            "--secure-port=0",
            f"--kube-api-qps={CONTROLLER_MANAGER_QPS}",
            f"--kube-api-burst={CONTROLLER_MANAGER_BURST}",
            f"--v={verbosity}",
            *extra,
        ]
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            offset = out.tell()
            started_at = time.time()
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=log.parent,
            )
        return cls(
            process=process,
            argv=argv,
            log=log,
            controllers=names,
            started_at=started_at,
            log_offset=offset,
            progress=SyncProgress(expected=names),
        )

    # -- the log -----------------------------------------------------------------------------

    def _poll(self) -> None:
        """Read what the process wrote since the last call."""
        with open(self.log, "rb") as source:
            source.seek(self.log_offset + self._read)
            chunk = source.read()
        self._read += len(chunk)
        text = self._partial + chunk.decode(errors="replace")
        *complete, self._partial = text.split("\n")
        for raw in complete:
            self._lines.append(raw)
            line = parse_klog(raw)
            if line is not None:
                self.progress.feed(line)

    def text(self) -> str:
        """Everything this process has logged so far."""
        self._poll()
        return "\n".join([*self._lines, self._partial])

    def lines_with(self, needle: str) -> list[str]:
        self._poll()
        return [line for line in self._lines if needle in line]

    def synced_after(self) -> float | None:
        """Seconds from process start until every controller synced; None until then."""
        self._poll()
        at = self.progress.all_synced_at
        return None if at is None else at - self.started_at

    # -- waiting -----------------------------------------------------------------------------

    def wait_synced(self, timeout: float = 120) -> float:
        """Seconds from process start until the last controller's caches synced.

        Raises ``NotSynced`` when the process exits first or the garbage collector gives up
        (it waits 30 s for its monitors, then proceeds unsynced), ``TimeoutError`` when not
        every controller synced within ``timeout`` seconds of this call."""
        deadline = time.time() + timeout
        while True:
            synced = self.synced_after()
            if synced is not None:
                return synced
            if self.process.poll() is not None:
                self._poll()
                raise NotSynced(
                    f"kube-controller-manager exited {self.process.returncode} before its "
                    f"caches synced ({self.progress.describe()}):\n{self.tail()}"
                )
            if self.progress.gc_gave_up:
                raise NotSynced(
                    "the garbage collector gave up waiting for its monitors "
                    f"({self.progress.describe()}):\n{self.tail()}"
                )
            if time.time() > deadline:
                raise TimeoutError(
                    f"kube-controller-manager: caches not synced after {self.seconds():.0f} s "
                    f"({self.progress.describe()}):\n{self.tail()}"
                )
            time.sleep(0.2)

    def wait_for_line(self, needle: str, timeout: float = 60) -> str:
        """The first log line containing ``needle``; waits for it."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.lines_with(needle)
            if found:
                return found[0]
            if self.process.poll() is not None:
                raise NotSynced(
                    f"kube-controller-manager exited {self.process.returncode} before logging "
                    f"{needle!r}:\n{self.tail()}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"no log line {needle!r} after {timeout:.0f} s\n{self.tail()}")
            time.sleep(0.2)

    def seconds(self) -> float:
        """Seconds since the process started."""
        return time.time() - self.started_at

    def tail(self, lines: int = 30) -> str:
        """The last log lines, for failure messages; without the garbage collector's per-item
        chatter (``--v=2``), which would push everything else out."""
        kept = [line for line in self.text().splitlines() if not any(n in line for n in _CHATTER)]
        return "\n".join(kept[-lines:])

    # -- stopping ----------------------------------------------------------------------------

    def stop(self, timeout: float = 20) -> int:
        """SIGTERM (controllers shut down, a held lease may be released), SIGKILL after
        ``timeout``."""
        return processes.stop(self.process, timeout=timeout)

    def kill(self) -> None:
        """kill -9: no chance to clean up, as in a crash."""
        processes.kill(self.process)

    @property
    def running(self) -> bool:
        return self.process.poll() is None


# -- workloads ---------------------------------------------------------------------------------

PAUSE_CONTAINERS = [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]
"""Never pulled: there is no kubelet, Pods stay Pending."""


def deployment(name: str, *, replicas: int) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": PAUSE_CONTAINERS}},
        },
    }


def job(name: str, *, parallelism: int) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "template": {"spec": {"restartPolicy": "Never", "containers": PAUSE_CONTAINERS}},
        },
    }
