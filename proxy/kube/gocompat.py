"""Go-compatible primitives, so the proxy's error texts match the apiserver's byte for byte.

The apiserver builds its messages with Go's ``strconv.Quote`` (``%q``), ``encoding/json`` and
``strconv.ParseInt``/``ParseUint``. The functions here reproduce exactly the parts of their
behaviour that show up in list/watch error messages. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "UINT64_MAX",
    "GoNumError",
    "go_json",
    "go_json_bytes",
    "go_quote",
    "parse_int64",
    "parse_uint64",
]

UINT64_MAX = (1 << 64) - 1
INT64_MAX = (1 << 63) - 1
INT64_MIN = -(1 << 63)

_DIGITS = frozenset("0123456789")

_QUOTE_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    "\\": "\\\\",
    '"': '\\"',
}


def go_quote(text: str) -> str:
    """Go's ``strconv.Quote`` (what ``%q`` prints for a string).

    Printable runes are kept (Go's ``unicode.IsPrint`` and Python's ``str.isprintable`` agree:
    letters, marks, numbers, punctuation, symbols and the ASCII space); the rest are escaped
    as ``\\a``-style, ``\\xHH`` (ASCII), ``\\uHHHH`` or ``\\UHHHHHHHH``.
    """
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    out = ['"']
    for ch in text:
        escaped = _QUOTE_ESCAPES.get(ch)
        if escaped is not None:
            out.append(escaped)
        elif ch.isprintable():
            out.append(ch)
        else:
            code = ord(ch)
            if code < 0x80:
                out.append(f"\\x{code:02x}")
            elif code < 0x10000:
                out.append(f"\\u{code:04x}")
            else:
                out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


_JSON_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\b": "\\b",
    "\f": "\\f",
    # encoding/json escapes HTML-significant characters by default (json.Marshal).
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}


def _go_json_string(text: str) -> str:
    out = ['"']
    for ch in text:
        escaped = _JSON_ESCAPES.get(ch)
        if escaped is not None:
            out.append(escaped)
        elif ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def go_json(value: str | Sequence[str]) -> str:
    """Go's ``json.Marshal`` of a string or a string slice (HTML-escaping included).

    field.Error renders bad values that are not a plain Go ``string`` this way, for example a
    ``metav1.ResourceVersionMatch`` or a ``[]string``.
    """
    if isinstance(value, str):
        return _go_json_string(value)
    return "[" + ",".join(_go_json_string(item) for item in value) + "]"


_HTML_UNSAFE = (
    (b"<", b"\\u003c"),
    (b">", b"\\u003e"),
    (b"&", b"\\u0026"),
    ("\u2028".encode(), b"\\u2028"),
    ("\u2029".encode(), b"\\u2029"),
)


def go_json_bytes(value: Any, *, indent: bool = False) -> bytes:
    """Serialise like the apiserver's JSON encoder: compact (or, with ``indent``, indented by
    two spaces as ``json.MarshalIndent``), and with ``<``, ``>``, ``&``, U+2028 and U+2029
    escaped as ``\\u003c``-style sequences (Go's default HTML escaping).

    Those characters can only occur inside JSON strings, so replacing them in orjson's output
    is exact. Key order is the caller's (insertion order).
    """
    raw = orjson.dumps(value, option=orjson.OPT_INDENT_2 if indent else None)
    for plain, escaped in _HTML_UNSAFE:
        if plain in raw:
            raw = raw.replace(plain, escaped)
    return raw


class GoNumError(ValueError):
    """A ``*strconv.NumError``: its ``str`` is the Go error text.

    ``reason`` is ``"invalid syntax"`` or ``"value out of range"``.
    """

    def __init__(self, *, func: str, text: str, reason: str) -> None:
        self.func = func
        self.text = text
        self.reason = reason
        super().__init__(f"strconv.{func}: parsing {go_quote(text)}: {reason}")


def _scan_decimal(*, func: str, original: str, digits: str, limit: int) -> int:
    """Accumulate ASCII digits the way Go's ``ParseUint`` does: the first bad character is a
    syntax error, and exceeding ``limit`` is a range error as soon as it happens (so
    ``"99999999999999999999x"`` is out of range, not invalid syntax)."""
    if not digits:
        raise GoNumError(func=func, text=original, reason="invalid syntax")
    value = 0
    for ch in digits:
        if ch not in _DIGITS:
            raise GoNumError(func=func, text=original, reason="invalid syntax")
        value = value * 10 + (ord(ch) - 48)
        if value > limit:
            raise GoNumError(func=func, text=original, reason="value out of range")
    return value


def parse_uint64(text: str) -> int:
    """Go's ``strconv.ParseUint(text, 10, 64)``: ASCII digits only (leading zeros allowed,
    no sign, no underscores), at most 2^64-1."""
    return _scan_decimal(func="ParseUint", original=text, digits=text, limit=UINT64_MAX)


def parse_int64(text: str) -> int:
    """Go's ``strconv.ParseInt(text, 10, 64)``: an optional ``+``/``-`` then ASCII digits."""
    negative = text.startswith("-")
    digits = text[1:] if text[:1] in ("+", "-") else text
    # ParseInt scans the magnitude as a uint64 first, then checks the int64 bounds.
    magnitude = _scan_decimal(func="ParseInt", original=text, digits=digits, limit=UINT64_MAX)
    if negative:
        if magnitude > -INT64_MIN:
            raise GoNumError(func="ParseInt", text=text, reason="value out of range")
        return -magnitude
    if magnitude > INT64_MAX:
        raise GoNumError(func="ParseInt", text=text, reason="value out of range")
    return magnitude
