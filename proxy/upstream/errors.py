"""Errors of the upstream layer: what can go wrong when talking to the apiserver.

Callers never see aiohttp's or kubernetes_asyncio's exceptions: transport failures become
:class:`UpstreamUnavailable`, answers with a failure ``Status`` become
:class:`UpstreamStatusError`, credential problems :class:`UpstreamAuthError`, and an answer
that is not what the protocol promises :class:`UpstreamProtocolError`.
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Mapping
from typing import Any, Final

import orjson

from proxy.kube import protobuf
from proxy.kube.status import Reason, StatusError

__all__ = [
    "UpstreamAuthError",
    "UpstreamBusy",
    "UpstreamError",
    "UpstreamProtocolError",
    "UpstreamStatusError",
    "UpstreamUnavailable",
    "parse_retry_after",
    "reason_for_code",
]


class UpstreamError(Exception):
    """Base of every error the upstream layer raises."""


class UpstreamUnavailable(UpstreamError):
    """The apiserver could not be reached or did not answer: connection refused or reset,
    DNS failure, TLS handshake failure, timeout, or the connection dropped mid-answer."""


class UpstreamSilent(UpstreamUnavailable):
    """A stream delivered nothing for its read-idle limit. For a watch that is a quiet
    collection as often as a dead connection: the apiserver's bookmarks carry its watch
    cache's resourceVersion, which for a resource nobody writes can stay put for minutes."""


class UpstreamBusy(UpstreamError):
    """Every connection of the request's purpose is in use (``connecting.ConnectionBudget``):
    nothing was sent. Not the apiserver's fault: no breaker counts it."""

    def __init__(self, purpose: str, *, limit: int) -> None:
        super().__init__(f"all {limit} upstream connections for {purpose} requests are in use")
        self.purpose: Final = purpose


class UpstreamAuthError(UpstreamError):
    """The sidecar's own credentials could not be loaded or refreshed (missing kubeconfig,
    unreadable token file, failing exec plugin, ...)."""


class UpstreamProtocolError(UpstreamError):
    """The apiserver answered, but not with what the protocol promises (e.g. a 200 whose
    body is not a JSON object)."""


class UpstreamStatusError(UpstreamError):
    """The apiserver answered with HTTP code >= 400 (normally a failure ``Status``).

    ``status`` is the Status payload as the apiserver sent it; when the body was not a
    Status (a proxy's HTML page, an empty 503) one is synthesized the way client-go's
    ``newUnstructuredResponseError`` does, so ``status`` always has kind, code and reason.
    ``retry_after`` is in seconds, from the ``Retry-After`` header or else
    ``details.retryAfterSeconds`` (None when neither is present).
    """

    def __init__(
        self,
        *,
        code: int,
        reason: str,
        message: str,
        status: Mapping[str, Any],
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{code} {reason}: {message}" if reason else f"{code}: {message}")
        self.code: Final = code
        self.reason: Final = reason
        self.message: Final = message
        self.status: Final = dict(status)
        self.retry_after: Final = retry_after

    def __repr__(self) -> str:
        return (
            f"UpstreamStatusError(code={self.code}, reason={self.reason!r}, "
            f"message={self.message!r}, retry_after={self.retry_after!r})"
        )

    def to_status_error(self) -> StatusError:
        """The same failure as a StatusError, to answer a client with it verbatim."""
        return StatusError.from_payload(self.status, http_status=self.code)

    @property
    def is_expired(self) -> bool:
        """410 Expired / Gone (the reflector relists on it)."""
        return self.to_status_error().is_expired

    @property
    def is_too_large_resource_version(self) -> bool:
        """504 with cause ResourceVersionTooLarge."""
        return self.to_status_error().is_too_large_resource_version

    @classmethod
    def from_response(
        cls,
        *,
        code: int,
        body: bytes,
        headers: Mapping[str, str],
        now: float | None = None,
    ) -> UpstreamStatusError:
        """Build from an HTTP answer with code >= 400 (body already read)."""
        status: dict[str, Any] | None = None
        if body.startswith(protobuf.PREFIX):  # the answer to a protobuf request
            try:
                envelope = protobuf.unwrap(body)
                if envelope.kind == "Status":
                    pb_code, reason, message = protobuf.status_fields(envelope.raw)
                    status = {"kind": "Status", "apiVersion": "v1", "metadata": {}}
                    status |= {"status": "Failure", "message": message, "reason": reason}
                    status["code"] = pb_code
            except protobuf.ProtobufError:
                status = None
        elif body:
            try:
                decoded = orjson.loads(body)
            except orjson.JSONDecodeError:
                decoded = None
            if isinstance(decoded, dict) and decoded.get("kind") == "Status":
                status = decoded
        if status is None:
            status = _unstructured_status(code=code, body=body)
        # A Status without a code takes the HTTP code (apimachinery does the same).
        status_code = status.get("code")
        effective_code = status_code if isinstance(status_code, int) and status_code else code
        retry_after = parse_retry_after(headers.get("Retry-After"), now=now)
        if retry_after is None:
            details = status.get("details")
            if isinstance(details, dict):
                seconds = details.get("retryAfterSeconds")
                if isinstance(seconds, int | float) and seconds > 0:
                    retry_after = float(seconds)
        return cls(
            code=effective_code,
            reason=str(status.get("reason") or ""),
            message=str(status.get("message") or ""),
            status=status,
            retry_after=retry_after,
        )


_REASONS: Final[Mapping[int, str]] = {
    400: Reason.BAD_REQUEST,
    401: Reason.UNAUTHORIZED,
    403: Reason.FORBIDDEN,
    404: Reason.NOT_FOUND,
    405: Reason.METHOD_NOT_ALLOWED,
    406: Reason.NOT_ACCEPTABLE,
    409: Reason.CONFLICT,
    410: Reason.GONE,
    422: Reason.INVALID,
    429: Reason.TOO_MANY_REQUESTS,
    500: Reason.INTERNAL_ERROR,
    503: Reason.SERVICE_UNAVAILABLE,
    504: Reason.SERVER_TIMEOUT,
}

# client-go's texts for a non-Status error answer (rest.Request.newUnstructuredResponseError
# via errors.NewGenericServerResponse).
_MESSAGES: Final[Mapping[int, str]] = {
    400: "the server rejected our request for an unknown reason",
    401: "the server has asked for the client to provide credentials",
    403: "the server does not allow access to the requested resource",
    404: "the server could not find the requested resource",
    405: "the server does not allow this method on the requested resource",
    406: "the server was unable to respond with a content type that the client supports",
    409: "the server reported a conflict",
    410: "the server has asked for the client to retry",
    422: "the server rejected our request due to an error in our request",
    429: "the server has received too many requests and has asked us to try again later",
    500: "an error on the server has prevented the request from succeeding",
    503: "the server is currently unable to handle the request",
    504: "the server was unable to return a response in the time allotted, but may still be processing the request",
}


def reason_for_code(code: int) -> str:
    """The Status reason the apiserver uses for an HTTP code ("" when there is none)."""
    return str(_REASONS.get(code, Reason.UNKNOWN))


def _unstructured_status(*, code: int, body: bytes) -> dict[str, Any]:
    message = _MESSAGES.get(
        code, f"an error on the server ({code}) has prevented the request from succeeding"
    )
    text = body.decode("utf-8", "replace").strip()
    if text:
        message = f"{message} ({text[:512]})"
    status: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
    }
    reason = reason_for_code(code)
    if reason:
        status["reason"] = reason
    status["code"] = code
    return status


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds from a ``Retry-After`` header: delay-seconds or an HTTP-date (RFC 9110).

    The apiserver sends whole seconds; a date in the past gives 0. Anything unparsable is
    ignored (None), as Go's client does.
    """
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    if value.isdigit():
        return float(int(value))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    delay = when.timestamp() - (time.time() if now is None else now)
    if math.isnan(delay):
        return None
    return max(0.0, delay)
