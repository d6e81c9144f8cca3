"""Which listeners each --client-auth mode may have, and the security flags' parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.__main__ import parser, settings_from
from proxy.app import Settings, StartRefused, check_listener
from proxy.serve.authenticating import ClientAuth


def _settings(listen: str, mode: str, *, tls: bool = False) -> Settings:
    return Settings(
        listen=(listen, 8443),
        client_auth=ClientAuth.parse(mode),
        tls_cert_file=Path("tls.crt") if tls else None,
        tls_key_file=Path("tls.key") if tls else None,
    )


@pytest.mark.parametrize("mode", ["none", "token-file:/t", "delegated"])
@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.2"])
def test_every_mode_may_listen_on_loopback(host: str, mode: str) -> None:
    check_listener(_settings(host, mode))


@pytest.mark.parametrize("mode", ["none", "token-file:/t"])
def test_beyond_loopback_requires_delegated(mode: str) -> None:
    with pytest.raises(StartRefused, match="requires --client-auth delegated"):
        check_listener(_settings("0.0.0.0", mode, tls=True))


def test_beyond_loopback_requires_tls() -> None:
    with pytest.raises(StartRefused, match="requires TLS"):
        check_listener(_settings("10.0.0.5", "delegated"))
    check_listener(_settings("0.0.0.0", "delegated", tls=True))


def test_certificate_and_key_go_together() -> None:
    settings = Settings(tls_cert_file=Path("tls.crt"))
    with pytest.raises(StartRefused, match="go together"):
        check_listener(settings)


def test_cert_dir_is_for_a_loopback_listener_without_a_named_certificate() -> None:
    check_listener(Settings(cert_dir=Path("/run/warmwatch")))
    with pytest.raises(StartRefused, match="--cert-dir"):
        check_listener(
            Settings(
                cert_dir=Path("/run/warmwatch"),
                tls_cert_file=Path("tls.crt"),
                tls_key_file=Path("tls.key"),
            )
        )
    with pytest.raises(StartRefused, match="--cert-dir"):
        check_listener(
            Settings(
                listen=("0.0.0.0", 8443),
                client_auth=ClientAuth.parse("delegated"),
                cert_dir=Path("/run/warmwatch"),
            )
        )
    args = parser().parse_args(["--cert-dir=/run/warmwatch"])
    assert settings_from(args).cert_dir == Path("/run/warmwatch")


def test_security_flags() -> None:
    args = parser().parse_args(
        [
            "--client-auth=delegated",
            "--auth-cache-ttl=2",
            "--auth-offline-window=30",
            "--reject-paths=",
            "--listen=0.0.0.0:8443",
            "--tls-cert-file=/tls/tls.crt",
            "--tls-private-key-file=/tls/tls.key",
        ]
    )
    settings = settings_from(args)
    assert settings.client_auth.mode == "delegated"
    delegation = settings.delegation
    assert (delegation.token_ttl, delegation.allow_ttl, delegation.deny_ttl) == (2, 2, 2)
    assert delegation.offline_window == 30
    assert not settings.reject_paths.rejects("/api/v1/namespaces/a/pods/p/exec")
    assert settings.tls_cert_file == Path("/tls/tls.crt")
    defaults = settings_from(parser().parse_args([]))
    assert defaults.delegation.allow_ttl == 10 and defaults.delegation.offline_window == 300
    assert defaults.reject_paths.rejects("/api/v1/namespaces/a/pods/p/portforward")
