"""Go-compatible primitives, so the proxy's error texts match the apiserver's byte for byte.

The apiserver builds its messages with Go's ``strconv.Quote`` (``%q``), ``encoding/json`` and
``strconv.ParseInt``/``ParseUint``. The functions here reproduce exactly the parts of their
behaviour that show up in list/watch error messages. Nothing here does I/O.
"""

from __future__ import annotations

import re
from typing import Any, Final

import orjson

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "UINT64_MAX",
    "GoNumError",
    "go_json",
    "go_json_bytes",
    "go_quote",
    "origin_form",
    "parse_bool",
    "parse_duration",
    "parse_int64",
    "parse_query",
    "parse_uint64",
    "query_unescape",
    "valid_escapes",
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


def go_json(value: str) -> str:
    """Go's ``json.Marshal`` of a string (HTML-escaping included).

    field.Error renders bad values that are not a plain Go ``string`` this way, for example a
    ``metav1.ResourceVersionMatch``.
    """
    out = ['"']
    for ch in value:
        escaped = _JSON_ESCAPES.get(ch)
        if escaped is not None:
            out.append(escaped)
        elif ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


_HTML_UNSAFE = (
    (b"<", b"\\u003c"),
    (b">", b"\\u003e"),
    (b"&", b"\\u0026"),
    ("\u2028".encode(), b"\\u2028"),
    ("\u2029".encode(), b"\\u2029"),
)


def go_json_bytes(value: Any) -> bytes:
    """Serialise like the apiserver's JSON encoder: compact, with ``<``, ``>``, ``&``, U+2028
    and U+2029 escaped as ``\\u003c``-style sequences (Go's default HTML escaping).

    Those characters can only occur inside JSON strings, so replacing them in orjson's output
    is exact. Key order is the caller's (insertion order).
    """
    raw = orjson.dumps(value)
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


_GO_TRUE: Final = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE: Final = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def parse_bool(text: str) -> bool:
    """Go's ``strconv.ParseBool``: exactly ``1 t T TRUE true True`` and ``0 f F FALSE false
    False``; anything else is a syntax error."""
    if text in _GO_TRUE:
        return True
    if text in _GO_FALSE:
        return False
    raise GoNumError(func="ParseBool", text=text, reason="invalid syntax")


_DURATION_UNITS: Final = {
    b"ns": 1,
    b"us": 1_000,
    "\u00b5s".encode(): 1_000,  # micro sign
    "\u03bcs".encode(): 1_000,  # Greek mu
    b"ms": 1_000_000,
    b"s": 1_000_000_000,
    b"m": 60_000_000_000,
    b"h": 3_600_000_000_000,
}
_DIGIT_BYTES: Final = frozenset(b"0123456789")


class GoDurationError(ValueError):
    """Go's ``time.ParseDuration`` refuses the text. The message is not Go's: a request with
    such a duration is passed through, and the apiserver words its own answer."""


def parse_duration(text: str) -> int:
    """Go's ``time.ParseDuration`` (``[-+]?([0-9]*(\\.[0-9]*)?[a-z]+)+``, or ``0``): the
    duration in nanoseconds, or :class:`GoDurationError` where Go refuses it (no digits, no
    unit, an unknown unit, past int64 nanoseconds). Go reads bytes; so does this."""
    data = text.encode("utf-8", "surrogateescape")
    invalid = GoDurationError(f"invalid duration {go_quote(text)}")
    negative = data[:1] == b"-"
    if data[:1] in (b"-", b"+"):
        data = data[1:]
    if data == b"0":
        return 0
    if not data:
        raise invalid
    total = 0
    while data:
        whole, data = _leading_int(data, invalid)
        fraction, scale, digits = 0, 1.0, whole is not None
        if data[:1] == b".":
            fraction, scale, data, has_fraction = _leading_fraction(data[1:])
            digits = digits or has_fraction
        end = next((i for i, c in enumerate(data) if c == 0x2E or c in _DIGIT_BYTES), len(data))
        unit = _DURATION_UNITS.get(data[:end])
        if not digits or unit is None:
            raise invalid
        data = data[end:]
        value = whole or 0
        if value > (1 << 63) // unit:
            raise invalid
        value *= unit
        if fraction > 0:
            value += int(float(fraction) * (float(unit) / scale))
            if value > 1 << 63:
                raise invalid
        total += value
        if total > 1 << 63:
            raise invalid
    if negative:
        return -total
    if total > INT64_MAX:
        raise invalid
    return total


def _leading_int(data: bytes, invalid: GoDurationError) -> tuple[int | None, bytes]:
    """Go's ``leadingInt``: the leading digits' value (None when there are none) and the
    rest; past 2^63 is an error. The next byte must be a digit or a point."""
    if not data or not (data[0] == 0x2E or data[0] in _DIGIT_BYTES):
        raise invalid
    value, i = 0, 0
    while i < len(data) and data[i] in _DIGIT_BYTES:
        value = value * 10 + data[i] - 0x30
        if value > 1 << 63:
            raise invalid
        i += 1
    return (value if i else None), data[i:]


def _leading_fraction(data: bytes) -> tuple[int, float, bytes, bool]:
    """Go's ``leadingFraction``: digits after the point as (value, scale), digits past int64
    precision ignored; the rest, and whether there was any digit."""
    value, scale, i, overflow = 0, 1.0, 0, False
    while i < len(data) and data[i] in _DIGIT_BYTES:
        if not overflow:
            following = value * 10 + data[i] - 0x30
            if value > INT64_MAX // 10 or following > 1 << 63:
                overflow = True
            else:
                value, scale = following, scale * 10
        i += 1
    return value, scale, data[i:], i > 0


_HEX = frozenset(b"0123456789abcdefABCDEF")


def valid_escapes(raw: str) -> bool:
    """Every ``%`` starts a ``%XX`` escape: what Go's URL parser requires of a request path
    (net/http answers ``400 Bad Request`` before any handler otherwise)."""
    data = raw.encode("utf-8", "surrogateescape")
    index = data.find(b"%")
    while index != -1:
        if index + 2 >= len(data) or data[index + 1] not in _HEX or data[index + 2] not in _HEX:
            return False
        index = data.find(b"%", index + 3)
    return True


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")
"""A URL scheme and its colon, as Go's ``getScheme`` reads one."""


def origin_form(target: str) -> str | None:
    """The path and query by which Go's HTTP server routes an absolute-form request target
    (``GET http://host/p?q HTTP/1.1``, as sent to proxies): ``url.ParseRequestURI`` gives
    ``/p`` and ``q``, the authority becomes the request's host, and a handler sees only those.
    An empty or opaque path (``http://host``, ``http:x``) is the empty path. None when
    ``target`` is not absolute-form (origin-form starts with ``/``)."""
    if _SCHEME.match(target) is None:
        return None
    path, mark, query = target.partition(":")[2].partition("?")
    if path.startswith("//"):  # the authority, up to the path
        slash = path.find("/", 2)
        path = "" if slash == -1 else path[slash:]
    elif not path.startswith("/"):
        path = ""  # opaque
    return path + mark + query


def query_unescape(raw: str) -> str | None:
    """Go's ``url.QueryUnescape``: ``%XX`` escapes and ``+`` for space; None where Go fails
    (a ``%`` not followed by two hex digits). Bytes that are not UTF-8 become U+FFFD."""
    if not valid_escapes(raw):
        return None
    data = raw.encode("utf-8", "surrogateescape").replace(b"+", b" ")
    if b"%" in data:
        parts = data.split(b"%")
        data = parts[0] + b"".join(bytes.fromhex(p[:2].decode()) + p[2:] for p in parts[1:])
    return data.decode("utf-8", "replace")


def parse_query(raw: str) -> list[tuple[str, str]]:
    """The parameters of a raw query string as the apiserver sees them (Go's
    ``URL.Query()``): pairs split on ``&``, key and value split on the first ``=``; a pair
    containing ``;`` or a bad escape is dropped (``ParseQuery`` reports an error that
    ``Query()`` ignores), empty pairs are skipped."""
    pairs: list[tuple[str, str]] = []
    for pair in raw.split("&"):
        if not pair or ";" in pair:
            continue
        raw_key, _, raw_value = pair.partition("=")
        key, value = query_unescape(raw_key), query_unescape(raw_value)
        if key is not None and value is not None:
            pairs.append((key, value))
    return pairs
