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
