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

import asyncio
import logging
import os
import ssl
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = ["ServingCertificate", "self_signed"]


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


async def self_signed(directory: Path) -> tuple[Path, Path]:
    """``--cert-dir``: the certificate and key in ``directory``; made now (``certifying``)
    when either is missing or the two do not load as a pair. A sidecar restarted in the same
    pod keeps its pair: the controller beside it trusts that one.

    Made in a child process: ``cryptography`` costs ~8 MiB of resident memory once imported,
    which the sidecar would then carry for its whole life to use it once per pod; the child
    takes ~0.3 s, once, on a cold start."""
    cert_file = directory / "warmwatch.crt"
    key_file = directory / "warmwatch.key"
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
            str(cert_file), str(key_file)
        )
    except OSError:  # missing, damaged, or not a pair (ssl.SSLError is an OSError)
        child = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "proxy.serve.certifying", str(directory)),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, errors = await child.communicate()
        if child.returncode != 0:
            last = errors.decode(errors="replace").strip().splitlines()[-1:]
            raise OSError(f"no certificate made in {directory}: {' '.join(last)}") from None
        logger.info(
            "self-signed serving certificate for localhost, 127.0.0.1 and ::1 written to %s "
            "(--cert-dir)",
            cert_file,
        )
    return cert_file, key_file
