"""The Go informer program (``tests/goclient``) as a client of the fault run: one process per
resource and ``KUBE_FEATURE_WatchListClient`` value, checked as far as its output allows."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from loadtest.checking import Item, Rule, Violation
from loadtest.faults import Key
from loadtest.faults.resources import Resource


class GoInformer:
    """One Go informer program for one resource; its stdout and klog output in one stream."""

    def __init__(
        self,
        *,
        binary: Path,
        kubeconfig: Path,
        resource: Resource,
        watch_list: bool,
        log: Path,
        protobuf: bool = False,
    ) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig
        self.resource = resource
        self.watch_list = watch_list
        self.protobuf = protobuf
        """A typed informer in protobuf (kube-controller-manager's kind), served by warmwatch's
        protobuf shape; otherwise a dynamic informer in JSON."""
        self.log_path = log
        encoding = "protobuf-" if protobuf else ""
        self.name = f"go-{resource.name}-{encoding}{'watchlist' if watch_list else 'list'}"
        self.shape = f"{resource.flag};protobuf" if protobuf else resource.flag
        """The identity of the warmwatch shape that serves it."""
        self.records: list[dict[str, Any]] = []
        self.condition = threading.Condition()
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        env = dict(os.environ)
        env["KUBE_FEATURE_WatchListClient"] = "true" if self.watch_list else "false"
        self.process = subprocess.Popen(
            [
                str(self.binary),
                f"--kubeconfig={self.kubeconfig}",
                f"--resource={self.resource.flag}",
                *(["--mode=typed", "--protobuf"] if self.protobuf else []),
                "-v=3",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        threading.Thread(target=self._read, daemon=True, name=self.name).start()

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        with self.log_path.open("a") as log:
            for raw in self.process.stdout:
                log.write(raw)
                line = raw.strip()
                record: dict[str, Any] | None = None
                if line.startswith("{"):
                    with contextlib.suppress(ValueError):
                        record = json.loads(line)
                elif "Listing and watching" in line:
                    record = {"kind": "list-marker"}
                if record is not None:
                    with self.condition:
                        self.records.append(record)
                        self.condition.notify_all()
        with self.condition:
            self.condition.notify_all()

    def synced(self) -> bool:
        with self.condition:
            return any(record.get("kind") == "synced" for record in self.records)

    def digest(self, timeout: float = 10) -> list[Item] | None:
        """The informer's store now, or None (not synced, no answer in time)."""
        assert self.process is not None and self.process.stdin is not None
        if self.process.poll() is not None or not self.synced():
            return None
        with self.condition:
            seen = len(self.records)
        try:
            self.process.stdin.write("digest\n")
            self.process.stdin.flush()
        except OSError:
            return None
        deadline = time.monotonic() + timeout
        with self.condition:
            while True:
                for record in self.records[seen:]:
                    if record.get("kind") == "digest":
                        return [
                            Item(namespace=ns, name=name, rv=int(rv))
                            for ns, name, rv in record.get("items") or []
                        ]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self.condition.wait(remaining)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def check(self, relist_rvs: frozenset[int]) -> tuple[list[Violation], int, int]:
        """(violations, events checked, relists) of the event lines, see the module doc."""
        violations: list[Violation] = []
        store: dict[Key, int] = {}
        high: int | None = None
        lists = events = 0
        with self.condition:
            records = list(self.records)

        def report(rule: Rule, key: Key, detail: str, rvs: tuple[int, ...]) -> None:
            violations.append(
                Violation(rule=rule, client=self.name, detail=detail, key="/".join(key), rvs=rvs)
            )

        for record in records:
            if record.get("kind") == "list-marker":
                lists += 1
                continue
            if record.get("kind") != "event":
                continue
            events += 1
            key = (str(record["namespace"]), str(record["name"]))
            rv = int(record["rv"])
            kind = str(record["type"])
            if record.get("initial"):
                store[key] = rv
                continue
            previous = store.get(key)
            replay = bool(record.get("tombstone")) or (kind == "MODIFIED" and previous == rv)
            what = f"{kind} {'/'.join(key)}@{rv}"
            if previous is not None and rv < previous:
                report(
                    Rule.NO_TIME_TRAVEL,
                    key,
                    f"{what} after the object's RV {previous}",
                    (rv, previous),
                )
            elif previous is not None and rv == previous and not replay:
                report(Rule.UNIQUE, key, f"{what} received twice", (rv,))
            elif (
                not replay
                and lists <= 1
                and high is not None
                and (rv < high or (rv == high and not (kind == "DELETED" and rv in relist_rvs)))
            ):
                report(Rule.ORDERED, key, f"{what} after an event at RV {high}", (rv, high))
            if not replay:
                high = rv if high is None else max(high, rv)
            if kind == "DELETED":
                store.pop(key, None)
            else:
                store[key] = rv
        return violations, events, max(0, lists - 1)
