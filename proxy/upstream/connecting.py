"""The connection to the real apiserver: credentials, TLS, sessions, timeouts, metrics.

Credentials are loaded with kubernetes_asyncio's own loaders (in-cluster service account,
kubeconfig with client certificates, tokens, token files, exec plugins, basic auth), imported
without the rest of the package (``loaders``); the requests themselves go through
warmwatch's own aiohttp sessions, so that bodies stream in both directions and timeouts fit
watches. The ``Authorization`` header is computed for every request, so rotated and
refreshed credentials are used as soon as they change:

- in-cluster: kubernetes_asyncio installs ``Configuration.refresh_api_key_hook``, which
  re-reads the projected service-account token file once a minute (kubelet rotates it);
- kubeconfig ``exec`` plugin: kubernetes_asyncio runs the plugin once at load and only offers
  a polling loop (``config.refresh_token``) afterwards. Here the plugin is re-run on demand,
  through the loader's ``load_from_exec_plugin``, when its ``expirationTimestamp`` is within
  the loader's 5-minute skew, and after the apiserver answered 401 (client-go does the same:
  a 401 invalidates cached exec credentials). Credentials without an expiry are kept until
  a 401;
- kubeconfig ``tokenFile``: kubernetes_asyncio reads it once; client-go re-reads it about
  every minute, and so does warmwatch (through the loader's ``_load_user_token``).

Not refreshed: client certificates (from the kubeconfig or an exec plugin) are read once at
:func:`connect`; the deprecated ``gcp``/``oidc`` auth-providers get the token
kubernetes_asyncio loaded at start only.

Two sessions: the sidecar's own (with its client certificate, if any) and, created on first
use, one without any client certificate for requests made with a client's own credentials,
so that the sidecar's identity is never lent to a caller (see docs/design.md §6).

Connections are budgeted by purpose (:class:`ConnectionBudget`, docs/design.md §9): every
request names its :data:`Purpose`, and holds one of that purpose's slots from sending until
its answer is released. HTTP/1.1 has no multiplexing, so each open watch holds a connection
for as long as it runs; one shared pool let 100 reflector watches (or 100 passed-through
client watches) take every connection, after which nothing else reached the apiserver — not
passthrough, not a fill, not a TokenReview. With a budget per purpose no purpose can take the
others' connections. Past a budget a request fails at once with :class:`UpstreamBusy` (or,
for the short purposes, after a bounded wait); it is never queued without end.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import socket
import ssl
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import aiohttp
import orjson
import yarl
from multidict import CIMultiDict

from proxy.metrics import Metrics
from proxy.upstream.errors import (
    UpstreamAuthError,
    UpstreamBusy,
    UpstreamProtocolError,
    UpstreamSilent,
    UpstreamStatusError,
    UpstreamUnavailable,
)
from proxy.upstream.loaders import credential_loaders

__all__ = [
    "PURPOSES",
    "Body",
    "ConnectionBudget",
    "ConnectionSettings",
    "Credentials",
    "Params",
    "Purpose",
    "Target",
    "Upstream",
    "connect",
    "proxy_for",
]

logger = logging.getLogger(__name__)

#: Whose credentials a request carries: the sidecar's own, or the client's (forwarded as is).
Credentials = Literal["sidecar", "client"]

#: What a request is for; each purpose has its own share of connections (ConnectionBudget).
#: ``reflector``: fills, relists and watches of cached collections; ``passthrough``: client
#: requests forwarded as they are (watches, logs and exec included); ``review``: TokenReviews,
#: SubjectAccessReviews and SelfSubjectReviews; ``discovery``: discovery documents and health
#: checks, asked for clients or revalidated in the background.
Purpose = Literal["reflector", "passthrough", "review", "discovery"]
PURPOSES: Final[tuple[Purpose, ...]] = ("reflector", "passthrough", "review", "discovery")

#: Query parameters, percent-encoded by the upstream layer.
Params = Mapping[str, str] | Sequence[tuple[str, str]]

#: A path with its encoded query (``/api/v1/pods?limit=500``), or a path and parameters that
#: are encoded here.
Target = str | tuple[str, Params]

#: A request body: all at once, or streamed chunk by chunk.
Body = bytes | AsyncIterable[bytes]


@dataclass(frozen=True, kw_only=True)
class ConnectionBudget:
    """Upstream connections each purpose may hold at once (docs/design.md §9).

    The app sizes the two long-running purposes from the limits that already bound them
    (:meth:`sized`): every cached collection has one reflector, which holds at most one
    connection (its list, then its watch); every passed-through watch or stream holds a slot
    of ``--max-watches`` first. So those budgets are never the limit in practice; they keep
    either purpose, whatever it is asked for, from taking the connections of the others.
    """

    reflector: int = 500 + 16
    """Reflectors: one connection each (its list, then its watch) for ``--max-shapes``
    learned collections plus the configured ones, and 16 for the short requests of fills in
    progress (a fill counts its collection with a ``limit=1`` LIST for its progress log;
    ``ListLimiter`` runs 3 fills at once)."""

    passthrough: int = 1024 + 256
    """Passed-through requests: ``--max-watches`` long-running ones (watches, followed logs,
    exec) plus ``--max-requests`` short ones, each already admitted by the serving layer."""

    review: int = 16
    """TokenReviews and SubjectAccessReviews in flight. A review takes a millisecond or two
    at a healthy apiserver, so 16 connections answer thousands a second; decisions are
    cached and identical reviews merged, so a real client set needs a few."""

    discovery: int = 8
    """Discovery documents and health checks, asked for clients or revalidated. Copies answer
    most of them; kubectl's and client-go's discovery bursts are short requests."""

    wait: float = 5.0
    """How long a review or discovery request waits for a free slot before it fails with
    UpstreamBusy: those requests take milliseconds, so a burst queues briefly instead of
    failing (the apiserver's priority and fairness queues such bursts too). Reflector and
    passthrough requests never wait: their slots are held for as long as a watch runs."""

    @classmethod
    def sized(cls, *, shapes: int, watches: int, requests: int) -> ConnectionBudget:
        """The budget for ``shapes`` collections, ``watches`` long-running and ``requests``
        short client requests passed through at once."""
        return cls(reflector=shapes + _FILL_EXTRA, passthrough=watches + requests)

    def limit(self, purpose: Purpose) -> int:
        value: int = getattr(self, purpose)
        return value

    @property
    def total(self) -> int:
        return sum(self.limit(purpose) for purpose in PURPOSES)

    def __post_init__(self) -> None:
        for purpose in PURPOSES:
            if self.limit(purpose) < 1:
                raise ValueError(f"the {purpose} connection budget must be at least 1")


_FILL_EXTRA: Final = 16


class _Slots:
    """One purpose's connections: a count held and a bound (on the event loop's thread)."""

    def __init__(self, purpose: Purpose, *, limit: int, wait: float, metrics: Metrics) -> None:
        self.purpose: Final = purpose
        self.limit: Final = limit
        self._wait = wait
        self._free = asyncio.Semaphore(limit)
        self._held = metrics.upstream_connections.labels(purpose=purpose)
        self._busy = metrics.upstream_busy.labels(purpose=purpose)

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """Hold a slot while the block runs; :class:`UpstreamBusy` when none is free (at once,
        or after the purpose's wait)."""
        if self._free.locked():
            if self._wait <= 0:
                self._busy.inc()
                raise UpstreamBusy(self.purpose, limit=self.limit)
            try:
                async with asyncio.timeout(self._wait):
                    await self._free.acquire()
            except TimeoutError:
                self._busy.inc()
                raise UpstreamBusy(self.purpose, limit=self.limit) from None
        else:
            await self._free.acquire()  # does not block: a slot is free
        self._held.inc()
        try:
            yield
        finally:
            self._held.dec()
            self._free.release()


@dataclass(frozen=True, kw_only=True)
class ConnectionSettings:
    """How to find and talk to the apiserver."""

    kubeconfig: str | None = None
    """Path of a kubeconfig. None: in-cluster when ``KUBERNETES_SERVICE_HOST`` is set, else
    ``$KUBECONFIG`` (a list, like kubectl's), else ``~/.kube/config`` — the order kopf and
    client-go's ``BuildConfigFromFlags`` users expect."""

    context: str | None = None
    """kubeconfig context; None: the kubeconfig's ``current-context``."""

    connect_timeout: float = 10.0
    """TCP + TLS connect. A reachable apiserver connects in milliseconds; ten seconds covers a
    loaded node, and a blackholed address fails fast enough for discovery to fall back to the
    cache and for the breaker to count the failure."""

    request_timeout: float = 60.0
    """Total time for a non-streaming request, body included: the apiserver's own
    ``--request-timeout`` default is 60 s, after which it answers 504 anyway."""

    stream_idle_timeout: float | None = None
    """Read-idle limit for watches and other streams (no total limit). None: none by
    default, because a watch may legitimately be silent for its whole ``timeoutSeconds``
    (bookmarks included, for a quiet collection); reflectors pass their own and treat its
    expiry as a quiet watch (``ReflectorSettings.idle_timeout``)."""

    budget: ConnectionBudget = ConnectionBudget()
    """Connections by purpose. Every open watch holds one (HTTP/1.1 has no multiplexing)."""

    read_bufsize: int = 2**21
    """Read buffer, as kubernetes_asyncio: one watch event line may hold an object of up to
    etcd's ~1.5 MiB request limit."""

    max_header_size: int = 2**16
    """Response header line / field limit. aiohttp's 8 KiB is below what Go servers accept
    (1 MiB); long ``Warning`` headers must not break a request."""

    tcp_keepalive: float = 30.0
    """TCP keepalive on every upstream connection: probes after this long without traffic,
    then every 10 s, 3 of them — a peer that vanished without a reset (its node died, a NAT
    entry was dropped) is noticed within about a minute even on a quiet connection. client-go
    dials with a 30 s keepalive too."""

    token_file_reread: float = 60.0
    """Period for re-reading a kubeconfig ``tokenFile`` — client-go's cached file token
    source re-reads after one minute, so a rotated projected token is picked up."""

    incluster_token_path: str = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    """Service-account token (in-cluster); the kubelet's projected token is rotated. Where the
    kubelet mounts it, the path kubernetes_asyncio and client-go read by default."""

    incluster_ca_path: str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
    """Cluster CA bundle (in-cluster), mounted beside the token."""


# ------------------------------------------------------------------------ credentials


class _Auth:
    """Computes the sidecar's ``Authorization`` header for each request."""

    def __init__(
        self,
        *,
        configuration: Any,
        loader: Any | None,
        token_file_reread: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._configuration = configuration
        self._loader = loader
        self._clock = clock
        self._lock = asyncio.Lock()
        self._invalidated = False
        user = getattr(loader, "_user", None) if loader is not None else None
        self._uses_exec = user is not None and "exec" in user
        self._uses_token_file = (
            user is not None
            and not self._uses_exec
            and getattr(loader, "provider", None) is None
            and "tokenFile" in user
            and "token" not in user
        )
        self._token_file_reread = token_file_reread
        self._token_file_read_at = clock()

    async def header(self) -> str | None:
        """The current ``Authorization`` value, refreshed when due, or None (client
        certificates only, or no credentials at all)."""
        if self._loader is not None and (self._uses_exec or self._uses_token_file):
            await self._refresh_kubeconfig_credentials()
        try:
            # Runs the in-cluster refresh hook (token file re-read once a minute).
            value = await self._configuration.get_api_key_with_prefix("BearerToken")
        except Exception as error:
            raise UpstreamAuthError(f"cannot refresh the service-account token: {error}") from error
        if not value:
            return None
        # Token files often end with a newline; a header value must not.
        return str(value).strip() or None

    def invalidate(self) -> None:
        """The apiserver rejected the credentials (401): refresh them before the next
        request where that is possible (exec plugin, token file)."""
        self._invalidated = True

    async def _refresh_kubeconfig_credentials(self) -> None:
        loader = self._loader
        assert loader is not None
        async with self._lock:
            if self._uses_exec:
                if self._invalidated:
                    # Forget the expiry so that the loader re-runs the plugin.
                    with contextlib.suppress(AttributeError):
                        del loader.exec_plugin_expiry
                # Tokens without expirationTimestamp are kept until a 401, as client-go.
                if self._invalidated or hasattr(loader, "exec_plugin_expiry"):
                    try:
                        # Re-runs the plugin only when its expiry is within 5 minutes.
                        await loader.load_from_exec_plugin()
                    except Exception as error:
                        raise UpstreamAuthError(
                            f"exec credential plugin failed: {error}"
                        ) from error
                    self._store_token(loader)
            elif self._uses_token_file:
                now = self._clock()
                if self._invalidated or now - self._token_file_read_at >= self._token_file_reread:
                    try:
                        loader._load_user_token()
                    except Exception as error:
                        raise UpstreamAuthError(
                            f"cannot re-read the token file: {error}"
                        ) from error
                    self._token_file_read_at = now
                    self._store_token(loader)
            self._invalidated = False

    def _store_token(self, loader: Any) -> None:
        token = getattr(loader, "token", None)
        if token:
            self._configuration.api_key["BearerToken"] = token


# ----------------------------------------------------------------------- the upstream


class Upstream:
    """A connection to the apiserver. Create with :func:`connect`; close with :meth:`close`."""

    def __init__(
        self,
        *,
        base_url: str,
        settings: ConnectionSettings,
        metrics: Metrics,
        auth: _Auth,
        sidecar_ssl: ssl.SSLContext | None,
        anonymous_ssl: ssl.SSLContext | None,
        server_hostname: str | None = None,
        proxy: str | None = None,
    ) -> None:
        self.base_url: Final = base_url.rstrip("/")
        self.settings: Final = settings
        self.metrics: Final = metrics
        self._auth = auth
        self._anonymous_ssl = anonymous_ssl
        self._server_hostname = server_hostname
        self._proxy = proxy
        budget = settings.budget
        self._slots: Final = {
            purpose: _Slots(
                purpose,
                limit=budget.limit(purpose),
                wait=budget.wait if purpose in ("review", "discovery") else 0.0,
                metrics=metrics,
            )
            for purpose in PURPOSES
        }
        self._sidecar_session = self._new_session(sidecar_ssl)
        self._anonymous_session: aiohttp.ClientSession | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"Upstream({self.base_url!r})"

    def _new_session(self, ssl_context: ssl.SSLContext | None) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            # The purposes' slots bound what is in use; this only backs them up.
            limit=self.settings.budget.total,
            ssl=ssl_context if ssl_context is not None else True,
            socket_factory=functools.partial(_keepalive_socket, idle=self.settings.tcp_keepalive),
        )
        return aiohttp.ClientSession(
            connector=connector,
            # Not aiohttp's trust_env: it would also apply ~/.netrc credentials (lending them
            # to clients, or clashing with our Authorization) with a thread hop per request.
            # The proxy from the environment is resolved once, in connect().
            trust_env=False,
            read_bufsize=self.settings.read_bufsize,
            max_line_size=self.settings.max_header_size,
            max_field_size=self.settings.max_header_size,
            # Cookies are not part of the Kubernetes API; never mix them between callers.
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    def _session(self, credentials: Credentials) -> aiohttp.ClientSession:
        if self._closed:
            raise UpstreamUnavailable("the upstream connection is closed")
        if credentials == "sidecar":
            return self._sidecar_session
        if self._anonymous_session is None:
            self._anonymous_session = self._new_session(self._anonymous_ssl)
        return self._anonymous_session

    def url(self, target: Target, *, params: Params | None = None) -> yarl.URL:
        """The absolute URL of a target. A string target is taken as already encoded and
        sent byte for byte (passthrough must not re-encode a client's path or query);
        ``params`` (or the second half of a tuple target) are percent-encoded and appended."""
        if isinstance(target, str):
            path_and_query = target
        else:
            path_and_query, tuple_params = target
            path_and_query = _append_query(path_and_query, tuple_params)
        if params is not None:
            path_and_query = _append_query(path_and_query, params)
        if not path_and_query.startswith("/"):
            raise ValueError(f"request target must start with '/': {path_and_query!r}")
        return yarl.URL(self.base_url + path_and_query, encoded=True)

    def _timeout(self, *, stream: bool, timeout: float | None) -> aiohttp.ClientTimeout:
        def finite(value: float | None) -> float | None:
            return None if value is None or math.isinf(value) else value

        connect = self.settings.connect_timeout
        if stream:
            idle = self.settings.stream_idle_timeout if timeout is None else timeout
            return aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=finite(idle))
        total = self.settings.request_timeout if timeout is None else timeout
        return aiohttp.ClientTimeout(total=finite(total), sock_connect=connect)

    async def _headers(
        self, headers: Mapping[str, str] | None, *, credentials: Credentials
    ) -> CIMultiDict[str]:
        out: CIMultiDict[str] = CIMultiDict(headers or {})
        if credentials == "sidecar":
            out.popall("Authorization", None)
            value = await self._auth.header()
            if value:
                out["Authorization"] = value
        return out

    @contextlib.asynccontextmanager
    async def request(
        self,
        method: str,
        target: Target,
        *,
        params: Params | None = None,
        headers: Mapping[str, str] | None = None,
        data: Body | None = None,
        timeout: float | None = None,
        stream: bool = False,
        purpose: Purpose,
        credentials: Credentials = "sidecar",
        verb: str | None = None,
        raw: bool = False,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """Send a request; yield the response once its headers have arrived.

        - ``purpose``: whose connections it uses (:class:`ConnectionBudget`); the slot is
          held until the block ends. None free: :class:`UpstreamBusy`, before anything is
          sent.

        - ``timeout``: for ``stream=False`` the total time including the body (default
          ``request_timeout``); for ``stream=True`` (watches, logs, any long stream) the
          read-idle time between chunks (default ``stream_idle_timeout``), with no total.
          ``math.inf`` disables it. The connect timeout always applies. (An idle-read limit
          cannot be expressed with ``asyncio.timeout`` around the call, hence the parameter.)
        - ``credentials``: ``"sidecar"`` replaces any ``Authorization`` in ``headers`` with
          the sidecar's own; ``"client"`` sends ``headers`` as given, over a session without
          the sidecar's client certificate.
        - ``verb``: the label for ``warmwatch_upstream_requests_total`` (default: the method).
        - ``raw``: passthrough mode — the body is not decompressed, and aiohttp adds no
          ``Accept-Encoding``, ``User-Agent`` or ``Content-Type`` of its own.
        - Redirects are never followed: the answer is the apiserver's, as it sent it.

        Any status is yielded (check ``response.status``). A failure to connect or to get an
        answer raises :class:`UpstreamUnavailable` (:class:`UpstreamSilent` when a stream's
        read-idle limit passed); so does an aiohttp transport error, or a
        ``TimeoutError``, raised while the body is read inside the ``async with`` block, when
        it leaves the block (inside the block it is still aiohttp's; put your own
        ``asyncio.timeout`` around the block, not inside it). A 401 answer to
        the sidecar's credentials makes the next request refresh them.
        """
        async with (
            self._slots[purpose].hold(),
            self._open(
                method,
                self.url(target, params=params),
                headers=headers,
                data=data,
                client_timeout=self._timeout(stream=stream, timeout=timeout),
                credentials=credentials,
                verb=verb or method,
                raw=raw,
            ) as response,
        ):
            yield response

    @contextlib.asynccontextmanager
    async def _open(
        self,
        method: str,
        url: yarl.URL,
        *,
        headers: Mapping[str, str] | None,
        data: Body | None,
        client_timeout: aiohttp.ClientTimeout,
        credentials: Credentials,
        verb: str,
        raw: bool,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        label = verb.upper()
        session = self._session(credentials)
        request_headers = await self._headers(headers, credentials=credentials)
        skip: tuple[str, ...] = ("User-Agent", "Accept-Encoding", "Content-Type") if raw else ()
        try:
            response_cm = session.request(
                method,
                url,
                headers=request_headers,
                data=data,
                timeout=client_timeout,
                allow_redirects=False,
                auto_decompress=not raw,
                skip_auto_headers=skip,
                server_hostname=self._server_hostname,
                proxy=self._proxy,
            )
            response = await response_cm.__aenter__()
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            self.metrics.upstream_requests.labels(verb=label, code="error").inc()
            raise UpstreamUnavailable(_describe(error, self.base_url)) from error
        self.metrics.upstream_requests.labels(verb=label, code=str(response.status)).inc()
        if response.status == 401 and credentials == "sidecar":
            self._auth.invalidate()
        try:
            yield response
        except (aiohttp.ClientError, TimeoutError) as error:
            if isinstance(error, aiohttp.ClientResponseError):
                raise  # raised by the caller (raise_for_status), not a transport failure
            if isinstance(error, aiohttp.SocketTimeoutError):  # the read-idle limit
                raise UpstreamSilent(_describe(error, self.base_url)) from error
            raise UpstreamUnavailable(_describe(error, self.base_url)) from error
        finally:
            # Releases the connection to the pool, or closes it when the body was not
            # read to the end (a watch left early must not be reused).
            await response_cm.__aexit__(None, None, None)

    async def json_request(
        self,
        method: str,
        target: Target,
        *,
        params: Params | None = None,
        headers: Mapping[str, str] | None = None,
        data: bytes | None = None,
        json: Any = None,
        timeout: float | None = None,
        purpose: Purpose,
        credentials: Credentials = "sidecar",
        verb: str | None = None,
    ) -> dict[str, Any]:
        """A request whose answer is one JSON object; return it decoded.

        ``json`` is encoded with orjson and sent as ``application/json`` (or give ``data``
        and its ``Content-Type``). Codes >= 400 raise :class:`UpstreamStatusError` with the
        apiserver's Status; a success whose body is not a JSON object raises
        :class:`UpstreamProtocolError`.
        """
        request_headers: CIMultiDict[str] = CIMultiDict(headers or {})
        request_headers.setdefault("Accept", "application/json")
        if json is not None:
            if data is not None:
                raise ValueError("give either data or json, not both")
            data = orjson.dumps(json)
            request_headers.setdefault("Content-Type", "application/json")
        async with self.request(
            method,
            target,
            params=params,
            headers=request_headers,
            data=data,
            timeout=timeout,
            purpose=purpose,
            credentials=credentials,
            verb=verb,
        ) as response:
            body = await response.read()
            status = response.status
            if status >= 400:
                raise UpstreamStatusError.from_response(
                    code=status, body=body, headers=response.headers
                )
        try:
            decoded = orjson.loads(body)
        except orjson.JSONDecodeError as error:
            raise UpstreamProtocolError(
                f"{method} {target!r}: answer {status} is not JSON: {error}"
            ) from error
        if not isinstance(decoded, dict):
            raise UpstreamProtocolError(
                f"{method} {target!r}: answer {status} is not a JSON object"
            )
        return decoded

    @contextlib.asynccontextmanager
    async def websocket(
        self,
        target: str,
        *,
        headers: Mapping[str, str] | None = None,
        protocols: Sequence[str] = (),
        credentials: Credentials = "sidecar",
        verb: str = "CONNECT",
    ) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
        """Open a WebSocket to the apiserver (exec, attach, port-forward), on a passthrough
        slot (:class:`ConnectionBudget`) held until it closes.

        ``headers`` must not contain the handshake's own headers (``Sec-WebSocket-*``,
        ``Upgrade``, ``Connection``); aiohttp writes them. A refused handshake raises
        :class:`UpstreamStatusError` (the apiserver's answer code; its body is not available
        through aiohttp) and an unreachable apiserver :class:`UpstreamUnavailable`.
        """
        async with (
            self._slots["passthrough"].hold(),
            self._websocket(
                target, headers=headers, protocols=protocols, credentials=credentials, verb=verb
            ) as ws,
        ):
            yield ws

    @contextlib.asynccontextmanager
    async def _websocket(
        self,
        target: str,
        *,
        headers: Mapping[str, str] | None,
        protocols: Sequence[str],
        credentials: Credentials,
        verb: str,
    ) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
        session = self._session(credentials)
        request_headers = await self._headers(headers, credentials=credentials)
        try:
            ws = await session.ws_connect(
                self.url(target),
                protocols=tuple(protocols),
                headers=request_headers,
                # Heartbeats and auto-ping would inject frames of our own into the relay.
                autoping=False,
                autoclose=False,
                max_msg_size=0,
                server_hostname=self._server_hostname,
                proxy=self._proxy,
                timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=10.0),
            )
        except aiohttp.WSServerHandshakeError as error:
            self.metrics.upstream_requests.labels(verb=verb, code=str(error.status)).inc()
            if error.status == 401 and credentials == "sidecar":
                self._auth.invalidate()
            raise UpstreamStatusError.from_response(
                code=error.status, body=b"", headers=error.headers or {}
            ) from error
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            self.metrics.upstream_requests.labels(verb=verb, code="error").inc()
            raise UpstreamUnavailable(_describe(error, self.base_url)) from error
        self.metrics.upstream_requests.labels(verb=verb, code="101").inc()
        try:
            yield ws
        finally:
            await ws.close()

    async def close(self) -> None:
        """Close both sessions (idempotent)."""
        self._closed = True
        sessions = [self._sidecar_session, self._anonymous_session]
        self._anonymous_session = None
        for session in sessions:
            if session is not None and not session.closed:
                await session.close()


def _append_query(path_and_query: str, params: Params) -> str:
    pairs = list(params.items()) if isinstance(params, Mapping) else list(params)
    if not pairs:
        return path_and_query
    query = urllib.parse.urlencode(pairs, quote_via=urllib.parse.quote)
    separator = "&" if "?" in path_and_query else "?"
    return f"{path_and_query}{separator}{query}"


def _describe(error: BaseException, base_url: str) -> str:
    text = str(error) or type(error).__name__
    if isinstance(error, TimeoutError) and not str(error):
        text = "timed out"
    return f"apiserver {base_url} unavailable: {text}"


# ------------------------------------------------------------------------ connecting


async def connect(settings: ConnectionSettings, *, metrics: Metrics) -> Upstream:
    """Load the sidecar's credentials and return an :class:`Upstream` (no request is made).

    Order: ``settings.kubeconfig``; else in-cluster when ``KUBERNETES_SERVICE_HOST`` is set
    (falling back to a kubeconfig only if the service-account files are missing); else
    ``$KUBECONFIG``; else ``~/.kube/config``. Raises :class:`UpstreamAuthError` when no
    credentials can be loaded. The first call imports kubernetes_asyncio's loaders
    (:func:`~proxy.upstream.loaders.credential_loaders`).
    """
    k8s = credential_loaders()
    configuration = k8s.configuration()
    loader: Any | None = None
    if settings.kubeconfig is not None:
        loader = await _load_kubeconfig(settings.kubeconfig, settings=settings, into=configuration)
    elif os.environ.get(k8s.config.incluster_config.SERVICE_HOST_ENV_NAME):
        try:
            k8s.config.load_incluster_config(
                client_configuration=configuration,
                token_filename=settings.incluster_token_path,
                cert_filename=settings.incluster_ca_path,
            )
        except k8s.config.ConfigException as error:
            fallback = _default_kubeconfig()
            if fallback is None:
                raise UpstreamAuthError(f"in-cluster configuration: {error}") from error
            logger.warning("In-cluster configuration failed (%s); using %s", error, fallback)
            configuration = k8s.configuration()
            loader = await _load_kubeconfig(fallback, settings=settings, into=configuration)
    else:
        path = _default_kubeconfig()
        if path is None:
            raise UpstreamAuthError(
                "no kubeconfig: not in a cluster, $KUBECONFIG unset and ~/.kube/config missing"
            )
        loader = await _load_kubeconfig(path, settings=settings, into=configuration)

    base_url = str(configuration.host)
    sidecar_ssl: ssl.SSLContext | None = None
    anonymous_ssl: ssl.SSLContext | None = None
    if base_url.startswith("https:"):
        try:
            sidecar_ssl = _ssl_context(configuration, client_certificate=True)
            anonymous_ssl = _ssl_context(configuration, client_certificate=False)
        except (OSError, ssl.SSLError, ValueError) as error:
            raise UpstreamAuthError(f"cannot load TLS material: {error}") from error
    auth = _Auth(
        configuration=configuration,
        loader=loader,
        token_file_reread=settings.token_file_reread,
    )
    return Upstream(
        base_url=base_url,
        settings=settings,
        metrics=metrics,
        auth=auth,
        sidecar_ssl=sidecar_ssl,
        anonymous_ssl=anonymous_ssl,
        server_hostname=configuration.tls_server_name or None,
        proxy=proxy_for(base_url, configured=configuration.proxy or None),
    )


def _keepalive_socket(addr_info: Any, *, idle: float) -> socket.socket:
    """aiohttp's socket factory, with TCP keepalive (see ``ConnectionSettings.tcp_keepalive``)."""
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_KEEPIDLE"):  # Linux; elsewhere the system's defaults apply
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, max(1, int(idle)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
    return sock


def proxy_for(url: str, *, configured: str | None) -> str | None:
    """The HTTP proxy for the apiserver at ``url``, as client-go chooses it: the kubeconfig's
    ``proxy-url`` if set, else ``HTTPS_PROXY``/``HTTP_PROXY`` by scheme unless ``NO_PROXY``
    matches (Go's ``http.ProxyFromEnvironment``, which never proxies loopback hosts)."""
    if configured:
        return configured
    parsed = yarl.URL(url)
    host = parsed.host or ""
    if host in ("localhost", "127.0.0.1", "::1") or host.startswith("127."):
        return None
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parsed.scheme or "https")
    if not proxy or urllib.request.proxy_bypass(host):
        return None
    return proxy


def _default_kubeconfig() -> str | None:
    """``$KUBECONFIG`` (kept as a list; the loader merges it) or ``~/.kube/config``."""
    env = os.environ.get("KUBECONFIG")
    if env:
        return env
    path = Path.home() / ".kube" / "config"
    return str(path) if path.exists() else None


async def _load_kubeconfig(path: str, *, settings: ConnectionSettings, into: Any) -> Any:
    try:
        return await credential_loaders().config.load_kube_config(
            config_file=path,
            context=settings.context,
            client_configuration=into,
            # Never write refreshed tokens back into the user's (possibly read-only) file.
            persist_config=False,
        )
    except Exception as error:  # ConfigException, yaml errors, OSError, exec failures...
        raise UpstreamAuthError(f"cannot load kubeconfig {path}: {error}") from error


def _ssl_context(configuration: Any, *, client_certificate: bool) -> ssl.SSLContext:
    """An SSL context as kubernetes_asyncio's RESTClientObject builds it."""
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None)
    if client_certificate and configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, keyfile=configuration.key_file)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if getattr(configuration, "disable_strict_ssl_verification", False):
        context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    return context
