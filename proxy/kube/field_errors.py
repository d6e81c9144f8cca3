"""Field validation errors, rendered like apimachinery's ``field.Error``.

A 422 Invalid Status lists one cause per field error (``reason`` = the error type,
``message`` = the error body, ``field`` = the path) and its message joins the errors'
``Error()`` strings: ``<field>: <Type>[: <bad value>][: <detail>]``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from proxy.kube.gocompat import go_json, go_quote

__all__ = ["FieldError", "FieldErrorType", "aggregate_message"]


class FieldErrorType(enum.StrEnum):
    """``field.ErrorType``; the value is the Status cause ``reason`` (metav1.CauseType)."""

    NOT_FOUND = "FieldValueNotFound"
    REQUIRED = "FieldValueRequired"
    DUPLICATE = "FieldValueDuplicate"
    INVALID = "FieldValueInvalid"
    NOT_SUPPORTED = "FieldValueNotSupported"
    FORBIDDEN = "FieldValueForbidden"
    TOO_LONG = "FieldValueTooLong"
    TOO_MANY = "FieldValueTooMany"
    INTERNAL = "InternalError"
    TYPE_INVALID = "FieldValueTypeInvalid"

    @property
    def label(self) -> str:
        """The human text ``ErrorType.String()`` puts in messages."""
        return _LABELS[self]


_LABELS = {
    FieldErrorType.NOT_FOUND: "Not found",
    FieldErrorType.REQUIRED: "Required value",
    FieldErrorType.DUPLICATE: "Duplicate value",
    FieldErrorType.INVALID: "Invalid value",
    FieldErrorType.NOT_SUPPORTED: "Unsupported value",
    FieldErrorType.FORBIDDEN: "Forbidden",
    FieldErrorType.TOO_LONG: "Too long",
    FieldErrorType.TOO_MANY: "Too many",
    FieldErrorType.INTERNAL: "Internal error",
    FieldErrorType.TYPE_INVALID: "Invalid value",
}

# Types whose body never shows the bad value (field.Error.ErrorBody).
_VALUELESS = frozenset(
    {
        FieldErrorType.REQUIRED,
        FieldErrorType.FORBIDDEN,
        FieldErrorType.TOO_LONG,
        FieldErrorType.INTERNAL,
    }
)


@dataclass(frozen=True, kw_only=True, slots=True)
class FieldError:
    """One ``field.Error``.

    ``bad_value`` is already rendered the way Go prints it (``%q`` for a Go ``string``,
    JSON for named string types and slices), or None when the body omits it.
    """

    type: FieldErrorType
    field: str
    bad_value: str | None = None
    detail: str = ""

    @classmethod
    def forbidden(cls, *, field: str, detail: str) -> FieldError:
        return cls(type=FieldErrorType.FORBIDDEN, field=field, detail=detail)

    @classmethod
    def invalid(cls, *, field: str, value: str, detail: str) -> FieldError:
        """``field.Invalid`` with a plain Go string value (rendered with ``%q``)."""
        return cls(
            type=FieldErrorType.INVALID, field=field, bad_value=go_quote(value), detail=detail
        )

    @classmethod
    def not_supported(cls, *, field: str, value: str, supported: Sequence[str]) -> FieldError:
        """``field.NotSupported``. The value is rendered as JSON, as Go does for the named
        string types this is used with (``metav1.ResourceVersionMatch``)."""
        detail = ""
        if supported:
            detail = "supported values: " + ", ".join(go_quote(item) for item in supported)
        return cls(
            type=FieldErrorType.NOT_SUPPORTED,
            field=field,
            bad_value=go_json(value),
            detail=detail,
        )

    def body(self) -> str:
        """``ErrorBody()``: what a Status cause carries as ``message``."""
        text = self.type.label
        if self.type not in _VALUELESS and self.bad_value is not None:
            text = f"{text}: {self.bad_value}"
        if self.detail:
            text = f"{text}: {self.detail}"
        return text

    def __str__(self) -> str:
        """``Error()``: ``<field>: <body>``."""
        return f"{self.field}: {self.body()}"


def aggregate_message(errors: Iterable[object]) -> str:
    """``utilerrors.Aggregate.Error()``: duplicates dropped, one error as is, several as
    ``[a, b]``. Empty input gives ``""``."""
    seen: dict[str, None] = {}
    for error in errors:
        seen.setdefault(str(error), None)
    messages = list(seen)
    if len(messages) == 1:
        return messages[0]
    if not messages:
        return ""
    return "[" + ", ".join(messages) + "]"
