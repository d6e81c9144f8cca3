"""``--client-auth token-file``: the start waits for the identity check at most
``Settings.identity_check_wait``. An apiserver that accepts connections and does not answer
(overloaded, or behind a proxy whose far side is gone) would otherwise keep the API port
closed for the upstream request timeout, a minute, on a warm start that needs only the
cache."""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path

import pytest

from proxy.app import App, Settings
from proxy.metrics import Metrics
from proxy.serve.authenticating import ClientAuth
from proxy.upstream.connecting import ConnectionSettings, connect
from tests.unit.upstream.conftest import token_kubeconfig


async def test_a_silent_apiserver_does_not_hold_the_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # connections complete in the kernel; nothing is read or answered
    kubeconfig = token_kubeconfig(
        tmp_path / "kc", server=f"http://127.0.0.1:{silent.getsockname()[1]}", token="own"
    )
    token = tmp_path / "token"
    token.write_text("own\n")
    app = App(
        Settings(
            kubeconfig=str(kubeconfig),
            client_auth=ClientAuth.parse(f"token-file:{token}"),
            identity_check_wait=0.3,
        )
    )
    upstream = await connect(ConnectionSettings(kubeconfig=str(kubeconfig)), metrics=Metrics())
    try:
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="warmwatch"):
            tokens = await app._client_tokens(upstream)
        assert 0.3 <= time.monotonic() - started < 2
        assert "(no answer within 0.3 s); checked again on use" in caplog.text
        assert tokens is not None
        assert await tokens.accepts(b"own")  # meanwhile, as while the apiserver is away
    finally:
        await upstream.close()
        silent.close()
