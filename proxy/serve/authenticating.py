"""Local authentication and the Host check (docs/design.md §6).

- ``token-file:PATH``: the client must send ``Authorization: Bearer <the file's token>``; the
  file is re-read when it changes (service-account tokens rotate). Anything else: 401 Status.
- ``none``: every local caller acts as the sidecar, like ``kubectl proxy``; only on loopback.
- Always: the Host header must name a loopback host, so a web page cannot reach the listener
  through DNS rebinding (``kubectl proxy``'s ``--accept-hosts`` default does the same).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from proxy.kube.status import StatusError

logger = logging.getLogger(__name__)

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})


@dataclass(frozen=True, kw_only=True, slots=True)
class ClientAuth:
    """``--client-auth``: ``none`` or ``token-file:PATH``."""

    mode: str
    token_file: Path | None = None

    @classmethod
    def parse(cls, text: str) -> ClientAuth:
        if text == "none":
            return cls(mode="none")
        if text.startswith("token-file:") and len(text) > len("token-file:"):
            return cls(mode="token-file", token_file=Path(text.removeprefix("token-file:")))
        if text == "delegated":
            raise ValueError("--client-auth delegated is not implemented yet; use token-file")
        raise ValueError(f"--client-auth must be 'none' or 'token-file:PATH', not {text!r}")


def is_loopback_host(host: str) -> bool:
    """``Host`` header value (with or without port) names this machine's loopback."""
    name = host.strip()
    if name.startswith("["):
        name = name[1 : name.find("]")] if "]" in name else name
    elif name.count(":") == 1:
        name = name.split(":", 1)[0]
    if name.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class TokenFile:
    """The expected bearer token, re-read whenever the file changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._token = b""

    def token(self) -> bytes:
        try:
            stat = os.stat(self.path)
        except OSError as error:
            logger.error("cannot read client token file %s: %s", self.path, error)
            return b""
        stamp = (stat.st_mtime_ns, stat.st_ino)
        if stamp != self._stamp:
            self._token = self.path.read_bytes().strip()
            self._stamp = stamp
        return self._token


def middleware(auth: ClientAuth) -> Middleware:
    tokens = TokenFile(auth.token_file) if auth.token_file else None

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not is_loopback_host(request.host):
            raise StatusError.forbidden(
                group="",
                resource="",
                reason=f"host {request.host!r} is not a loopback name (DNS rebinding protection)",
            )
        if tokens is not None:
            header = request.headers.get("Authorization", "")
            scheme, _, presented = header.partition(" ")
            expected = tokens.token()
            if (
                scheme.lower() != "bearer"
                or not expected
                or not hmac.compare_digest(presented.strip().encode(), expected)
            ):
                raise StatusError.unauthorized()
        return await handler(request)

    return check
