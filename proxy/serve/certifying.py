"""The self-signed certificate of ``--cert-dir`` (docs/design.md §6), made in a process of
its own: ``python -m proxy.serve.certifying DIR`` writes ``DIR/warmwatch.crt`` and
``DIR/warmwatch.key``. ``securing.self_signed`` runs it when the directory holds no usable
pair, so that the sidecar itself never imports ``cryptography``.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["LOOPBACK_NAMES", "make_pair"]

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
"""What the certificate names: every way a local client writes the loopback."""

VALID_DAYS = 3650
"""Validity. Not shorter: the pair lives in the pod's own volume (an ``emptyDir`` dies with
the pod), and a controller reads its certificate authority once at start and never again,
so a pair that expired during a long-lived pod's life would cut the controller off from
warmwatch until the pod is replaced."""


def make_pair(directory: Path) -> tuple[Path, Path]:
    """Write a new key (P-256) and a certificate for it, self-signed for
    ``LOOPBACK_NAMES``, as ``warmwatch.key`` (0600) and ``warmwatch.crt`` in ``directory``.

    A CA-flagged leaf: the client's trust store holds it as a root, and Go, OpenSSL and
    Python all accept a root presented as the server's own certificate. Each file is written
    atomically (a temporary file renamed), the key first, so a reader sees a whole file."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "warmwatch loopback")])
    names: list[x509.GeneralName] = [x509.DNSName(LOOPBACK_NAMES[0])]
    names += [x509.IPAddress(ipaddress.ip_address(a)) for a in LOOPBACK_NAMES[1:]]
    usage = x509.KeyUsage(
        digital_signature=True,
        key_cert_sign=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # clocks a little apart
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    cert_file, key_file = directory / "warmwatch.crt", directory / "warmwatch.key"
    _write(key_file, key_pem, mode=0o600)
    _write(cert_file, certificate.public_bytes(serialization.Encoding.PEM), mode=0o644)
    return cert_file, key_file


def _write(path: Path, data: bytes, *, mode: int) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)
    os.chmod(temporary, mode)  # O_CREAT's mode is masked by the umask
    os.replace(temporary, path)


if __name__ == "__main__":
    # Silent: the sidecar logs the outcome in its own format; a failure's traceback on
    # stderr becomes the sidecar's error message.
    make_pair(Path(sys.argv[1]))
