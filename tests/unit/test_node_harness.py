"""The node harness's configuration and clean-up, without starting anything
(loadtest/node.py): what REAL-NODE facts it must keep, and that ``down`` removes only what is
the node's."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from loadtest import images
from loadtest import node as node_module


def _node(tmp_path: Path) -> node_module.Node:
    return node_module.Node(
        directory=tmp_path,
        spawn=lambda name, argv: 0,
        stop=lambda pid: None,
        alive=lambda pid: False,
    )


def test_containerd_keeps_its_state_under_the_directory(tmp_path: Path) -> None:
    config = tomllib.loads(_node(tmp_path)._containerd_config().read_text())
    for path in (config["root"], config["state"], config["grpc"]["address"]):
        assert path.startswith(f"{tmp_path}/node/")
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == images.PAUSE_IMAGE  # no registry
    assert cri["restrict_oom_score_adj"] is True  # no CAP_SYS_RESOURCE
    assert cri["disable_apparmor"] is True
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False
    assert cri["cni"]["conf_dir"].startswith(f"{tmp_path}/node/")
    (cni,) = Path(cri["cni"]["conf_dir"]).iterdir()
    assert json.loads(cni.read_text())["type"] == "loopback"  # no bridge, no address range


def test_kubelet_stays_on_loopback_and_off_iptables(tmp_path: Path) -> None:
    path = _node(tmp_path)._kubelet_config(port=12345, healthz_port=12346)
    config = json.loads(path.read_text())
    assert config["address"] == config["healthzBindAddress"] == "127.0.0.1"
    assert config["readOnlyPort"] == 0
    assert config["makeIPTablesUtilChains"] is False
    assert config["failCgroupV1"] is False and config["cgroupDriver"] == "cgroupfs"
    assert config["imageGCHighThresholdPercent"] == 100  # imported images are never collected
    assert config["podLogsDir"].startswith(f"{tmp_path}/node/")


def test_clean_removes_only_the_nodes_files_from_system_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs, plugins = tmp_path / "var-log-containers", tmp_path / "device-plugins"
    monkeypatch.setattr(node_module, "SYSTEM_PATHS", (logs, plugins))
    monkeypatch.setattr(node_module, "_cgroup_dirs", list)
    node = _node(tmp_path / "plane")
    logs.mkdir()
    plugins.mkdir()
    (logs / "ours.log").symlink_to(node.directory / "pod-logs" / "x.log")
    (plugins / "kubelet.sock").touch()
    node._clean()
    assert not logs.exists() and not plugins.exists()

    logs.mkdir()
    (logs / "theirs.log").symlink_to("/elsewhere/x.log")
    node._clean()
    assert [p.name for p in logs.iterdir()] == ["theirs.log"]  # another's: kept, dir too
    assert node.leftovers() == [f"path {logs}"]


def test_second_node_is_its_own_namespace_and_address(tmp_path: Path) -> None:
    first = _node(tmp_path)
    second = node_module.Node(
        directory=tmp_path,
        spawn=lambda name, argv: 0,
        stop=lambda pid: None,
        alive=lambda pid: False,
        name=node_module.SECOND_NODE_NAME,
    )
    assert first.netns is None and first.inside(["kubelet"]) == ["kubelet"]
    assert first.key("kubelet") == "kubelet"
    assert second.directory == tmp_path / "node-127.0.0.2"
    assert second.key("kubelet") == "kubelet@127.0.0.2"  # beside the first's, in one pids map
    # only the network namespace: ip netns exec's own mount namespace would hide the
    # kubelet's volume mounts from containerd
    assert second.inside(["kubelet"])[:2] == ["nsenter", f"--net=/run/netns/{second.netns}"]
    config = json.loads(second._kubelet_config(port=1, healthz_port=2).read_text())
    assert config["address"] == "127.0.0.2"  # where the apiserver's relay reaches it
    other = node_module.Node(
        directory=tmp_path / "other",
        spawn=lambda name, argv: 0,
        stop=lambda pid: None,
        alive=lambda pid: False,
        name=node_module.SECOND_NODE_NAME,
    )
    assert other.netns != second.netns  # one per plane directory


def test_relays_listen_on_their_side_and_connect_on_the_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each relay: the connecting ``socat`` first (its unix socket must exist), then the
    listening one, each on its side: inward relays listen on the host, outward ones in the
    namespace; the address and port are the same on both sides."""
    ran: list[list[str]] = []
    spawned: dict[str, list[str]] = {}
    monkeypatch.setattr(node_module, "NETNS_DIR", tmp_path / "netns")
    monkeypatch.setattr(
        node_module.subprocess, "run", lambda argv, **kwargs: ran.append(list(argv))
    )

    def spawn(name: str, argv: list[str]) -> int:
        spawned[name] = argv
        for arg in argv:
            if arg.startswith("UNIX-LISTEN:"):
                Path(arg.removeprefix("UNIX-LISTEN:").split(",")[0]).touch()
        return len(spawned)

    node = node_module.Node(
        directory=tmp_path,
        spawn=spawn,
        stop=lambda pid: None,
        alive=lambda pid: False,
        name=node_module.SECOND_NODE_NAME,
    )
    pids: dict[str, int] = {}
    node._start_namespace(
        pids=pids,
        relays=[
            node_module.Relay(address="127.0.0.1", port=6443, inward=False),
            node_module.Relay(address="127.0.0.2", port=9091, inward=True),
        ],
    )
    assert ran[0] == ["ip", "netns", "add", node.netns]
    assert ran[1][-5:] == ["ip", "link", "set", "lo", "up"] and ran[1][0] == "nsenter"
    out_listen = spawned["relay-out-127.0.0.1-6443-listen@127.0.0.2"]
    out_connect = spawned["relay-out-127.0.0.1-6443-connect@127.0.0.2"]
    assert (
        out_listen[0] == "nsenter" and "TCP-LISTEN:6443,bind=127.0.0.1,fork,reuseaddr" in out_listen
    )
    assert out_connect[0] == "socat" and out_connect[-1] == "TCP:127.0.0.1:6443"
    in_listen = spawned["relay-in-127.0.0.2-9091-listen@127.0.0.2"]
    in_connect = spawned["relay-in-127.0.0.2-9091-connect@127.0.0.2"]
    assert (
        in_listen[0] == "socat" and in_listen[1] == "TCP-LISTEN:9091,bind=127.0.0.2,fork,reuseaddr"
    )
    assert in_connect[0] == "nsenter" and in_connect[-1] == "TCP:127.0.0.2:9091"
    names = list(spawned)
    assert names.index("relay-in-127.0.0.2-9091-connect@127.0.0.2") < names.index(
        "relay-in-127.0.0.2-9091-listen@127.0.0.2"
    )
    assert set(pids) == set(spawned)
