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
from proxy.serve.certifying import LOOPBACK_NAMES
from proxy.serve.securing import ServingCertificate, self_signed


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


async def _verified_by(cert: Path, serving: ServingCertificate, *, host: str) -> bool:
    """A TLS handshake over loopback from a client that trusts only ``cert`` and checks that
    the server is ``host`` (as client-go does with a kubeconfig's certificate-authority)."""

    async def hold(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0, ssl=serving.context)
    port = server.sockets[0].getsockname()[1]
    client = ssl.create_default_context(cafile=str(cert))
    try:
        _, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client, server_hostname=host
        )
        writer.close()
        return True
    except ssl.SSLCertVerificationError:
        return False
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("host", LOOPBACK_NAMES)
async def test_self_signed_pair_verifies_for_every_loopback_name(tmp_path: Path, host: str) -> None:
    cert, key = await self_signed(tmp_path / "tls")
    assert (cert.name, key.name) == ("warmwatch.crt", "warmwatch.key")
    assert os.stat(key).st_mode & 0o777 == 0o600
    serving = ServingCertificate(cert_file=cert, key_file=key)
    assert await _verified_by(cert, serving, host=host)
    assert not await _verified_by(cert, serving, host="warmwatch.example")


async def test_self_signed_pair_is_kept_across_starts(tmp_path: Path) -> None:
    """A restarted sidecar keeps its pair: the controller beside it trusts that one."""
    cert, key = await self_signed(tmp_path)
    before = (cert.read_bytes(), key.read_bytes())
    assert await self_signed(tmp_path) == (cert, key)
    assert (cert.read_bytes(), key.read_bytes()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["warmwatch.crt", "warmwatch.key"]


@pytest.mark.parametrize("damage", ["truncated", "other key", "missing key"])
async def test_a_damaged_self_signed_pair_is_made_again(tmp_path: Path, damage: str) -> None:
    cert, key = await self_signed(tmp_path)
    before = cert.read_bytes()
    if damage == "truncated":
        cert.write_bytes(before[:100])
    elif damage == "other key":
        other = pki.create(tmp_path / "other")
        shutil.copy(other.serving_key, key)
    else:
        key.unlink()
    again = await self_signed(tmp_path)
    assert again == (cert, key) and cert.read_bytes() != before
    ServingCertificate(cert_file=cert, key_file=key)  # loads


async def test_a_directory_that_cannot_be_written_refuses_with_the_reason(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    with pytest.raises(OSError, match=r"no certificate made in .*NotADirectoryError"):
        await self_signed(blocked / "tls")
