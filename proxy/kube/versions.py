"""resourceVersion rules: KEP-5504 comparison and the apiserver's query parsing.

Two different notions, both needed:

* **Comparable** (KEP-5504, ``k8s.io/apimachinery/pkg/util/resourceversion``): an RV is
  *well-formed* when it is a non-empty string of ASCII digits with no leading zero. ``"0"`` is
  therefore *not* well-formed: it is the special "any" value of list/watch and never a live
  RV. Two well-formed RVs compare as integers of unbounded size: shorter is smaller, equal
  lengths compare lexically. Anything else is opaque and compares for equality only.
* **Accepted in a query** (``storage.APIObjectVersioner.ParseResourceVersion``): ``""`` and
  ``"0"`` mean 0; otherwise Go's ``strconv.ParseUint(rv, 10, 64)`` must succeed, so leading
  zeros are *accepted* (``"007"`` is 7) while signs, spaces and values above 2^64-1 are not.

How a bad query RV is reported depends on the verb (read from the v1.37 apiserver):

* LIST: ``storage.ValidateListOptions`` → 400 BadRequest ``invalid resource version:
  resourceVersion: Invalid value: "abc": strconv.ParseUint: parsing "abc": invalid syntax``.
* WATCH: the cacher returns the bare ``storage.InvalidError``, which reaches
  ``ErrorToAPIStatus`` as a non-Status error: HTTP 500, no reason, message
  ``resourceVersion: Invalid value: "abc": strconv.ParseUint: parsing "abc": invalid syntax``.
"""

from __future__ import annotations

from proxy.kube.field_errors import FieldError
from proxy.kube.gocompat import GoNumError, parse_uint64
from proxy.kube.status import StatusError

__all__ = [
    "InvalidResourceVersion",
    "compare",
    "is_well_formed",
    "parse_query_resource_version",
]


def is_well_formed(rv: str) -> bool:
    """KEP-5504 well-formed: ASCII digits, no leading zero (so not ``"0"``, not ``""``)."""
    return rv.isascii() and rv.isdigit() and rv[0] != "0"


def compare(a: str, b: str) -> int | None:
    """Compare two RVs: -1, 0 or 1 when both are well-formed, None when either is not.

    None means "not comparable": callers fall back to exact matching (e.g. finding the RV in
    an event log). Equal strings that are not well-formed are still None.
    """
    if not (is_well_formed(a) and is_well_formed(b)):
        return None
    if len(a) != len(b):
        return -1 if len(a) < len(b) else 1
    if a == b:
        return 0
    return -1 if a < b else 1


class InvalidResourceVersion(ValueError):
    """A query ``resourceVersion`` the apiserver cannot parse."""

    def __init__(self, *, value: str, parse_error: GoNumError) -> None:
        self.value = value
        self.field_error = FieldError.invalid(
            field="resourceVersion", value=value, detail=str(parse_error)
        )
        super().__init__(str(self.field_error))

    def to_status(self, *, watch: bool) -> StatusError:
        """The apiserver's answer: 400 for a LIST, a reasonless 500 for a WATCH (see module doc)."""
        if watch:
            return StatusError.unknown(code=500, message=str(self.field_error))
        return StatusError.bad_request(f"invalid resource version: {self.field_error}")


def parse_query_resource_version(value: str) -> int:
    """Parse a query RV as the apiserver does: ``""``/``"0"`` → 0, else uint64.

    Raises :class:`InvalidResourceVersion`.
    """
    if value in ("", "0"):
        return 0
    try:
        return parse_uint64(value)
    except GoNumError as exc:
        raise InvalidResourceVersion(value=value, parse_error=exc) from None
