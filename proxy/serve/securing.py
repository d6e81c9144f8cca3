"""TLS for the API listener (docs/design.md §6): ``--tls-cert-file`` and
``--tls-private-key-file``, required when it listens beyond loopback.

The certificate and key are loaded into one ``SSLContext`` the listener keeps; when either
file changes (cert-manager or a projected volume rotates them), the chain is loaded into the
same context again, so new handshakes present the new certificate without a restart and open
connections keep theirs. A pair that fails to load (caught half-written) keeps the previous
one, and is tried again at the next look.

``--cert-dir DIR`` (as kube-apiserver's and the kubelet's flag of that name): without
``--tls-cert-file``, the loopback listener serves TLS with ``DIR/warmwatch.crt`` and
``DIR/warmwatch.key``, a self-signed pair for ``127.0.0.1``, ``::1`` and ``localhost`` made at
the first start and kept (``self_signed``). It exists because client-go sends a kubeconfig's
credentials only to an ``https://`` server (clientcmd loads the user only for TLS): a Go
controller can present the pod's token to ``--client-auth token-file`` only over TLS. The
controller trusts the pair by naming ``DIR/warmwatch.crt`` as its ``certificate-authority``
(a self-signed leaf in the roots verifies on its own).
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

logger = logging.getLogger(__name__)

__all__ = ["LOOPBACK_NAMES", "ServingCertificate", "self_signed"]

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
"""What the self-signed certificate names: every way a local client writes the loopback."""

SELF_SIGNED_DAYS = 3650
"""Validity of the self-signed pair. Not shorter: the pair lives in the pod's own volume
(an ``emptyDir`` dies with the pod), and a controller reads its certificate authority once
at start and never again, so a pair that expired during a long-lived pod's life would cut
the controller off from warmwatch until the pod is replaced."""


class ServingCertificate:
    """The listener's certificate and key, and the SSLContext serving them."""

    def __init__(self, *, cert_file: Path, key_file: Path) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._stamp = self._current_stamp()
        # At start a bad pair is an error (ssl.SSLError / OSError), not a warning.
        self.context.load_cert_chain(str(cert_file), str(key_file))

    def _current_stamp(self) -> tuple[tuple[int, int, int], ...]:
        stamps = []
        for path in (self.cert_file, self.key_file):
            try:
                stat = os.stat(path)
            except OSError:
                stamps.append((0, 0, 0))
            else:
                stamps.append((stat.st_mtime_ns, stat.st_ino, stat.st_size))
        return tuple(stamps)

    def reload_if_changed(self) -> bool:
        """Load the files again when they changed; True when the new pair is in use."""
        stamp = self._current_stamp()
        if stamp == self._stamp:
            return False
        try:
            self.context.load_cert_chain(str(self.cert_file), str(self.key_file))
        except (OSError, ssl.SSLError) as error:
            logger.warning("serving certificate not reloaded (will retry): %s", error)
            return False
        self._stamp = stamp
        logger.info("serving certificate reloaded from %s", self.cert_file)
        return True


def self_signed(directory: Path) -> tuple[Path, Path]:
    """``--cert-dir``: the certificate and key in ``directory``, made now when either is
    missing or the pair does not load or no longer covers the loopback names (a sidecar
    restarted in the same pod keeps its pair: the controller beside it trusts that one).

    Written atomically (a temporary file renamed), the key 0600: a controller that reads
    the directory while this runs sees the old pair or the new one, never half of one."""
    cert_file = directory / "warmwatch.crt"
    key_file = directory / "warmwatch.key"
    if _usable(cert_file, key_file):
        return cert_file, key_file
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "warmwatch loopback")])
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    names += [x509.IPAddress(ipaddress.ip_address(a)) for a in LOOPBACK_NAMES[1:]]
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # clocks a little apart
        .not_valid_after(now + datetime.timedelta(days=SELF_SIGNED_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    _write(
        key_file,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        mode=0o600,
    )
    _write(cert_file, certificate.public_bytes(serialization.Encoding.PEM), mode=0o644)
    logger.info(
        "self-signed serving certificate for %s written to %s (--cert-dir)",
        ", ".join(LOOPBACK_NAMES),
        cert_file,
    )
    return cert_file, key_file


def _usable(cert_file: Path, key_file: Path) -> bool:
    try:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(cert_file), str(key_file))
        certificate = x509.load_pem_x509_certificate(cert_file.read_bytes())
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except (OSError, ValueError, x509.ExtensionNotFound):  # ssl.SSLError is an OSError
        return False
    covered = {str(n) for n in names.value.get_values_for_type(x509.IPAddress)}
    covered |= set(names.value.get_values_for_type(x509.DNSName))
    fresh = certificate.not_valid_after_utc > datetime.datetime.now(datetime.UTC)
    return fresh and covered >= set(LOOPBACK_NAMES)


def _write(path: Path, data: bytes, *, mode: int) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)
    os.chmod(temporary, mode)  # O_CREAT's mode is masked by the umask
    os.replace(temporary, path)
