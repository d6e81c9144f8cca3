"""``python -m proxy``: the operator's commands are dispatched to ``proxy/operating.py``,
which the proxy itself never imports (nor the modules only it uses); the flags' defaults are
the settings dataclasses'."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from proxy import operating
from proxy.__main__ import OPERATOR_COMMANDS, main, parser, settings_from
from proxy.app import Settings
from proxy.cache.store import StoreSettings

ROOT = Path(__file__).resolve().parents[2]


def test_the_operator_commands_are_operatings() -> None:
    assert f"{{{','.join(OPERATOR_COMMANDS)}}}" in operating.parser().format_usage()


def test_the_proxy_does_not_import_the_operator_commands() -> None:
    only_theirs = (
        "proxy.operating",
        "proxy.cache.inspecting",
        "proxy.cache.verifying",
        "proxy.upstream.comparing",
    )
    script = (
        "import sys, proxy.__main__\n"
        f"print(sorted(m for m in sys.modules if m in {only_theirs!r}))\n"
        "import proxy.operating\n"  # they exist, and are imported for the commands
        f"print(sorted(m for m in sys.modules if m in {only_theirs!r}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert out.splitlines() == ["[]", repr(sorted(only_theirs))]


def test_every_flags_default_is_its_settings_field(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defaults live in the settings dataclasses only: the command line without flags or
    environment builds exactly the default settings."""
    for name in os.environ:
        if name.startswith("WARMWATCH_"):
            monkeypatch.delenv(name)
    defaults = Settings()
    expected = dataclasses.replace(defaults, store=StoreSettings(path=defaults.db))
    assert settings_from(parser().parse_args([])) == expected


def test_seeding_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["--seed-peer=10.0.0.7:9443", "--seed-peer=[fd00::7]:9443", "--seed-listen=0.0.0.0:9443"]
    settings = settings_from(parser().parse_args(args))
    assert settings.seed.peers == (("10.0.0.7", 9443), ("fd00::7", 9443))
    assert (settings.seed.mode, settings.seed_listen) == ("auto", ("0.0.0.0", 9443))
    monkeypatch.setenv("WARMWATCH_SEED_PEER", "a:1, b:2")
    monkeypatch.setenv("WARMWATCH_SEED", "off")
    seed = settings_from(parser().parse_args([])).seed
    assert (seed.mode, seed.peers) == ("off", (("a", 1), ("b", 2)))
    monkeypatch.setenv("WARMWATCH_SEED_PEER", "no-port")
    with pytest.raises(SystemExit) as refused:
        parser()
    assert refused.value.code == 2


def test_pod_flags_for_the_peer_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["--pod-name=ctl-7d9f-x2", "--pod-namespace=team", "--seed-listen=0.0.0.0:9443"]
    seed = settings_from(parser().parse_args(args)).seed
    assert (seed.pod_name, seed.pod_namespace, seed.peer_port) == ("ctl-7d9f-x2", "team", 9443)
    seed = settings_from(parser().parse_args([*args, "--seed-peer-port=9090"])).seed
    assert seed.peer_port == 9090
    with pytest.raises(ValueError, match="peers' port"):
        settings_from(parser().parse_args(["--pod-name=ctl-0", "--pod-namespace=team"]))
    monkeypatch.setenv("WARMWATCH_POD_NAME", "ctl-0")
    monkeypatch.setenv("WARMWATCH_POD_NAMESPACE", "ops")
    monkeypatch.setenv("WARMWATCH_SEED_PEER_PORT", "9191")
    seed = settings_from(parser().parse_args([])).seed
    assert (seed.pod_name, seed.pod_namespace, seed.peer_port) == ("ctl-0", "ops", 9191)
    with pytest.raises(ValueError, match="go together"):
        settings_from(parser().parse_args(["--pod-name=ctl-0", "--pod-namespace="]))
    monkeypatch.setenv("WARMWATCH_SEED_LISTEN", "0.0.0.0:9443")
    assert settings_from(parser().parse_args([])).seed_listen == ("0.0.0.0", 9443)
    monkeypatch.setenv("WARMWATCH_SEED_PEER_PORT", "ninety")
    with pytest.raises(SystemExit):
        parser().parse_args([])


@pytest.mark.parametrize("value", ["abc", "", "1.5"])
def test_a_number_from_the_environment_is_one_or_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """As ``--max-watches abc`` is refused, so is ``WARMWATCH_MAX_WATCHES=abc``, by name: not
    a traceback, and not a 0 that would switch a limit off (proxy/environment.py)."""
    monkeypatch.setenv("WARMWATCH_MAX_WATCHES", value)
    with pytest.raises(SystemExit) as refused:
        parser()
    assert refused.value.code == 2
    assert f"WARMWATCH_MAX_WATCHES: expected an integer, got {value!r}" in capsys.readouterr().err


def test_a_number_from_the_environment_is_the_flags_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WARMWATCH_DISCOVERY_MAX_AGE", "2.5")
    assert parser().parse_args([]).discovery_max_age == 2.5
    assert parser().parse_args(["--discovery-max-age=4"]).discovery_max_age == 4.0


@pytest.mark.parametrize("mode", ["0", "OFF", "full; DROP TABLE objects"])
def test_sync_mode_is_normal_or_full_from_anywhere(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], mode: str
) -> None:
    """argparse checks a flag's choices on the command line only; the variable is checked by
    the settings, before it reaches a PRAGMA (where "0" would mean OFF)."""
    with pytest.raises(ValueError, match="--sync-mode is NORMAL or FULL"):
        StoreSettings(path=Path("x.db"), synchronous=mode)
    monkeypatch.setenv("WARMWATCH_SYNC_MODE", mode)
    assert main(["--db", "unused.db"]) == 2
    assert "--sync-mode is NORMAL or FULL" in capsys.readouterr().err


def test_credentials_that_cannot_be_loaded_refuse_the_start(tmp_path: Path) -> None:
    """A missing or broken kubeconfig is a clear refusal (exit 1, one line), not a traceback."""
    broken = tmp_path / "kubeconfig"
    broken.write_text("apiVersion: v1\nkind: Config\n")  # no current-context
    command = [
        sys.executable,
        "-m",
        "proxy",
        f"--kubeconfig={broken}",
        f"--db={tmp_path / 'cache.db'}",
        "--listen=127.0.0.1:0",
        "--metrics-listen=127.0.0.1:0",
        "--seed=off",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMWATCH_")}
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "refusing to start: cannot load kubeconfig" in done.stderr
    assert "Traceback" not in done.stderr
