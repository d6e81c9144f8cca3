"""LIST ``continue`` tokens in the apiserver's format (apiserver ``pkg/storage/continue.go``).

A token is unpadded URL-safe base64 of the JSON ``{"v":"meta.k8s.io/v1","rv":N,"start":"K"}``:
``rv`` is the revision the paginated list is pinned to (``-1`` = "continue at the latest
revision", which the apiserver hands out with a 410 for a compacted token), ``start`` the
storage key to resume from, relative to the resource's key prefix.

Decoding reproduces ``storage.DecodeContinue`` and its errors; the apiserver answers them
with 400 BadRequest ``invalid continue token: <error>`` (``storage.ValidateListOptions``).
The texts match exactly for base64 errors, the token checks (``rv`` 0, empty ``start``,
path traversal, unknown ``v``), JSON syntax errors (Go's scanner, ported in ``gocompat``)
and JSON type errors.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, Final

import orjson

from proxy.kube.gocompat import INT64_MAX, INT64_MIN, go_json, go_json_syntax_error
from proxy.kube.status import StatusError

__all__ = ["CONTINUE_TOKEN_VERSION", "ContinueToken", "InvalidContinueToken"]

CONTINUE_TOKEN_VERSION: Final = "meta.k8s.io/v1"

_GENERIC: Final = "continue key is not valid"
_ALPHABET: Final = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


class InvalidContinueToken(ValueError):
    """A token ``DecodeContinue`` rejects; ``str()`` is Go's error text."""

    def to_status(self) -> StatusError:
        return StatusError.bad_request(f"invalid continue token: {self}")


@dataclass(frozen=True, kw_only=True, slots=True)
class ContinueToken:
    """A decoded continue token."""

    resource_version: int
    start_key: str

    @classmethod
    def decode(cls, value: str) -> ContinueToken:
        """``storage.DecodeContinue``; the returned ``start_key`` is cleaned and relative
        (no leading ``/``). Raises :class:`InvalidContinueToken`."""
        data = _raw_url_b64decode(value.encode("utf-8", "surrogatepass"))
        fields = _unmarshal_token(data)
        version = fields.get("v") or ""
        if version != CONTINUE_TOKEN_VERSION:
            raise InvalidContinueToken(
                f"{_GENERIC}: server does not recognize this encoded version {version}"
            )
        rv = fields.get("rv") or 0
        start = fields.get("start") or ""
        if rv == 0:
            raise InvalidContinueToken(
                f"{_GENERIC}: incorrect encoded start resourceVersion (version {CONTINUE_TOKEN_VERSION})"
            )
        if not start:
            raise InvalidContinueToken(
                f"{_GENERIC}: encoded start key empty (version {CONTINUE_TOKEN_VERSION})"
            )
        key = start if start.startswith("/") else "/" + start
        cleaned = _clean_rooted(key)
        if cleaned != key:  # refuse path traversal out of the resource prefix
            raise InvalidContinueToken(f"{_GENERIC}: {start}")
        return cls(resource_version=rv, start_key=cleaned[1:])

    def encode(self) -> str:
        """``storage.EncodeContinue`` (Go's JSON field order and escaping)."""
        text = (
            f'{{"v":"{CONTINUE_TOKEN_VERSION}","rv":{self.resource_version},'
            f'"start":{go_json(self.start_key)}}}'
        )
        return base64.urlsafe_b64encode(text.encode()).rstrip(b"=").decode("ascii")


def _raw_url_b64decode(src: bytes) -> bytes:
    """``base64.RawURLEncoding.DecodeString`` with Go's error offsets: CR/LF are skipped,
    anything else outside the alphabet (``=`` included) is illegal, and a final quantum of
    a single character is illegal."""
    clean = bytearray()
    quantum = 0
    for index, byte in enumerate(src):
        if byte in _ALPHABET:
            clean.append(byte)
            quantum = (quantum + 1) % 4
        elif byte not in (0x0A, 0x0D):
            raise InvalidContinueToken(f"{_GENERIC}: illegal base64 data at input byte {index}")
    if quantum == 1:
        # Go reports a dangling final character at ``si - j``: input length minus one.
        raise InvalidContinueToken(f"{_GENERIC}: illegal base64 data at input byte {len(src) - 1}")
    padded = bytes(clean) + b"=" * (-len(clean) % 4)
    return base64.urlsafe_b64decode(padded)


def _unmarshal_token(data: bytes) -> dict[str, Any]:
    """``json.Unmarshal`` into the token struct: keys match case-insensitively, later keys
    win, unknown keys are ignored, ``null`` leaves a field unset."""
    syntax_error = go_json_syntax_error(data)
    if syntax_error is not None:
        raise InvalidContinueToken(f"{_GENERIC}: {syntax_error}")
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError:  # valid for Go, which takes invalid UTF-8 as U+FFFD
        document = json.loads(data.decode("utf-8", "replace"))
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise InvalidContinueToken(
            f"{_GENERIC}: json: cannot unmarshal {_json_kind(document, numeric=False)} into Go "
            "value of type storage.continueToken"
        )
    fields: dict[str, Any] = {}
    first_error: str | None = None
    for raw_key, item in document.items():
        name = raw_key.lower()
        if name not in ("v", "rv", "start") or item is None:
            continue
        if name == "rv":
            ok = isinstance(item, int) and not isinstance(item, bool)
            ok = ok and INT64_MIN <= item <= INT64_MAX
            go_type = "int64"
        else:
            ok = isinstance(item, str)
            go_type = "string"
        if ok:
            fields[name] = item
        elif first_error is None:
            first_error = (
                f"json: cannot unmarshal {_json_kind(item, numeric=name == 'rv')} into Go struct field "
                f"continueToken.{name} of type {go_type}"
            )
    if first_error is not None:
        raise InvalidContinueToken(f"{_GENERIC}: {first_error}")
    return fields


def _json_kind(value: object, *, numeric: bool) -> str:
    """``UnmarshalTypeError.Value``: Go shows a number's literal only when the target is
    numeric (the literal did not fit it)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return f"number {orjson.dumps(value).decode()}" if numeric else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _clean_rooted(path: str) -> str:
    """Go's ``path.Clean`` for a path starting with ``/``."""
    out: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if out:
                out.pop()
            continue
        out.append(part)
    return "/" + "/".join(out)
