"""A real local control plane: etcd, kube-apiserver and kube-controller-manager on loopback.

    python -m loadtest.cluster up --dir DIR           # build (cached), start, wait for /readyz
    python -m loadtest.cluster up --dir DIR --node    # ... and a kubelet + containerd node
    python -m loadtest.cluster up --dir DIR --node --second-node   # ... two, and a scheduler
    python -m loadtest.cluster load-image --dir DIR IMAGE   # podman image -> the node
    python -m loadtest.cluster down --dir DIR         # stop everything, leave no process behind
    python -m loadtest.cluster stop-apiserver --dir DIR
    python -m loadtest.cluster start-apiserver --dir DIR
    python -m loadtest.cluster stop-controller-manager --dir DIR    # pause the harness's own
    python -m loadtest.cluster start-controller-manager --dir DIR   # ... and resume it
    python -m loadtest.cluster status --dir DIR
    python -m loadtest.cluster build                  # only build the binaries (kubelet too)
    python -m loadtest.cluster gen-gomod              # regenerate loadtest/k8sbuild/go.mod

``up`` writes ``DIR/admin.kubeconfig`` (group system:masters) and ``DIR/restricted.kubeconfig``
(authenticated, no RBAC grants). Ports, pids and paths live in ``DIR/state.json``; ``up`` on a DIR
whose processes stopped restarts them on the same data and ports. kube-controller-manager runs the
few controllers objects need without nodes (service accounts and their tokens, namespace
deletion, garbage collection), so Pods can be created (they stay Pending: there is no kubelet).
Tests that run their own kube-controller-manager (tests/e2e/test_kube_controller_manager.py)
pause the harness's with ``stop-controller-manager``: it stays stopped across
``stop-apiserver``/``start-apiserver`` until ``start-controller-manager`` (or ``up``).

With ``--node`` (loadtest/node.py) the plane also runs containerd and a kubelet registered as
the Ready node ``127.0.0.1``, and kube-controller-manager also runs the controllers pods need
(``NODE_CONTROLLERS``: StatefulSets, volume binding, the root-CA publisher, ...). Pods on it
use ``hostNetwork: true``, ``nodeName: 127.0.0.1`` (there is no scheduler) and images given
with ``load-image``. With ``--second-node`` a second node ``127.0.0.2`` joins, in a network
namespace of its own (loadtest/node.py says how the two are joined), and kube-scheduler runs:
pods without ``nodeName`` go where their host ports are free, as in a cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from loadtest import building, pki
from loadtest import node as node_module
from loadtest.ports import free_port

READY_TIMEOUT = 90.0
"""kube-apiserver needs ~5-15 s on 2 cores (post-start hooks, RBAC bootstrap); CI is slower."""

APISERVER_ATTEMPTS = 3
"""Starts of kube-apiserver before giving up: one that exits while starting (its start depends
on etcd answering within its own deadlines, which a loaded 2-core machine does not always
meet) is started again, its exit reported with the log's tail."""

SPAWN_TIMEOUT = 10.0
"""A started process has this long to exec its binary (milliseconds, unless the machine is
swamped)."""

STOP_TIMEOUT = 15.0
"""SIGTERM first, so etcd and the apiserver shut down cleanly; SIGKILL after this."""

CONTROLLER_MANAGER_QPS = 200
CONTROLLER_MANAGER_BURST = 400
"""kube-controller-manager's --kube-api-qps/--kube-api-burst (also loadtest.controllers')."""

CONTROLLERS = ("serviceaccount", "serviceaccount-token", "namespace", "garbagecollector")
"""What objects need without nodes."""

NODE_CONTROLLERS = (
    *CONTROLLERS,
    "root-ca-certificate-publisher-controller",  # pods mount kube-root-ca.crt
    "statefulset-controller",
    "replicaset-controller",
    "deployment-controller",
    "persistentvolume-binder-controller",
    "persistentvolume-protection-controller",
    "persistentvolumeclaim-protection-controller",
    "node-lifecycle-controller",
    "pod-garbage-collector-controller",
)
"""With ``--node``: what pods of Deployments and StatefulSets with volume claims need."""

NODE_CONTROLLER_FLAGS = ("--pvclaimbinder-sync-period=1s",)
"""A claim created beside its volume (one ``kubectl apply``) waits for the binder's next pass
over the claims: 15 s by default, which a test's pod would wait too."""

NODE_READY_TIMEOUT = 120.0
"""The node is Ready ~2 s after the kubelet starts on an idle machine; CI shares 2 cores."""

ETCD_COMPACTION_INTERVAL = os.environ.get("WARMWATCH_ETCD_COMPACTION_INTERVAL", "5m")
"""The apiserver compacts etcd this often (its default); fault tests shorten it."""


class ProcessExited(RuntimeError):
    """A component exited before it was ready."""


def _say(message: str) -> None:
    print(f"[cluster] {message}", file=sys.stderr, flush=True)


@dataclass(kw_only=True)
class State:
    """What ``up`` started, persisted in DIR/state.json so later commands find it."""

    etcd_port: int
    etcd_peer_port: int
    apiserver_port: int
    binaries: str
    full: bool
    pids: dict[str, int] = field(default_factory=dict)
    controller_manager_paused: bool = False
    """Set by ``stop_controller_manager``: ``start_apiserver`` leaves it stopped then."""
    node: bool = False
    """``up --node``: containerd and a kubelet run too (their ports below)."""
    kubelet_port: int = 0
    kubelet_healthz_port: int = 0
    second_node: bool = False
    """``up --second-node``: a second node and kube-scheduler run too."""
    second_kubelet_port: int = 0
    second_kubelet_healthz_port: int = 0


class ControlPlane:
    """The processes of one control plane directory. Also the pytest fixtures' handle."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory.resolve()
        self.pki = pki.Pki(directory=self.directory / "pki")
        self.logs = self.directory / "logs"

    # -- paths -----------------------------------------------------------------------------

    @property
    def admin_kubeconfig(self) -> Path:
        return self.directory / "admin.kubeconfig"

    @property
    def restricted_kubeconfig(self) -> Path:
        return self.directory / "restricted.kubeconfig"

    @property
    def state_file(self) -> Path:
        return self.directory / "state.json"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.state().apiserver_port}"

    @property
    def etcd_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.state().etcd_port}"

    def kubectl(self) -> Path:
        return Path(self.state().binaries) / "kubectl"

    def state(self) -> State:
        return State(**json.loads(self.state_file.read_text()))

    def _save(self, state: State) -> None:
        self.state_file.write_text(json.dumps(asdict(state), indent=2))

    # -- processes -------------------------------------------------------------------------

    def _alive(self, pid: int | None) -> bool:
        """True if ``pid`` runs and is one of ours (its command line names our directory)."""
        if not pid:
            return False
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        zombie = stat.rsplit(")", 1)[-1].split()[0] == "Z"
        return not zombie and str(self.directory).encode() in cmdline

    def _ours(self) -> Iterator[int]:
        """Every live process whose command line names this directory (strays included)."""
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                pid = int(entry.name)
                try:
                    argv0 = (entry / "cmdline").read_bytes().split(b"\0", 1)[0]
                except OSError:
                    continue
                if Path(argv0.decode(errors="replace")).name in _PROCESS_NAMES and self._alive(pid):
                    yield pid

    def _spawn(self, name: str, argv: list[str]) -> int:
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{name}.log", "ab") as log:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # outlives `up`; `down` stops it
                cwd=self.directory,
            )
        # Until the child has exec'd, /proc shows the harness's own command line, which does
        # not name the directory: _alive would call the new process dead and a second one
        # would be started beside it (found as "address already in use" on a busy machine).
        deadline = time.monotonic() + SPAWN_TIMEOUT
        while process.poll() is None and not self._alive(process.pid):
            if time.monotonic() > deadline:
                raise ProcessExited(f"{name}: not started after {SPAWN_TIMEOUT:.0f}s")
            time.sleep(0.005)
        return process.pid

    def _stop(self, pid: int) -> None:
        if not self._alive(pid):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        while self._alive(pid) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.1)
        if self._alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            while self._alive(pid):
                _reap(pid)
                time.sleep(0.05)
        _reap(pid)

    # -- components ------------------------------------------------------------------------

    def _start_etcd(self, state: State) -> None:
        if self._alive(state.pids.get("etcd")):
            return
        peer = f"http://127.0.0.1:{state.etcd_peer_port}"
        client = f"http://127.0.0.1:{state.etcd_port}"
        state.pids["etcd"] = self._spawn(
            "etcd",
            [
                str(Path(state.binaries) / "etcd"),
                "--name=default",
                f"--data-dir={self.directory / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                "--listen-metrics-urls=",
                "--quota-backend-bytes=8589934592",
                # Tests create tens of thousands of objects; durability across an OS crash of
                # the test machine is not something they need.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self._save(state)
        _wait_for(lambda: _tcp_open(state.etcd_port), what="etcd", timeout=30)

    def _apiserver_argv(self, state: State) -> list[str]:
        if not state.full:
            return [
                str(Path(state.binaries) / "apiextensions-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{state.etcd_port}",
                "--bind-address=127.0.0.1",
                f"--secure-port={state.apiserver_port}",
                f"--tls-cert-file={self.pki.serving_cert}",
                f"--tls-private-key-file={self.pki.serving_key}",
                f"--client-ca-file={self.pki.ca_cert}",
                "--authentication-skip-lookup",
                "--authorization-always-allow-paths=/*",
                f"--cert-dir={self.directory / 'pki'}",
            ]
        return [
            str(Path(state.binaries) / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{state.etcd_port}",
            f"--etcd-compaction-interval={ETCD_COMPACTION_INTERVAL}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={state.apiserver_port}",
            f"--tls-cert-file={self.pki.serving_cert}",
            f"--tls-private-key-file={self.pki.serving_key}",
            f"--client-ca-file={self.pki.ca_cert}",
            f"--service-account-key-file={self.pki.service_account_pub}",
            f"--service-account-signing-key-file={self.pki.service_account_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--api-audiences=https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--authorization-mode=RBAC",
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            # JSON in etcd, so the fault tests' reference history can read etcd's own watch
            # (the ground truth, which survives apiserver restarts) without protobuf decoding.
            "--storage-media-type=application/json",
            # Load tests write thousands of objects a second from one identity.
            "--max-requests-inflight=2000",
            "--max-mutating-requests-inflight=1000",
            f"--cert-dir={self.directory / 'pki'}",
            "--v=1",
        ]

    def _start_apiserver(self, state: State) -> None:
        """Start kube-apiserver (at most ``APISERVER_ATTEMPTS`` times) and wait for /readyz."""
        log = self.logs / "kube-apiserver.log"
        for attempt in range(1, APISERVER_ATTEMPTS + 1):
            if not self._alive(state.pids.get("kube-apiserver")):
                state.pids["kube-apiserver"] = self._spawn(
                    "kube-apiserver", self._apiserver_argv(state)
                )
                self._save(state)
            try:
                _wait_for(
                    self._ready,
                    what="kube-apiserver /readyz",
                    timeout=READY_TIMEOUT,
                    alive=lambda: self._alive(state.pids.get("kube-apiserver")),
                    log=log,
                )
                return
            except ProcessExited as exited:
                if attempt == APISERVER_ATTEMPTS:
                    raise
                _say(f"kube-apiserver exited while starting (attempt {attempt}):\n{exited}")

    def _start_controller_manager(self, state: State) -> None:
        if (
            not state.full
            or state.controller_manager_paused
            or self._alive(state.pids.get("kube-controller-manager"))
        ):
            return
        state.pids["kube-controller-manager"] = self._spawn(
            "kube-controller-manager",
            [
                str(Path(state.binaries) / "kube-controller-manager"),
                f"--kubeconfig={self.admin_kubeconfig}",
                f"--controllers={','.join(NODE_CONTROLLERS if state.node else CONTROLLERS)}",
                f"--service-account-private-key-file={self.pki.service_account_key}",
                f"--root-ca-file={self.pki.ca_cert}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                f"--kube-api-qps={CONTROLLER_MANAGER_QPS}",
                f"--kube-api-burst={CONTROLLER_MANAGER_BURST}",
                *(NODE_CONTROLLER_FLAGS if state.node else ()),
                "--v=1",
            ],
        )
        self._save(state)

    def _ready(self) -> bool:
        return self._get("/readyz")[0] == 200

    # -- commands --------------------------------------------------------------------------

    @property
    def node(self) -> node_module.Node:
        return self.node_named(node_module.NODE_NAME)

    def node_named(self, name: str) -> node_module.Node:
        return node_module.Node(
            directory=self.directory,
            spawn=self._spawn,
            stop=self._stop,
            alive=self._alive,
            name=name,
        )

    def nodes(self) -> list[node_module.Node]:
        """The plane's nodes, the first first."""
        state = self.state()
        names = [node_module.NODE_NAME] if state.node else []
        names += [node_module.SECOND_NODE_NAME] if state.second_node else []
        return [self.node_named(name) for name in names]

    def up(self, *, node: bool = False, second_node: bool = False) -> None:
        node = node or second_node
        self.directory.mkdir(parents=True, exist_ok=True)
        binaries = building.ensure_binaries()
        if self.state_file.exists():
            state = self.state()
            if not Path(state.binaries).exists():  # cache rebuilt elsewhere: same version
                state.binaries = str(binaries.directory)
        else:
            state = State(
                etcd_port=free_port(),
                etcd_peer_port=free_port(),
                apiserver_port=free_port(),
                binaries=str(binaries.directory),
                full=binaries.full,
            )
            self._save(state)
        state.controller_manager_paused = False  # `up` brings every component up
        if node and not state.node:
            state.node = True
            state.kubelet_port = free_port()
            state.kubelet_healthz_port = free_port()
            # a running kube-controller-manager lacks the controllers pods need: restarted
            self._stop(state.pids.pop("kube-controller-manager", 0))
        if second_node and not state.second_node:
            state.second_node = True
            state.second_kubelet_port = free_port()
            state.second_kubelet_healthz_port = free_port()
        self._save(state)
        pki.create(self.pki.directory)
        server = f"https://127.0.0.1:{state.apiserver_port}"
        pki.write_kubeconfig(
            path=self.admin_kubeconfig, pki=self.pki, identity="admin", server=server
        )
        pki.write_kubeconfig(
            path=self.restricted_kubeconfig, pki=self.pki, identity="restricted", server=server
        )
        started = time.monotonic()
        try:
            self._start_etcd(state)
            self._start_apiserver(state)
            self._start_controller_manager(state)
            if state.node:
                self._start_node(state, node_module.NODE_NAME)
            if state.second_node:
                self._start_node(state, node_module.SECOND_NODE_NAME)
                self._start_scheduler(state)
        except BaseException:
            self.down()
            raise
        _say(
            f"control plane ready at {server} in {time.monotonic() - started:.1f}s"
            + ("" if state.full else " (FALLBACK: CRDs only, no core resources)")
        )

    def _start_node(self, state: State, name: str) -> None:
        started = time.monotonic()
        node = self.node_named(name)
        if name == node_module.NODE_NAME:
            ports = {"kubelet": state.kubelet_port, "healthz": state.kubelet_healthz_port}
            relays: list[node_module.Relay] = []
        else:
            ports = {
                "kubelet": state.second_kubelet_port,
                "healthz": state.second_kubelet_healthz_port,
            }
            relays = node_module.second_node_relays(
                apiserver_port=state.apiserver_port, kubelet_port=state.second_kubelet_port
            )
        node.start(
            pids=state.pids,
            binaries=building.ensure_node_binaries(),
            kubeconfig=self.admin_kubeconfig,
            ports=ports,
            relays=relays,
        )
        self._save(state)
        _wait_for(
            lambda: self._node_ready(name),
            what=f"node {name} Ready",
            timeout=NODE_READY_TIMEOUT,
            alive=lambda: self._alive(state.pids.get(node.key("kubelet"))),
            log=self.logs / f"{node.key('kubelet')}.log",
        )
        _say(f"node {name} Ready in {time.monotonic() - started:.1f}s")

    def _start_scheduler(self, state: State) -> None:
        if self._alive(state.pids.get("kube-scheduler")):
            return
        state.pids["kube-scheduler"] = self._spawn(
            "kube-scheduler",
            [
                str(building.ensure_node_binaries() / "kube-scheduler"),
                f"--kubeconfig={self.admin_kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                "--v=1",
            ],
        )
        self._save(state)

    def _get(self, path: str) -> tuple[int, bytes]:
        """GET ``path`` from the apiserver as admin: status and body (0 when unreachable)."""
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        admin = self.pki.identity("admin")
        context.load_cert_chain(str(admin.certificate), str(admin.key))
        connection = http.client.HTTPSConnection(
            "127.0.0.1", self.state().apiserver_port, context=context, timeout=5
        )
        try:
            connection.request("GET", path)
            answer = connection.getresponse()
            return answer.status, answer.read()
        except OSError:
            return 0, b""
        finally:
            connection.close()

    def _node_ready(self, name: str) -> bool:
        status, body = self._get(f"/api/v1/nodes/{name}")
        if status != 200:
            return False
        conditions = json.loads(body).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def load_image(self, image: str) -> None:
        """Import ``image`` from podman's store into each node's containerd."""
        for node in self.nodes():
            node.load_image(image)

    def _delete_pods(self) -> None:
        """Every pod, at once: the kubelet stops their containers and unmounts their volumes."""
        kubectl = [str(self.kubectl()), f"--kubeconfig={self.admin_kubeconfig}"]
        for workloads in ("statefulsets,deployments,replicasets", "pods"):
            subprocess.run(
                [*kubectl, "delete", workloads, "--all", "-A", "--wait=false"],
                capture_output=True,
                timeout=60,
                check=False,
            )
        _wait_for(
            lambda: json.loads(self._get("/api/v1/pods")[1] or b'{"items": []}')["items"] == [],
            what="pods deleted",
            timeout=60,
        )

    def stop_apiserver(self) -> None:
        state = self.state()
        for name in ("kube-controller-manager", "kube-apiserver"):
            self._stop(state.pids.pop(name, 0))
        self._save(state)

    def start_apiserver(self) -> None:
        state = self.state()
        self._start_apiserver(state)
        self._start_controller_manager(state)

    def stop_controller_manager(self) -> None:
        """Pause the harness's kube-controller-manager (a test runs its own): it stays stopped,
        also across ``stop_apiserver``/``start_apiserver``, until ``start_controller_manager``
        or ``up``."""
        state = self.state()
        state.controller_manager_paused = True
        self._stop(state.pids.pop("kube-controller-manager", 0))
        self._save(state)

    def start_controller_manager(self) -> None:
        """Resume the harness's kube-controller-manager (a no-op while it runs). While the
        apiserver is stopped it only clears the pause: ``start_apiserver`` starts it."""
        state = self.state()
        state.controller_manager_paused = False
        self._save(state)
        if self._alive(state.pids.get("kube-apiserver")):
            self._start_controller_manager(state)

    def down(self) -> None:
        if self.state_file.exists():
            state = self.state()
            self._stop(state.pids.pop("kube-scheduler", 0))
            apiserver_up = self._alive(state.pids.get("kube-apiserver"))
            for node in reversed(self.nodes()):
                node.stop(pids=state.pids, delete_pods=self._delete_pods if apiserver_up else None)
                self._save(state)
            for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
                self._stop(state.pids.pop(name, 0))
            self._save(state)
        for pid in list(self._ours()):  # strays from a crashed `up`
            self._stop(pid)

    def status(self) -> dict[str, bool]:
        state = self.state()
        return {name: self._alive(pid) for name, pid in state.pids.items()}


_PROCESS_NAMES = {
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "apiextensions-apiserver",
    "kubelet",
    "kube-scheduler",
    "containerd",
    "containerd-shim-runc-v2",
    "nsenter",
    "socat",
}


def _reap(pid: int) -> None:
    """Collect ``pid`` if it is our child (tests start the plane in-process)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _tcp_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _wait_for(
    check: object,
    *,
    what: str,
    timeout: float,
    alive: object = None,
    log: Path | None = None,
) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if callable(alive) and not alive():
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            raise ProcessExited(f"{what}: process exited\n{tail}")
        time.sleep(0.2)
    raise TimeoutError(f"{what} not ready after {timeout:.0f}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name in (
        "up",
        "down",
        "stop-apiserver",
        "start-apiserver",
        "stop-controller-manager",
        "start-controller-manager",
        "status",
    ):
        commands.add_parser(name).add_argument("--dir", required=True, type=Path)
    commands.choices["up"].add_argument(
        "--node", action="store_true", help="also run containerd and a kubelet (a Ready node)"
    )
    commands.choices["up"].add_argument(
        "--second-node",
        action="store_true",
        help="with --node: a second node in its own network namespace, and kube-scheduler",
    )
    load_image = commands.add_parser("load-image")
    load_image.add_argument("--dir", required=True, type=Path)
    load_image.add_argument("image")
    commands.add_parser("build")
    commands.add_parser("gen-gomod")
    args = parser.parse_args(argv)
    if args.command == "build":
        print(building.ensure_binaries().directory)
        # `make test` builds here, before pytest's per-test timeout runs: the node tests'
        # kubelet too (~70 s once, with the control plane's Go build cache)
        print(building.ensure_node_binaries())
        return 0
    if args.command == "gen-gomod":
        building.generate_gomod()
        return 0
    plane = ControlPlane(args.dir)
    if args.command == "up":
        plane.up(node=args.node, second_node=args.second_node)
        print(f"export KUBECONFIG={plane.admin_kubeconfig}")
    elif args.command == "load-image":
        plane.load_image(args.image)
    elif args.command == "down":
        plane.down()
    elif args.command == "stop-apiserver":
        plane.stop_apiserver()
    elif args.command == "start-apiserver":
        plane.start_apiserver()
    elif args.command == "stop-controller-manager":
        plane.stop_controller_manager()
    elif args.command == "start-controller-manager":
        plane.start_controller_manager()
    elif args.command == "status":
        print(json.dumps(plane.status()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
