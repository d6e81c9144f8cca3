"""Forwarding a request to the apiserver (passthrough's upstream half): the answer's status,
headers and body as they arrive, for ``proxy.serve.relaying`` to write to the client.

Credentials (docs/design.md §6):

- ``"sidecar"``: the client's ``Authorization`` is dropped and the sidecar's own credentials
  are used, as ``kubectl proxy`` does;
- ``"client"``: the client's ``Authorization`` (and impersonation headers) are forwarded
  unchanged and the sidecar adds nothing — not its token, and not its client certificate
  (such requests use a session without it).

Protocol quirks handled here:

- Hop-by-hop headers (RFC 9110 §7.6.1) and those named in ``Connection`` are not forwarded;
  neither is ``Host`` (aiohttp writes the apiserver's) nor ``Expect`` (aiohttp's server
  already answered ``100-continue`` to the client). ``Content-Length`` is kept, so a body
  with a known length is not re-chunked.
- Content encodings are passed through untouched (no decompression, no ``Accept-Encoding``
  of our own), so ``Content-Length`` and ``Content-Encoding`` stay true.
- Long-running requests (watches, ``follow``ing logs, exec/attach/portforward/proxy) get no
  read timeout (the caller says which requests are: ``proxy.serve.relaying``).
- While the apiserver cannot be reached (no connection, or the circuit breaker is open: then
  without even trying, so nothing waits for a connect timeout), :class:`UpstreamUnavailable`
  is raised at once; the serving layer answers the client (a 503 ServiceUnavailable Status
  with ``Retry-After: 1``: client-go retries such a request within its own timeout, and
  controllers requeue what still fails).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Final

from multidict import CIMultiDict, MultiMapping

from proxy.upstream.connecting import Credentials, Purpose, Upstream
from proxy.upstream.resilience import CircuitBreaker, check_reachable

#: RFC 9110 §7.6.1 connection-specific headers (``Proxy-*`` is matched by prefix).
HOP_BY_HOP: Final = frozenset(
    {"connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade"}
)

#: Request headers that are never forwarded besides the hop-by-hop ones.
_REQUEST_DROPPED: Final = frozenset({"host", "expect"})

#: Headers of the WebSocket handshake; aiohttp's client writes its own.
_WEBSOCKET_HANDSHAKE: Final = frozenset(
    {
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-extensions",
        "sec-websocket-protocol",
        "sec-websocket-accept",
    }
)


@dataclass(frozen=True, kw_only=True)
class PassthroughSettings:
    idle_timeout: float = 60.0
    """Read-idle limit for ordinary (not long-running) requests: the apiserver itself gives up
    on such a request after 60 s (``--request-timeout``), so a longer silence means trouble.
    There is no total limit: a big LIST to a slow reader may take longer than that."""

    discovery_max_bytes: int = 64 * 2**20
    """Discovery documents larger than this are passed through but not cached. The largest
    real one, ``/openapi/v2`` of a cluster with many CRDs, is tens of MiB; the limit bounds
    the memory a document held for storing may take."""

    write_body_max: int = 4 * 2**20
    """Answers to writes up to this size are kept for the write observer (read your writes
    needs the written resourceVersion). An object is at most ~1.5 MiB (etcd's request
    limit), so only answers that are not one object are larger."""


# ------------------------------------------------------------------------- headers


def forwarded_request_headers(
    headers: MultiMapping[str], *, websocket: bool = False
) -> CIMultiDict[str]:
    """A client's request headers as they are forwarded (see the module docstring)."""
    named = _connection_tokens(headers.getall("Connection", []))
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        lower = name.lower()
        if (
            lower in HOP_BY_HOP
            or lower in _REQUEST_DROPPED
            or lower in named
            or lower.startswith("proxy-")
            or (websocket and lower in _WEBSOCKET_HANDSHAKE)
        ):
            continue
        out.add(name, value)
    return out


def forwarded_response_headers(headers: MultiMapping[str]) -> list[tuple[str, str]]:
    named = _connection_tokens(headers.getall("Connection", []))
    return [
        (name, value)
        for name, value in headers.items()
        if name.lower() not in HOP_BY_HOP
        and name.lower() not in named
        and not name.lower().startswith("proxy-")
    ]


def _connection_tokens(values: Iterable[str]) -> frozenset[str]:
    return frozenset(
        token.strip().lower() for value in values for token in value.split(",") if token.strip()
    )


# ------------------------------------------------------------------------- forwarding


def count(upstream: Upstream, verb: str, code: int | str) -> None:
    upstream.metrics.passthrough_requests.labels(verb=verb, code=str(code)).inc()


@dataclass(frozen=True, kw_only=True, slots=True)
class Answer:
    """The apiserver's answer to a forwarded request, as it arrives."""

    status: int
    reason: str | None
    headers: list[tuple[str, str]]
    """Its end-to-end headers (:func:`forwarded_response_headers`)."""
    body: AsyncIterator[bytes]
    """Its body, chunk by chunk as it arrives, still in its content coding. A failure while
    it is read raises :class:`UpstreamUnavailable` when it leaves the :func:`forwarded`
    block, as does any aiohttp ``ClientError`` or ``TimeoutError`` raised in the block: the
    caller turns its own such errors into others first."""


@contextlib.asynccontextmanager
async def forwarded(
    *,
    upstream: Upstream,
    method: str,
    target: str,
    headers: CIMultiDict[str],
    body: AsyncIterable[bytes] | None,
    long_running: bool,
    credentials: Credentials,
    breaker: CircuitBreaker | None,
    settings: PassthroughSettings,
    purpose: Purpose,
) -> AsyncIterator[Answer]:
    """Send ``method target`` (the raw path and query) with ``headers`` (already
    :func:`forwarded_request_headers`) and ``body``; yield the answer once its headers have
    arrived, counted in ``warmwatch_passthrough_requests_total``.

    Raises :class:`UpstreamUnavailable` when the apiserver cannot be reached (at once while
    ``breaker`` is open), :class:`UpstreamBusy` when no connection of ``purpose`` is free.
    ``long_running``: no read-idle limit (else ``settings.idle_timeout``)."""
    check_reachable(breaker)
    verb = method.upper()
    async with upstream.request(
        method,
        target,
        headers=headers,
        data=body,
        stream=True,
        timeout=math.inf if long_running else settings.idle_timeout,
        purpose=purpose,
        credentials=credentials,
        verb=verb,
        raw=True,
    ) as response:
        count(upstream, verb, response.status)
        yield Answer(
            status=response.status,
            reason=response.reason,
            headers=forwarded_response_headers(response.headers),
            body=response.content.iter_any(),
        )
