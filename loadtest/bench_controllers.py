"""kube-controller-manager's time-to-synced, directly and through warmwatch, side by side.

    python -m loadtest.bench_controllers --dir /tmp/warmwatch-bench-kcm \\
        [--deployments 1000] [--replicas 2] [--configmaps 20000] [--runs 3] [--keep]

Starts its own control plane in DIR/cp and pauses its kube-controller-manager; a
kube-controller-manager with the test controller set (loadtest.controllers.TEST_CONTROLLERS:
workload controllers, garbage collector, service accounts, namespaces) then creates the load:
DEPLOYMENTS Deployments of REPLICAS Pods each (their ReplicaSets and Pods; Pods stay Pending,
there is no kubelet) and CONFIGMAPS ConfigMaps of 1 KiB, which its informers and the garbage collector's
metadata monitors must list. Then, RUNS times, each measurement next to its direct twin:

- cold start: directly against the apiserver, and through a warmwatch on a fresh database (it
  fills every collection the controllers ask for while they wait);
- restart, warmwatch kept running: the controller-manager alone restarts (a container restart);
- restart, warmwatch restarted too on its database (the pod restarts): warm from disk.

"Time-to-synced" is seconds from process start until every controller's informer caches and
the garbage collector's monitors are synced (loadtest.controllers.ControllerManager
.wait_synced). Prints one markdown table of medians to stdout; progress goes to stderr.
Nothing is asserted (this is a measurement, not a test).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from loadtest import controllers, kubeapi
from loadtest.cluster import ControlPlane
from loadtest.controllers import ControllerManager
from loadtest.sidecar import Sidecar

NAMESPACE = "bench-kcm"
SYNC_TIMEOUT = 600.0


def _say(message: str) -> None:
    print(f"[bench-kcm] {message}", file=sys.stderr, flush=True)


@dataclass
class Bench:
    plane: ControlPlane
    directory: Path
    runs: dict[str, list[float]] = field(default_factory=dict)
    _started: int = 0

    def kcm(self, kubeconfig: Path, label: str) -> ControllerManager:
        self._started += 1
        return ControllerManager.start(
            binaries=Path(self.plane.state().binaries),
            kubeconfig=kubeconfig,
            service_account_key=self.plane.pki.service_account_key,
            root_ca=self.plane.pki.ca_cert,
            log=self.directory / "logs" / f"kcm-{self._started:02d}-{label}.log",
        )

    def time_to_synced(self, kubeconfig: Path, label: str) -> float:
        kcm = self.kcm(kubeconfig, label)
        try:
            seconds = kcm.wait_synced(SYNC_TIMEOUT)
        finally:
            kcm.stop()
        self.runs.setdefault(label, []).append(seconds)
        _say(f"{label}: synced in {seconds:.2f} s")
        return seconds

    def sidecar(self, db: Path) -> Sidecar:
        return Sidecar.start(upstream_kubeconfig=self.plane.admin_kubeconfig, db=db)


async def _create_load(
    plane: ControlPlane, *, deployments: int, replicas: int, configmaps: int
) -> None:
    async with kubeapi.RawClient(
        base_url=plane.server,
        concurrency=32,
        ssl_context=kubeapi.client_ssl(plane.pki, identity="admin"),
    ) as api:
        await kubeapi.ensure_namespace(api, NAMESPACE)
        path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"
        await api.gather(
            api.ensure(path, controllers.deployment(f"web-{i:05d}", replicas=replicas))
            for i in range(deployments)
        )
        have = len((await api.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps"))["items"])
        if have < configmaps:
            await kubeapi.create_configmaps(
                api, namespace=NAMESPACE, count=configmaps, size=1024, prefix="load"
            )


async def _count_pods(plane: ControlPlane) -> int:
    async with kubeapi.RawClient(
        base_url=plane.server, ssl_context=kubeapi.client_ssl(plane.pki, identity="admin")
    ) as api:
        pods = await api.get(f"/api/v1/namespaces/{NAMESPACE}/pods")
        return len(pods["items"])


def create_load(bench: Bench, *, deployments: int, replicas: int, configmaps: int) -> None:
    """The objects, with the ReplicaSets and Pods a kube-controller-manager made for them."""
    _say(
        f"load: {deployments} Deployments x {replicas} Pods, {configmaps} ConfigMaps "
        f"in namespace {NAMESPACE} ..."
    )
    kcm = bench.kcm(bench.plane.admin_kubeconfig, "setup")
    try:
        asyncio.run(
            _create_load(
                bench.plane, deployments=deployments, replicas=replicas, configmaps=configmaps
            )
        )
        want = deployments * replicas
        deadline = time.monotonic() + 900
        while (have := asyncio.run(_count_pods(bench.plane))) < want:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {have} of {want} Pods after 900 s")
            if not kcm.running:
                raise RuntimeError(f"setup kube-controller-manager exited:\n{kcm.tail()}")
            time.sleep(2)
        _say(f"load ready: {have} Pods")
    finally:
        kcm.stop()


def measure(bench: Bench, run: int) -> None:
    """One run: every scenario next to its direct twin."""
    direct = bench.plane.admin_kubeconfig
    db = bench.directory / f"warmwatch-run{run}.db"
    for stale in bench.directory.glob(f"{db.name}*"):
        stale.unlink()
    for stale in bench.directory.glob(f"{db.stem}.log"):
        stale.unlink()

    bench.time_to_synced(direct, "cold-direct")
    sidecar = bench.sidecar(db)
    try:
        bench.time_to_synced(sidecar.kubeconfig, "cold-via")
        bench.time_to_synced(direct, "restart-kcm-direct")
        bench.time_to_synced(sidecar.kubeconfig, "restart-kcm-via")
        sidecar.stop()
        bench.time_to_synced(direct, "restart-both-direct")
        sidecar.restart()
        bench.time_to_synced(sidecar.kubeconfig, "restart-both-via")
    finally:
        sidecar.stop()


ROWS: list[tuple[str, str, str]] = [
    ("cold start (warmwatch: fresh database)", "cold-direct", "cold-via"),
    (
        "restart: controller-manager only (warmwatch kept running)",
        "restart-kcm-direct",
        "restart-kcm-via",
    ),
    (
        "restart: controller-manager and warmwatch (same database)",
        "restart-both-direct",
        "restart-both-via",
    ),
]


def table(runs: dict[str, list[float]], *, count: int) -> list[str]:
    def median(label: str) -> float:
        return statistics.median(runs[label])

    lines = [
        f"| kube-controller-manager time-to-synced (median of {count}) | direct s | "
        "via warmwatch s | ratio via/direct |",
        "|---|---|---|---|",
    ]
    for title, direct, via in ROWS:
        d, v = median(direct), median(via)
        lines.append(f"| {title} | {d:.2f} | {v:.2f} | {v / d:.2f}x |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_controllers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dir", type=Path, default=Path("/tmp/warmwatch-bench-kcm"))
    parser.add_argument("--deployments", type=int, default=1000)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--configmaps", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="leave the control plane running")
    args = parser.parse_args(argv)

    args.dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(args.dir / "logs", ignore_errors=True)  # one run's logs: DIR/logs/kcm-*.log
    plane = ControlPlane(args.dir / "cp")
    plane.up()
    plane.stop_controller_manager()  # ours run the same controllers; one at a time
    bench = Bench(plane=plane, directory=args.dir.resolve())
    try:
        create_load(
            bench,
            deployments=args.deployments,
            replicas=args.replicas,
            configmaps=args.configmaps,
        )
        for run in range(1, args.runs + 1):
            _say(f"run {run} of {args.runs}")
            measure(bench, run)
    finally:
        if args.keep:
            plane.start_controller_manager()
        else:
            plane.down()
            shutil.rmtree(args.dir / "cp", ignore_errors=True)
    for label, samples in bench.runs.items():
        _say(f"{label}: " + ", ".join(f"{s:.2f}" for s in samples))
    print("\n".join(table(bench.runs, count=args.runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
