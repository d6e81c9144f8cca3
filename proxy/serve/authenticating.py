"""Local authentication, the Host and Origin checks, rejected paths (docs/design.md §6).

- ``delegated``: the apiserver decides. Passthrough carries the client's own credentials;
  reads served from the cache are authorized per client (``authorizing``). Nothing to check
  here.
- ``token-file:PATH``: the client must send ``Authorization: Bearer <the file's token>``; the
  file is re-read when it changes (service-account tokens rotate). Anything else: 401 Status.
  The token must belong to warmwatch's own upstream identity (checked at start and after
  each rotation, see :class:`TokenFile`): per-client authorization is ``delegated``'s job.
- ``none``: every local caller acts as the sidecar, like ``kubectl proxy``; only on loopback.
  So that no web page lends that identity, a request with an ``Origin`` that is not a
  loopback origin is refused (403; WebSocket handshakes included), and paths matching
  ``--reject-paths`` (exec, attach, port-forward and the node, pod and service proxies by
  default: ``DEFAULT_REJECT_PATHS``) are refused (403).
- On a loopback listener (always, except ``delegated`` with TLS): the Host header must name
  a loopback host, so a web page cannot reach the listener through DNS rebinding
  (``kubectl proxy``'s ``--accept-hosts`` default does the same).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import yarl
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from proxy.kube.status import StatusError
from proxy.upstream.reviewing import IdentityMismatch

logger = logging.getLogger(__name__)

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})


@dataclass(frozen=True, kw_only=True, slots=True)
class ClientAuth:
    """``--client-auth``: ``none``, ``token-file:PATH`` or ``delegated``."""

    mode: str
    token_file: Path | None = None

    @classmethod
    def parse(cls, text: str) -> ClientAuth:
        if text == "none":
            return cls(mode="none")
        if text.startswith("token-file:") and len(text) > len("token-file:"):
            return cls(mode="token-file", token_file=Path(text.removeprefix("token-file:")))
        if text == "delegated":
            return cls(mode="delegated")
        raise ValueError(
            f"--client-auth must be 'none', 'token-file:PATH' or 'delegated', not {text!r}"
        )


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


def is_loopback_origin(origin: str) -> bool:
    """An ``Origin`` header value (``scheme://host[:port]``) of a page served from this
    machine's loopback. ``null`` (sandboxed frames, ``file:`` pages) is not."""
    try:
        url = yarl.URL(origin.strip())
    except ValueError:
        return False
    if url.scheme not in ("http", "https") or not url.host:
        return False
    return is_loopback_host(f"[{url.host}]" if ":" in url.host else url.host)


DEFAULT_REJECT_PATHS = ",".join(
    (
        r"^/api/.*/pods/.*/exec",
        r"^/api/.*/pods/.*/attach",
        r"^/api/.*/pods/.*/portforward",
        r"^/api/.*/nodes/.*/proxy",
        r"^/api/.*/pods/.*/proxy",
        r"^/api/.*/services/.*/proxy",
    )
)
"""``kubectl proxy``'s ``--reject-paths`` default (exec and attach), and more: port-forward and
the ``proxy`` subresources of nodes, pods and services. ``kubectl proxy`` lends its user's
own identity to the user's own processes; warmwatch lends its service account's to every
local caller, so what reaches past the apiserver is refused as well: a node's proxy is the
kubelet's API, whose ``/exec`` and ``/run`` endpoints run commands in any container on the
node (exec by another path), and the pod and service proxies reach any HTTP endpoint in the
cluster from the apiserver's network position. Like kubectl's, the patterns are loose (they
also refuse an object named ``exec`` or ``proxy`` in a namespace named ``pods``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RejectPaths:
    """``--reject-paths``: comma-separated regular expressions, searched (``re.search``, as
    Go's ``MatchString``; anchor them with ``^``) in the decoded path with repeated slashes
    collapsed — so ``//api/...`` or an escaped ``%65xec`` does not slip by."""

    patterns: tuple[re.Pattern[str], ...] = ()

    @classmethod
    def parse(cls, text: str) -> RejectPaths:
        try:
            return cls(patterns=tuple(re.compile(p) for p in text.split(",") if p.strip()))
        except re.error as error:
            raise ValueError(f"--reject-paths: bad regular expression: {error}") from error

    def rejects(self, path: str) -> bool:
        normal = re.sub(r"/{2,}", "/", path)
        return any(pattern.search(normal) for pattern in self.patterns)


Verifier = Callable[[str], Awaitable[None]]
"""Checks that a token belongs to warmwatch's own upstream identity; raises
``IdentityMismatch`` when it does not, another error when it cannot tell."""


class TokenFile:
    """The expected bearer token, re-read whenever the file changes, and (with ``verify``)
    accepted only once its identity was not found to differ from warmwatch's own.

    A token that cannot be checked (the apiserver is unreachable) is accepted meanwhile and
    checked again at most every ``retry`` seconds: warmwatch must serve while the apiserver
    is away, and the file is the pod's own.
    """

    def __init__(
        self,
        path: Path,
        *,
        verify: Verifier | None = None,
        retry: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._token = b""
        self._verify = verify
        self._retry = retry
        self._clock = clock
        self._checked = b""
        self._refused = b""
        self._attempted: tuple[bytes, float] | None = None
        self._lock = asyncio.Lock()

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

    async def check(self) -> None:
        """Verify the current token now; raises what the verifier raises (at start, an
        ``IdentityMismatch`` refuses the start)."""
        token = self.token()
        if self._verify is None or not token:
            return
        async with self._lock:
            if token == self._checked:
                return  # checked while this caller waited
            self._attempted = (token, self._clock())
            try:
                await self._verify(token.decode())
            except IdentityMismatch:
                self._refused = token
                raise
            self._checked = token

    async def accepted(self) -> bytes:
        """The token clients must present; empty when none is acceptable."""
        token = self.token()
        if self._verify is None or not token or token == self._checked:
            return token
        attempted = self._attempted
        due = (
            attempted is None
            or attempted[0] != token
            or self._clock() - attempted[1] >= self._retry
        )
        if token != self._refused and due:
            try:
                await self.check()
            except IdentityMismatch as error:
                logger.error("client token file %s refused: %s", self.path, error)
            except Exception as error:
                logger.warning(
                    "client token file %s: its identity cannot be checked yet: %s",
                    self.path,
                    error,
                )
        return b"" if token == self._refused else token


@dataclass(frozen=True, kw_only=True, slots=True)
class Guard:
    """What the API listener's middleware checks (besides ``ClientAuth``)."""

    loopback_listener: bool = True
    """Check the Host header (see the module docstring)."""
    reject_paths: RejectPaths = field(
        default_factory=lambda: RejectPaths.parse(DEFAULT_REJECT_PATHS)
    )
    """Refused in ``none`` mode."""


def middleware(
    auth: ClientAuth, *, guard: Guard | None = None, tokens: TokenFile | None = None
) -> Middleware:
    guard = guard or Guard()
    if tokens is None and auth.token_file is not None:
        tokens = TokenFile(auth.token_file)
    sidecar_identity = auth.mode == "none"

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if guard.loopback_listener and not is_loopback_host(request.host):
            raise StatusError.forbidden(
                group="",
                resource="",
                reason=f"host {request.host!r} is not a loopback name (DNS rebinding protection)",
            )
        if sidecar_identity:
            origin = request.headers.get("Origin")
            if origin is not None and not is_loopback_origin(origin):
                raise StatusError.forbidden(
                    group="",
                    resource="",
                    reason=f"cross-origin request from {origin!r} refused: with --client-auth "
                    "none every caller acts as warmwatch",
                )
            if guard.reject_paths.rejects(request.path):
                raise StatusError.forbidden(
                    group="",
                    resource="",
                    reason=f"path {request.path!r} is refused by --reject-paths: with "
                    "--client-auth none every caller acts as warmwatch",
                )
        if tokens is not None:
            header = request.headers.get("Authorization", "")
            scheme, _, presented = header.partition(" ")
            expected = await tokens.accepted()
            if (
                scheme.lower() != "bearer"
                or not expected
                or not hmac.compare_digest(presented.strip().encode(), expected)
            ):
                raise StatusError.unauthorized()
        return await handler(request)

    return check
