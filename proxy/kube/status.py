"""Kubernetes ``Status`` errors, built and rendered the way kube-apiserver does.

Every error the proxy returns to a client is a :class:`StatusError`: as an HTTP answer its
``code`` is the HTTP status and :meth:`StatusError.to_payload` the JSON body; inside a watch
stream it is the object of an ERROR event (``serve.rendering``). Constructors mirror
apimachinery's ``pkg/api/errors`` (``NewBadRequest``, ``NewInvalid``, ...) and apiserver's
``pkg/storage`` helpers (``NewTooLargeResourceVersionError``), with their exact texts.

Wire form (key order as Go's encoder writes ``metav1.Status``)::

    {"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
     "message":"...","reason":"...","details":{...},"code":422}

Empty ``message``/``reason`` are omitted (Go ``omitempty``). ``details`` is written whenever
the error has a :class:`Details`, even an empty one (``"details":{}``), and omitted when it
is None: each constructor allocates details exactly where apimachinery does (for example
``NewTooManyRequests`` always, ``NewBadRequest`` never).

The apiserver writes the compact form followed by a newline; when the client's ``Accept``
header cannot be satisfied it writes the indented form instead (no trailing newline):
:meth:`StatusError.to_http_body` gives either.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.kube import protobuf
from proxy.kube.field_errors import FieldError, aggregate_message
from proxy.kube.gocompat import go_json_bytes, go_quote
from proxy.kube.payloads import ListMeta, StatusCause, StatusDetails, StatusPayload

__all__ = [
    "Cause",
    "CauseType",
    "Details",
    "Reason",
    "StatusError",
    "qualified_name",
]


class Reason(enum.StrEnum):
    """``metav1.StatusReason`` values the proxy uses (``UNKNOWN`` is the empty reason)."""

    UNKNOWN = ""
    BAD_REQUEST = "BadRequest"
    UNAUTHORIZED = "Unauthorized"
    FORBIDDEN = "Forbidden"
    NOT_FOUND = "NotFound"
    METHOD_NOT_ALLOWED = "MethodNotAllowed"
    NOT_ACCEPTABLE = "NotAcceptable"
    CONFLICT = "Conflict"
    GONE = "Gone"
    EXPIRED = "Expired"
    INVALID = "Invalid"
    TOO_MANY_REQUESTS = "TooManyRequests"
    INTERNAL_ERROR = "InternalError"
    SERVICE_UNAVAILABLE = "ServiceUnavailable"
    TIMEOUT = "Timeout"
    SERVER_TIMEOUT = "ServerTimeout"


class CauseType(enum.StrEnum):
    """Non-field ``metav1.CauseType`` values (field ones are ``FieldErrorType``)."""

    RESOURCE_VERSION_TOO_LARGE = "ResourceVersionTooLarge"


@dataclass(frozen=True, kw_only=True, slots=True)
class Cause:
    """One ``metav1.StatusCause``. ``reason`` is Go's ``Type`` (a CauseType)."""

    reason: str = ""
    message: str = ""
    field: str = ""

    def to_payload(self) -> StatusCause:
        out: StatusCause = {}
        if self.reason:
            out["reason"] = self.reason
        if self.message:
            out["message"] = self.message
        if self.field:
            out["field"] = self.field
        return out

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> Cause:
        return cls(
            reason=str(payload.get("reason") or ""),
            message=str(payload.get("message") or ""),
            field=str(payload.get("field") or ""),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Details:
    """``metav1.StatusDetails``. For NotFound/Forbidden ``kind`` holds the *resource*
    (apimachinery puts ``GroupResource.Resource`` there); for Invalid it is the kind."""

    name: str = ""
    group: str = ""
    kind: str = ""
    uid: str = ""
    causes: tuple[Cause, ...] = ()
    retry_after_seconds: int = 0

    def to_payload(self) -> StatusDetails:
        out: StatusDetails = {}
        if self.name:
            out["name"] = self.name
        if self.group:
            out["group"] = self.group
        if self.kind:
            out["kind"] = self.kind
        if self.uid:
            out["uid"] = self.uid
        if self.causes:
            out["causes"] = [cause.to_payload() for cause in self.causes]
        if self.retry_after_seconds:
            out["retryAfterSeconds"] = self.retry_after_seconds
        return out

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> Details:
        causes = payload.get("causes") or ()
        return cls(
            name=str(payload.get("name") or ""),
            group=str(payload.get("group") or ""),
            kind=str(payload.get("kind") or ""),
            uid=str(payload.get("uid") or ""),
            causes=tuple(Cause.from_payload(c) for c in causes if isinstance(c, Mapping)),
            retry_after_seconds=int(payload.get("retryAfterSeconds") or 0),
        )


def qualified_name(*, group: str, name: str) -> str:
    """``schema.GroupResource.String()`` / ``GroupKind.String()``: ``name.group``, or ``name``
    for the core group."""
    return f"{name}.{group}" if group else name


class StatusError(Exception):
    """A failure ``metav1.Status``; ``str(err)`` is its message.

    ``continue_token`` goes to ``metadata.continue`` (an expired continue token's 410 carries
    a fresh token there).
    """

    __slots__ = ("code", "continue_token", "details", "message", "reason")

    def __init__(
        self,
        *,
        code: int,
        reason: str,
        message: str,
        details: Details | None = None,
        continue_token: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.continue_token = continue_token

    def __repr__(self) -> str:
        return f"StatusError(code={self.code}, reason={self.reason!r}, message={self.message!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StatusError):
            return NotImplemented
        return self.to_payload() == other.to_payload()

    def __hash__(self) -> int:
        return hash((self.code, self.reason, self.message))

    # ----------------------------------------------------------------- rendering

    @property
    def retry_after(self) -> int | None:
        """Seconds for the ``Retry-After`` header (from ``details.retryAfterSeconds``), or None."""
        if self.details is not None and self.details.retry_after_seconds > 0:
            return self.details.retry_after_seconds
        return None

    def to_payload(self) -> StatusPayload:
        """The Status object, keys in the apiserver's order."""
        metadata: ListMeta = {}
        if self.continue_token:
            metadata["continue"] = self.continue_token
        payload: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": metadata,
            "status": "Failure",
        }
        if self.message:
            payload["message"] = self.message
        if self.reason:
            payload["reason"] = self.reason
        if self.details is not None:
            payload["details"] = self.details.to_payload()
        payload["code"] = self.code
        return payload  # type: ignore[return-value]

    def to_json(self) -> bytes:
        """The Status as JSON, escaped like Go (``<>&``), without a trailing newline."""
        return go_json_bytes(self.to_payload())

    def to_protobuf(self) -> bytes:
        """The Status as the apiserver's protobuf serializer writes it: the ``k8s\\0`` prefix
        and a ``runtime.Unknown`` envelope around the message (an error body, or the object
        of a protobuf watch's ERROR event)."""
        details = self.details
        message = protobuf.status(
            status="Failure",
            message=self.message,
            reason=self.reason,
            code=self.code,
            continue_token=self.continue_token or "",
            details=None
            if details is None
            else protobuf.status_details(
                name=details.name,
                group=details.group,
                kind=details.kind,
                causes=((c.reason, c.message, c.field) for c in details.causes),
                retry_after_seconds=details.retry_after_seconds,
                uid=details.uid,
            ),
        )
        return protobuf.envelope(api_version="v1", kind="Status", raw=message)

    def to_http_body(self) -> bytes:
        """The HTTP error body byte for byte: compact JSON plus ``\\n``."""
        return self.to_json() + b"\n"

    @classmethod
    def from_payload(
        cls, payload: Mapping[str, Any], *, http_status: int | None = None
    ) -> StatusError:
        """Rebuild from an upstream Status (e.g. an ERROR event or an error body).

        A Status without ``code`` takes ``http_status`` (else 500), as apimachinery does.
        """
        details = payload.get("details")
        metadata = payload.get("metadata")
        token = metadata.get("continue") if isinstance(metadata, Mapping) else None
        return cls(
            code=int(payload.get("code") or http_status or 500),
            reason=str(payload.get("reason") or ""),
            message=str(payload.get("message") or ""),
            details=Details.from_payload(details) if isinstance(details, Mapping) else None,
            continue_token=str(token) if token else None,
        )

    # ------------------------------------------------------------- constructors

    @classmethod
    def bad_request(cls, message: str) -> StatusError:
        """400 BadRequest (``NewBadRequest``): the message is the caller's text as is."""
        return cls(code=400, reason=Reason.BAD_REQUEST, message=message)

    @classmethod
    def unauthorized(cls, message: str = "Unauthorized") -> StatusError:
        """401 Unauthorized. The authentication filter sends ``NewUnauthorized("Unauthorized")``;
        an empty message becomes ``not authorized`` as in ``NewUnauthorized``."""
        return cls(code=401, reason=Reason.UNAUTHORIZED, message=message or "not authorized")

    @classmethod
    def forbidden(cls, *, group: str, resource: str, name: str = "", reason: str) -> StatusError:
        """403 Forbidden (``NewForbidden``); ``reason`` is the wrapped error text."""
        qualified = qualified_name(group=group, name=resource)
        if not qualified:
            message = f"forbidden: {reason}"
        elif not name:
            message = f"{qualified} is forbidden: {reason}"
        else:
            message = f"{qualified} {go_quote(name)} is forbidden: {reason}"
        return cls(
            code=403,
            reason=Reason.FORBIDDEN,
            message=message,
            details=Details(group=group, kind=resource, name=name),
        )

    @classmethod
    def forbidden_request(
        cls,
        *,
        user: str,
        verb: str,
        group: str,
        resource: str,
        subresource: str = "",
        namespace: str = "",
        name: str = "",
        reason: str = "",
    ) -> StatusError:
        """403 for a denied authorization, worded as the apiserver's ``ForbiddenStatusError``:
        ``configmaps is forbidden: User "u" cannot list resource "configmaps" in API group ""
        in the namespace "ns"`` (or ``at the cluster scope``), plus ``: <reason>`` if given."""
        shown = f"{resource}/{subresource}" if subresource else resource
        scope = f"in the namespace {go_quote(namespace)}" if namespace else "at the cluster scope"
        text = (
            f"User {go_quote(user)} cannot {verb} resource {go_quote(shown)} "
            f"in API group {go_quote(group)} {scope}"
        )
        # The apiserver HTML-escapes the generated part (its "sanitizer").
        text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        if reason:
            text = f"{text}: {reason}"
        return cls.forbidden(group=group, resource=resource, name=name, reason=text)

    @classmethod
    def expired(cls, message: str, *, continue_token: str | None = None) -> StatusError:
        """410 Expired (``NewResourceExpired``)."""
        return cls(code=410, reason=Reason.EXPIRED, message=message, continue_token=continue_token)

    @classmethod
    def too_old_resource_version(
        cls, *, requested: int | str, oldest_resumable: int | str
    ) -> StatusError:
        """410 Expired for a watch/list from an RV the event window no longer covers:
        ``too old resource version: N (M)``.

        The watch cache prints as M the oldest RV it can still resume from, i.e. the RV of
        the oldest event it holds minus one (it answers 410 when N < M).
        """
        return cls.expired(f"too old resource version: {requested} ({oldest_resumable})")

    @classmethod
    def invalid(
        cls,
        *,
        group: str,
        kind: str,
        name: str = "",
        errors: Sequence[FieldError],
    ) -> StatusError:
        """422 Invalid (``NewInvalid``): one cause per field error (not deduplicated), message
        ``<Kind.group> "<name>" is invalid: <aggregate>``."""
        qualified = qualified_name(group=group, name=kind)
        causes = tuple(
            Cause(reason=str(error.type), message=error.body(), field=error.field)
            for error in errors
        )
        if errors:
            message = f"{qualified} {go_quote(name)} is invalid: {aggregate_message(errors)}"
        else:
            message = f"{qualified} {go_quote(name)} is invalid"
        return cls(
            code=422,
            reason=Reason.INVALID,
            message=message,
            details=Details(group=group, kind=kind, name=name, causes=causes),
        )

    @classmethod
    def invalid_list_options(cls, errors: Sequence[FieldError]) -> StatusError:
        """422 for query parameters rejected by ``ValidateListOptions``
        (kind ``ListOptions``, group ``meta.k8s.io``, empty name)."""
        return cls.invalid(group="meta.k8s.io", kind="ListOptions", errors=errors)

    @classmethod
    def too_many_requests(cls, message: str, *, retry_after_seconds: int) -> StatusError:
        """429 TooManyRequests (``NewTooManyRequests``): message as is, ``Retry-After`` from
        ``retryAfterSeconds``."""
        return cls(
            code=429,
            reason=Reason.TOO_MANY_REQUESTS,
            message=message,
            details=Details(retry_after_seconds=retry_after_seconds),
        )

    @classmethod
    def internal_error(cls, error: BaseException | str) -> StatusError:
        """500 InternalError (``NewInternalError``): ``Internal error occurred: <err>`` with the
        error text as the single cause."""
        text = str(error)
        return cls(
            code=500,
            reason=Reason.INTERNAL_ERROR,
            message=f"Internal error occurred: {text}",
            details=Details(causes=(Cause(message=text),)),
        )

    @classmethod
    def unknown(cls, *, code: int, message: str) -> StatusError:
        """A Status with no reason, as ``ErrorToAPIStatus`` writes for a plain Go error
        (code 500 in the apiserver)."""
        return cls(code=code, reason=Reason.UNKNOWN, message=message)

    @classmethod
    def service_unavailable(cls, message: str, *, retry_after_seconds: int = 0) -> StatusError:
        """503 ServiceUnavailable (``NewServiceUnavailable``); with ``retry_after_seconds``
        also ``Retry-After``, which makes client-go retry the request itself."""
        details = Details(retry_after_seconds=retry_after_seconds) if retry_after_seconds else None
        return cls(code=503, reason=Reason.SERVICE_UNAVAILABLE, message=message, details=details)

    @classmethod
    def timeout(
        cls,
        message: str,
        *,
        retry_after_seconds: int = 0,
        causes: Iterable[Cause] = (),
    ) -> StatusError:
        """504 Timeout (``NewTimeoutError``): the message gets the prefix ``Timeout: ``."""
        return cls(
            code=504,
            reason=Reason.TIMEOUT,
            message=f"Timeout: {message}",
            details=Details(retry_after_seconds=retry_after_seconds, causes=tuple(causes)),
        )

    @classmethod
    def too_large_resource_version(
        cls, *, requested: int | str, current: int | str, retry_after_seconds: int = 1
    ) -> StatusError:
        """504 for a not-older-than RV the server has not reached in time
        (``storage.NewTooLargeResourceVersionError``): message
        ``Timeout: Too large resource version: N, current: M``, cause
        ``ResourceVersionTooLarge``, ``Retry-After: 1`` as the watch cache sends."""
        return cls.timeout(
            f"Too large resource version: {requested}, current: {current}",
            retry_after_seconds=retry_after_seconds,
            causes=(
                Cause(
                    reason=CauseType.RESOURCE_VERSION_TOO_LARGE,
                    message="Too large resource version",
                ),
            ),
        )

    # ------------------------------------------------------------------ queries

    @property
    def is_too_large_resource_version(self) -> bool:
        """``storage.IsTooLargeResourceVersion``: a Timeout with a ResourceVersionTooLarge cause."""
        return (
            self.reason == Reason.TIMEOUT
            and self.details is not None
            and any(c.reason == CauseType.RESOURCE_VERSION_TOO_LARGE for c in self.details.causes)
        )

    @property
    def is_expired(self) -> bool:
        """410 Expired or the legacy Gone reason (``IsResourceExpired`` / ``IsGone``)."""
        return self.reason in (Reason.EXPIRED, Reason.GONE) or (
            self.code == 410 and self.reason == Reason.UNKNOWN
        )
