"""TLS for the API listener (docs/design.md §6): ``--tls-cert-file`` and
``--tls-private-key-file``, required when it listens beyond loopback.

The certificate and key are loaded into one ``SSLContext`` the listener keeps; when either
file changes (cert-manager or a projected volume rotates them), the chain is loaded into the
same context again, so new handshakes present the new certificate without a restart and open
connections keep theirs. A pair that fails to load (caught half-written) keeps the previous
one, and is tried again at the next look.
"""

from __future__ import annotations

import logging
import os
import ssl
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = ["ServingCertificate"]


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
