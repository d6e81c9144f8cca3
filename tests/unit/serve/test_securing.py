"""The listener's serving certificate: loaded, and reloaded into the same SSLContext when its
files change (new handshakes see the new certificate)."""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
from pathlib import Path

import pytest

from loadtest import pki
from proxy.serve.securing import ServingCertificate


async def _peer_certificate(port: int) -> bytes:
    client = ssl.create_default_context()
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
    ssl_object = writer.get_extra_info("ssl_object")
    der = ssl_object.getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    return bytes(der)


async def test_rotated_files_are_served_to_new_connections(tmp_path: Path) -> None:
    first = pki.create(tmp_path / "first")
    second = pki.create(tmp_path / "second")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(first.serving_cert, cert)
    shutil.copy(first.serving_key, key)
    serving = ServingCertificate(cert_file=cert, key_file=key)

    async def hold(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0, ssl=serving.context)
    port = server.sockets[0].getsockname()[1]
    try:
        before = await _peer_certificate(port)
        assert serving.reload_if_changed() is False  # nothing changed
        shutil.copy(second.serving_cert, cert)
        shutil.copy(second.serving_key, key)
        os.utime(cert, ns=(1, 10**18))
        assert serving.reload_if_changed() is True
        after = await _peer_certificate(port)
        assert before != after
        assert after == ssl.PEM_cert_to_DER_cert(second.serving_cert.read_text())
    finally:
        server.close()
        await server.wait_closed()


def test_a_broken_pair_keeps_the_previous_one(tmp_path: Path) -> None:
    first = pki.create(tmp_path / "first")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(first.serving_cert, cert)
    shutil.copy(first.serving_key, key)
    serving = ServingCertificate(cert_file=cert, key_file=key)
    cert.write_text("half-written")
    assert serving.reload_if_changed() is False
    with pytest.raises(ssl.SSLError):
        ServingCertificate(cert_file=cert, key_file=key)
