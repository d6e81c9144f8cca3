"""A real node for the local control plane: containerd and a kubelet on loopback, registered as
the Ready node ``127.0.0.1`` (``python -m loadtest.cluster up --dir DIR --node``).

Everything lives under ``DIR/node``: containerd's root, state and socket, the kubelet's root
and certificates, pod logs, the CNI configuration. What the machines of this project force
(cgroup v1 without systemd, no registry, no pod network; see the settings' comments):

- pods run with ``hostNetwork: true`` only. The CNI configuration holds the ``loopback`` plugin
  alone (the kubelet reports NotReady without one); no bridge, no address range.
- images come from ``load-image`` (``podman save`` | ``ctr -n k8s.io images import``), pods use
  ``imagePullPolicy: Never``; the pause image is built from the release's pause.c.
- the kubelet uses the admin identity, listens on 127.0.0.1 with anonymous access (the
  apiserver fetches logs and runs exec without a client certificate) and touches no iptables.

``down`` deletes the pods (so the kubelet stops their containers and unmounts their volumes),
stops the kubelet, kills what containerd's shims still run, stops containerd, and removes the
mounts under DIR, the cgroup directories containerd made and the files the kubelet leaves in
system paths: ``leftovers()`` lists whatever is still there (the e2e test asserts it is
empty).

A second node (``up --node --second-node``), for what needs two pods of one template at once
(a Deployment's rollout): hostNetwork pods of one template take the same host ports, so two
of them never fit one node. The second node, ``127.0.0.2``, runs its own containerd and kubelet
in a network namespace of its own that holds only a loopback: its pods bind the same ports as
the first node's without meeting them. No bridge and no address range joins the two
loopbacks; ``Relay`` pairs of ``socat`` do, over unix sockets in ``DIR/node-127.0.0.2/relays``
(the file system is shared, the network is not), each for one port at one node's address:
the apiserver's port and the peer ports (``PEER_PORTS``) at ``127.0.0.1`` inside the
namespace, the kubelet's port and the peer ports at ``127.0.0.2`` on the host. A pod
listening on a peer port binds its pod IP (its node's address), never the wildcard: inside the
namespace ``127.0.0.1`` on those ports is the first node. kube-scheduler then places pods by
their declared host ports, as it does in a cluster.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtest import images

NODE_NAME = "127.0.0.1"
"""``--hostname-override``: the node's name is its InternalIP, so the apiserver reaches the
kubelet (logs, exec) on loopback. ``--node-ip`` refuses a loopback address."""

SECOND_NODE_NAME = "127.0.0.2"
"""The second node's name and address: inside its namespace its kubelet listens there (every
``127/8`` address is the loopback's), and a relay on the host's ``127.0.0.2`` reaches it."""

PEER_PORTS = (9091,)
"""Ports the pods of one workload on the two nodes reach each other on, at the node's
address: warmwatch's seeding listener (deploy/component)."""

NETNS_DIR = Path("/run/netns")
"""Where ``ip netns add`` keeps a named namespace (a bind mount of its ``/proc/*/ns/net``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Relay:
    """``address:port`` of one side reachable at the same ``address:port`` on the other: a
    ``socat`` listening there forwards each connection over ``socket`` (a unix socket, which
    both network namespaces see) to a ``socat`` on the far side that connects to it."""

    address: str
    port: int
    inward: bool
    """True: listens on the host, reaches into the node's namespace; False: the reverse."""

    @property
    def name(self) -> str:
        return f"{'in' if self.inward else 'out'}-{self.address}-{self.port}"


CGROUP_PARENT = "k8s.io"
"""Where runc puts the containers' cgroups (under every hierarchy): containerd's namespace."""

SYSTEM_PATHS = (Path("/var/log/containers"), Path("/var/lib/kubelet/device-plugins"))
"""Created by the kubelet whatever its flags: emptied of what points at DIR and of the
kubelet's own files (``KUBELET_FILES``), then removed when empty."""

KUBELET_FILES = ("kubelet.sock", "kubelet_internal_checkpoint", "DEPRECATION")
"""What the kubelet's device manager writes into /var/lib/kubelet/device-plugins."""


def _mounts() -> list[str]:
    return [
        line.split()[4].replace("\\040", " ")
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
    ]


def _cgroup_dirs() -> list[Path]:
    root = Path("/sys/fs/cgroup")
    found = []
    for hierarchy in sorted(root.iterdir()) if root.exists() else []:
        if (hierarchy / CGROUP_PARENT).is_dir():
            found.append(hierarchy / CGROUP_PARENT)
    return found


def second_node_relays(*, apiserver_port: int, kubelet_port: int) -> list[Relay]:
    """What joins the second node to the host: its kubelet and pods reach the apiserver and
    the first node's pods at ``127.0.0.1``; the apiserver (logs, exec) and the first node's
    pods reach the second node at its address."""
    return [
        Relay(address=NODE_NAME, port=apiserver_port, inward=False),
        Relay(address=SECOND_NODE_NAME, port=kubelet_port, inward=True),
        *(
            Relay(address=address, port=port, inward=address == SECOND_NODE_NAME)
            for port in PEER_PORTS
            for address in (NODE_NAME, SECOND_NODE_NAME)
        ),
    ]


class Node:
    """containerd + kubelet of one control plane directory: the first node (``NODE_NAME``) on
    the host's network, a second one (``SECOND_NODE_NAME``) in a namespace of its own."""

    def __init__(
        self,
        *,
        directory: Path,
        spawn: Callable[[str, list[str]], int],
        stop: Callable[[int], None],
        alive: Callable[[int | None], bool],
        name: str = NODE_NAME,
    ) -> None:
        self.name = name
        first = name == NODE_NAME
        self.directory = directory / ("node" if first else f"node-{name}")
        self.netns = (
            None
            if first
            else f"warmwatch-{hashlib.sha256(str(directory).encode()).hexdigest()[:12]}"
        )
        """The namespace's name in ``NETNS_DIR``: one per control plane directory."""
        self._spawn = spawn
        self._stop = stop
        self._alive = alive

    def key(self, process: str) -> str:
        """The process's key in the plane's pids (and its log's name)."""
        return process if self.netns is None else f"{process}@{self.name}"

    def inside(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run in the node's network namespace (only that namespace: the mounts the
        kubelet makes must be seen by containerd, so not ``ip netns exec``'s own)."""
        if self.netns is None:
            return list(argv)
        return ["nsenter", f"--net={NETNS_DIR / self.netns}", "--", *argv]

    # -- paths -----------------------------------------------------------------------------

    @property
    def socket(self) -> Path:
        return self.directory / "containerd" / "containerd.sock"

    @property
    def containerd_state(self) -> Path:
        return self.directory / "containerd" / "state"

    def ctr(self, *args: str) -> list[str]:
        return ["ctr", f"--address={self.socket}", "--namespace=k8s.io", *args]

    # -- configuration ---------------------------------------------------------------------

    def _containerd_config(self) -> Path:
        base = self.directory / "containerd"
        cni = self.directory / "cni"
        cni.mkdir(parents=True, exist_ok=True)
        (cni / "10-loopback.conf").write_text(
            json.dumps({"cniVersion": "1.0.0", "name": "loopback", "type": "loopback"})
        )
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config = f"""\
version = 2
root = "{base / "root"}"
state = "{self.containerd_state}"
[grpc]
  address = "{self.socket}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{base / "opt"}"
[{cri}]
  sandbox_image = "{images.PAUSE_IMAGE}"
  # no AppArmor profiles on the test machines
  disable_apparmor = true
  # the VM lacks CAP_SYS_RESOURCE: runc cannot lower the pause container's oom_score_adj
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
[{cri}.cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "{cni}"
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  # no systemd on the test machines: cgroupfs, as the kubelet's cgroupDriver
  SystemdCgroup = false
"""
        path = base / "config.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(config)
        return path

    def _kubelet_config(self, *, port: int, healthz_port: int) -> Path:
        kubelet = self.directory / "kubelet"
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.name,
            "port": port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": healthz_port,
            # the apiserver has no kubelet client certificate: logs and exec come anonymously
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            # cgroup v1 host without systemd (the kubelet refuses cgroup v1 since 1.35 unless)
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": ["none"],
            "failSwapOn": False,
            # the host's iptables stay as they were
            "makeIPTablesUtilChains": False,
            # a shared test disk must neither evict pods nor delete the imported images
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "podLogsDir": str(self.directory / "pod-logs"),
            "volumePluginDir": str(kubelet / "volume-plugins"),
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "registerNode": True,
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
        }
        path = kubelet / "config.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(config, indent=2))
        return path

    # -- lifecycle -------------------------------------------------------------------------

    def start(
        self,
        *,
        pids: dict[str, int],
        binaries: Path,
        kubeconfig: Path,
        ports: dict[str, int],
        relays: Sequence[Relay] = (),
    ) -> None:
        """Start the namespace and its relays (a second node), containerd (and import the
        pause image into it) and the kubelet."""
        images.ensure_packages()
        images.ensure_pause()
        if self.netns is not None:
            self._start_namespace(pids=pids, relays=relays)
        if not self._alive(pids.get(self.key("containerd"))):
            config = self._containerd_config()
            pids[self.key("containerd")] = self._spawn(
                self.key("containerd"), self.inside(["containerd", f"--config={config}"])
            )
            _wait(lambda: self._ctr_ok(), what="containerd", timeout=30)
        if not self._has_image(images.PAUSE_IMAGE):
            self.load_image(images.PAUSE_IMAGE)
        if not self._alive(pids.get(self.key("kubelet"))):
            kubelet = self.directory / "kubelet"
            config = self._kubelet_config(port=ports["kubelet"], healthz_port=ports["healthz"])
            pids[self.key("kubelet")] = self._spawn(
                self.key("kubelet"),
                self.inside(
                    [
                        str(binaries / "kubelet"),
                        f"--config={config}",
                        f"--kubeconfig={kubeconfig}",
                        f"--root-dir={kubelet / 'root'}",
                        f"--cert-dir={kubelet / 'pki'}",
                        f"--hostname-override={self.name}",
                        "--v=1",
                    ]
                ),
            )

    def _start_namespace(self, *, pids: dict[str, int], relays: Sequence[Relay]) -> None:
        """The namespace with its loopback up, then each relay: the side that connects
        first (its unix socket must exist before the listening side forwards to it)."""
        assert self.netns is not None
        if not (NETNS_DIR / self.netns).exists():
            subprocess.run(["ip", "netns", "add", self.netns], check=True)
        subprocess.run(
            self.inside(["ip", "link", "set", "lo", "up"]), check=True, capture_output=True
        )
        directory = self.directory / "relays"
        directory.mkdir(parents=True, exist_ok=True)
        for relay in relays:
            socket = directory / f"{relay.name}.sock"
            if len(str(socket)) > 107:
                raise ValueError(f"unix socket path too long: {socket}")
            tcp = f"{relay.address}:{relay.port}"
            connect = ["socat", f"UNIX-LISTEN:{socket},fork,unlink-early,mode=600", f"TCP:{tcp}"]
            listen = [
                "socat",
                f"TCP-LISTEN:{relay.port},bind={relay.address},fork,reuseaddr",
                f"UNIX-CONNECT:{socket}",
            ]
            if relay.inward:
                connect = self.inside(connect)
            else:
                listen = self.inside(listen)
            for side, argv in (("connect", connect), ("listen", listen)):
                key = self.key(f"relay-{relay.name}-{side}")
                if not self._alive(pids.get(key)):
                    pids[key] = self._spawn(key, argv)
                if side == "connect":
                    _wait(socket.exists, what=f"relay {relay.name}", timeout=10)

    def _ctr_ok(self) -> bool:
        return self.socket.exists() and _succeeds(self.ctr("version"))

    def _has_image(self, image: str) -> bool:
        listed = subprocess.run(
            self.ctr("images", "list", "-q"), capture_output=True, text=True, check=False
        ).stdout
        return image in listed.split()

    def load_image(self, image: str) -> None:
        """``podman save --format docker-archive IMAGE | ctr -n k8s.io images import -``."""
        saved = images.save(image)
        assert saved.stdout is not None
        try:
            subprocess.run(
                self.ctr("images", "import", "--no-unpack=false", "-"),
                stdin=saved.stdout,
                check=True,
                stdout=subprocess.DEVNULL,
            )
        finally:
            saved.stdout.close()
            if saved.wait() != 0:
                raise RuntimeError(f"{images.builder()} save {image} failed")

    def stop(self, *, pids: dict[str, int], delete_pods: Callable[[], None] | None) -> None:
        """Everything the node started ends; nothing of it stays behind (``leftovers``)."""
        if delete_pods is not None and self._alive(pids.get(self.key("kubelet"))):
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                delete_pods()
        self._stop(pids.pop(self.key("kubelet"), 0))
        if self._alive(pids.get(self.key("containerd"))):
            self._remove_sandboxes()
        for pid in self._shim_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._stop(pids.pop(self.key("containerd"), 0))
        for key in [k for k in pids if k.startswith("relay-") and k.endswith(f"@{self.name}")]:
            # what a relay forked for a connection still open is a stray: ``down`` ends it
            self._stop(pids.pop(key))
        self._clean()
        if self.netns is not None and (NETNS_DIR / self.netns).exists():
            subprocess.run(["ip", "netns", "delete", self.netns], check=False)

    def _remove_sandboxes(self) -> None:
        """Kill every task containerd runs and remove it with its container (containerd
        unmounts their root filesystems)."""
        tasks = subprocess.run(
            self.ctr("tasks", "list", "-q"), capture_output=True, text=True, check=False
        ).stdout.split()
        for task in tasks:
            _succeeds(self.ctr("tasks", "kill", "--all", "--signal=SIGKILL", task))
        for task in tasks:
            _succeeds(self.ctr("tasks", "delete", "--force", task))
        containers = subprocess.run(
            self.ctr("containers", "list", "-q"), capture_output=True, text=True, check=False
        ).stdout.split()
        for container in containers:
            _succeeds(self.ctr("containers", "delete", container))

    def _shim_pids(self) -> Iterator[int]:
        """The shims' and containers' pids (each bundle holds ``shim.pid``/``init.pid``)."""
        tasks = self.containerd_state / "io.containerd.runtime.v2.task"
        for name in ("init.pid", "shim.pid"):
            for pidfile in tasks.glob(f"*/*/{name}") if tasks.exists() else []:
                with contextlib.suppress(OSError, ValueError):
                    yield int(pidfile.read_text().strip())

    def _clean(self) -> None:
        for mount in sorted(_mounts(), key=len, reverse=True):
            if mount.startswith(f"{self.directory}/"):
                subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
        for cgroup in _cgroup_dirs():
            for leaf in sorted(cgroup.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                if leaf.is_dir():
                    with contextlib.suppress(OSError):
                        leaf.rmdir()
            with contextlib.suppress(OSError):
                cgroup.rmdir()
        for system in SYSTEM_PATHS:
            if not system.is_dir():
                continue
            for entry in system.iterdir():
                ours = entry.is_symlink() and str(self.directory) in os.readlink(entry)
                if ours or entry.name in KUBELET_FILES:
                    entry.unlink()
            with contextlib.suppress(OSError):
                system.rmdir()  # only when empty: never what others put there
        with contextlib.suppress(OSError):
            Path("/var/lib/kubelet").rmdir()

    def leftovers(self) -> list[str]:
        """What of the node is still on the machine: mounts under DIR, containerd's cgroup
        directories, the kubelet's system paths (the iptables check is the caller's: it
        compares ``iptables-save`` before and after)."""
        found = [f"mount {m}" for m in _mounts() if m.startswith(f"{self.directory}/")]
        found += [f"cgroup {c}" for c in _cgroup_dirs()]
        found += [f"path {p}" for p in SYSTEM_PATHS if p.exists()]
        found += [f"pid {pid}" for pid in self._shim_pids() if _pid_alive(pid)]
        if self.netns is not None and (NETNS_DIR / self.netns).exists():
            found.append(f"network namespace {self.netns}")
        return found


def iptables_rules() -> str:
    """Every table's rules, counters left out (``iptables-save`` without ``-c``)."""
    return "\n".join(
        line
        for line in subprocess.run(
            ["iptables-save"], capture_output=True, text=True, check=False
        ).stdout.splitlines()
        if not line.startswith("#")
    )


def _pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _succeeds(argv: list[str]) -> bool:
    return subprocess.run(argv, capture_output=True, check=False).returncode == 0


def _wait(check: Callable[[], bool], *, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready after {timeout:.0f}s")
        time.sleep(0.2)
