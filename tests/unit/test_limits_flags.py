"""The limit flags (``proxy/__main__.py``) reach the settings, also from the environment (the
TokenReview budget's among them)."""

from __future__ import annotations

import resource

import pytest

from proxy.__main__ import parser, raise_open_files_limit, settings_from
from proxy.serve.limiting import Limits
from proxy.upstream.delegating import DelegationSettings
from proxy.upstream.discovering import DiscoverySettings


def test_defaults_are_the_documented_ones() -> None:
    settings = settings_from(parser().parse_args([]))
    assert settings.limits == Limits()
    assert settings.limits.max_header_bytes == 1 << 20  # the apiserver's MaxHeaderBytes
    assert settings.limits.header_timeout == 32.0  # its ReadHeaderTimeout
    assert settings.limits.idle_timeout == 90.0  # its IdleTimeout
    # A reader for each LIST stream, and 4 for short reads.
    assert settings.store_settings().readers == Limits().max_list_streams + 4


def test_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMWATCH_MAX_CLIENT_WATCHES", "7")
    monkeypatch.setenv("WARMWATCH_HEADER_TIMEOUT", "2.5")
    args = parser().parse_args(
        [
            "--max-connections=10",
            "--max-watches=9",
            "--max-list-streams=3",
            "--idle-timeout=5",
            "--max-header-bytes=4096",
        ]
    )
    settings = settings_from(args)
    assert settings.limits == Limits(
        max_connections=10,
        max_watches=9,
        max_client_watches=7,
        max_list_streams=3,
        header_timeout=2.5,
        idle_timeout=5.0,
        max_header_bytes=4096,
    )
    assert settings.store_settings().readers == 7


def test_retention_bytes_from_the_flag_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert settings_from(parser().parse_args([])).store_settings().retention_bytes == 256 << 20
    monkeypatch.setenv("WARMWATCH_RETENTION_BYTES", "1048576")
    assert settings_from(parser().parse_args([])).store_settings().retention_bytes == 1 << 20
    flag = parser().parse_args(["--retention-bytes=4096"])
    assert settings_from(flag).store_settings().retention_bytes == 4096
    with pytest.raises(ValueError, match="--retention-bytes must be positive"):
        settings_from(parser().parse_args(["--retention-bytes=0"]))


def test_a_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="--max-watches must be positive"):
        settings_from(parser().parse_args(["--max-watches=0"]))


def test_token_review_budget_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = settings_from(parser().parse_args([])).delegation
    assert (defaults.review_rate, defaults.review_burst) == (
        DelegationSettings().review_rate,
        DelegationSettings().review_burst,
    )
    monkeypatch.setenv("WARMWATCH_AUTH_REVIEW_BURST", "7")
    delegation = settings_from(parser().parse_args(["--auth-review-rate=2.5"])).delegation
    assert (delegation.review_rate, delegation.review_burst) == (2.5, 7)
    with pytest.raises(ValueError, match="--auth-review-rate and --auth-review-burst"):
        settings_from(parser().parse_args(["--auth-review-rate=0"]))


def test_the_discovery_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    assert settings_from(parser().parse_args([])).discovery == DiscoverySettings()
    monkeypatch.setenv("WARMWATCH_DISCOVERY_MAX_BYTES", "4096")
    args = parser().parse_args(["--discovery-max-copies=5", "--discovery-max-age=2"])
    assert settings_from(args).discovery == DiscoverySettings(
        max_age=2.0, max_copies=5, max_bytes=4096
    )
    with pytest.raises(ValueError, match="--discovery-max-copies must be positive"):
        settings_from(parser().parse_args(["--discovery-max-copies=0"]))


def test_the_open_files_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
        raise_open_files_limit()
        raised, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        assert raised == (hard if hard != resource.RLIM_INFINITY else 1 << 20)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
