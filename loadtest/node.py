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
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from loadtest import images

NODE_NAME = "127.0.0.1"
"""``--hostname-override``: the node's name is its InternalIP, so the apiserver reaches the
kubelet (logs, exec) on loopback. ``--node-ip`` refuses a loopback address."""

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


class Node:
    """containerd + kubelet of one control plane directory."""

    def __init__(
        self,
        *,
        directory: Path,
        spawn: Callable[[str, list[str]], int],
        stop: Callable[[int], None],
        alive: Callable[[int | None], bool],
    ) -> None:
        self.directory = directory / "node"
        self._spawn = spawn
        self._stop = stop
        self._alive = alive

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
            "address": "127.0.0.1",
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
    ) -> None:
        """Start containerd (and import the pause image into it) and the kubelet."""
        images.ensure_packages()
        images.ensure_pause()
        if not self._alive(pids.get("containerd")):
            config = self._containerd_config()
            pids["containerd"] = self._spawn("containerd", ["containerd", f"--config={config}"])
            _wait(lambda: self._ctr_ok(), what="containerd", timeout=30)
        if not self._has_image(images.PAUSE_IMAGE):
            self.load_image(images.PAUSE_IMAGE)
        if not self._alive(pids.get("kubelet")):
            kubelet = self.directory / "kubelet"
            config = self._kubelet_config(port=ports["kubelet"], healthz_port=ports["healthz"])
            pids["kubelet"] = self._spawn(
                "kubelet",
                [
                    str(binaries / "kubelet"),
                    f"--config={config}",
                    f"--kubeconfig={kubeconfig}",
                    f"--root-dir={kubelet / 'root'}",
                    f"--cert-dir={kubelet / 'pki'}",
                    f"--hostname-override={NODE_NAME}",
                    "--v=1",
                ],
            )

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
        if delete_pods is not None and self._alive(pids.get("kubelet")):
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                delete_pods()
        self._stop(pids.pop("kubelet", 0))
        if self._alive(pids.get("containerd")):
            self._remove_sandboxes()
        for pid in self._shim_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._stop(pids.pop("containerd", 0))
        self._clean()

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
