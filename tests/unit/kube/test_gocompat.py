"""Go-compatible primitives. Expected texts come from Go 1.26 (strconv, encoding/json)."""

from __future__ import annotations

import pytest

from proxy.kube.gocompat import (
    GoDurationError,
    GoNumError,
    go_json,
    go_quote,
    origin_form,
    parse_bool,
    parse_duration,
    parse_int64,
    parse_query,
    parse_uint64,
    query_unescape,
    valid_escapes,
)


@pytest.mark.parametrize(
    ("text", "quoted"),
    [
        ("abc", '"abc"'),
        ('a"b', '"a\\"b"'),
        ("a\\b", '"a\\\\b"'),
        ("\n\t\x00\x7f", '"\\n\\t\\x00\\x7f"'),
        ("é", '"é"'),
        ("\u200b", '"\\u200b"'),
        ("\U0001f600", '"\U0001f600"'),
        ("\U000e0001", '"\\U000e0001"'),
        ("a'b", '"a\'b"'),
        ("", '""'),
    ],
)
def test_go_quote(text: str, quoted: str) -> None:
    assert go_quote(text) == quoted


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        ("a<b", '"a\\u003cb"'),
        ("&>", '"\\u0026\\u003e"'),
        ("\x00\n", '"\\u0000\\n"'),
        ("é", '"é"'),
    ],
)
def test_go_json(value: str, encoded: str) -> None:
    assert go_json(value) == encoded


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("007", 7),
        ("+2", 2),
        ("-1", -1),
        ("9223372036854775807", 2**63 - 1),
        ("-9223372036854775808", -(2**63)),
    ],
)
def test_parse_int64_accepts(text: str, value: int) -> None:
    assert parse_int64(text) == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", 'strconv.ParseInt: parsing "": invalid syntax'),
        ("abc", 'strconv.ParseInt: parsing "abc": invalid syntax'),
        ("1.5", 'strconv.ParseInt: parsing "1.5": invalid syntax'),
        (" 1", 'strconv.ParseInt: parsing " 1": invalid syntax'),
        ("1_0", 'strconv.ParseInt: parsing "1_0": invalid syntax'),
        ("+", 'strconv.ParseInt: parsing "+": invalid syntax'),
        (
            "9223372036854775808",
            'strconv.ParseInt: parsing "9223372036854775808": value out of range',
        ),
        (
            "-9223372036854775809",
            'strconv.ParseInt: parsing "-9223372036854775809": value out of range',
        ),
        # Go stops at the overflow before it sees the bad character.
        (
            "99999999999999999999x",
            'strconv.ParseInt: parsing "99999999999999999999x": value out of range',
        ),
    ],
)
def test_parse_int64_rejects(text: str, message: str) -> None:
    with pytest.raises(GoNumError) as info:
        parse_int64(text)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("+1", 'strconv.ParseUint: parsing "+1": invalid syntax'),
        ("-1", 'strconv.ParseUint: parsing "-1": invalid syntax'),
        ("é", 'strconv.ParseUint: parsing "é": invalid syntax'),
        (
            "18446744073709551616",
            'strconv.ParseUint: parsing "18446744073709551616": value out of range',
        ),
    ],
)
def test_parse_uint64_rejects(text: str, message: str) -> None:
    with pytest.raises(GoNumError) as info:
        parse_uint64(text)
    assert str(info.value) == message


def test_parse_uint64_bounds() -> None:
    assert parse_uint64("18446744073709551615") == 2**64 - 1
    assert parse_uint64("0007") == 7


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("", []),
        ("watch=1&resourceVersion=5", [("watch", "1"), ("resourceVersion", "5")]),
        ("labelSelector=app%3Dx%2Cb+in+(c)", [("labelSelector", "app=x,b in (c)")]),
        # a bad escape drops the whole pair, as Go's URL.Query() does
        ("labelSelector=%zz&limit=1", [("limit", "1")]),
        ("a%zz=1&b=%4", []),
        ("x=%", []),
        # pairs with a semicolon are dropped (Go 1.17+)
        ("a=1;b=2&c=3", [("c", "3")]),
        ("&&watch&=v", [("watch", ""), ("", "v")]),
        ("k=a=b", [("k", "a=b")]),
        ("k=%e2%82%ac", [("k", "\u20ac")]),
        ("k=%ff", [("k", "\ufffd")]),
    ],
)
def test_parse_query_like_go(raw: str, expected: list[tuple[str, str]]) -> None:
    assert parse_query(raw) == expected


def test_query_unescape_and_valid_escapes() -> None:
    assert query_unescape("a+b%20c") == "a b c"
    assert query_unescape("%4") is None
    assert valid_escapes("/api/v1/namespaces/a%2Fb/configmaps")
    assert not valid_escapes("/api/v1/namespaces/%zz/configmaps")
    assert not valid_escapes("/a%")


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/api/v1/namespaces", None),  # origin-form already
        ("*", None),
        ("http://127.0.0.1/api/v1/namespaces/a/configmaps/x", "/api/v1/namespaces/a/configmaps/x"),
        ("https://evil.example:99/api?limit=1&x=%20", "/api?limit=1&x=%20"),
        ("HTTP://user:pw@h/a%2Fb", "/a%2Fb"),  # escapes kept as sent
        ("http://h/p?a=b?c", "/p?a=b?c"),  # the first "?" starts the query
        ("http://h?watch=1", "?watch=1"),  # no path
        ("http://h", ""),
        ("http:/api/v1", "/api/v1"),  # no authority
        ("http:opaque?q", "?q"),  # an opaque path is no path
        ("1http://h/x", None),  # not a scheme
    ],
)
def test_origin_form_of_an_absolute_target_as_go_routes_it(
    target: str, expected: str | None
) -> None:
    assert origin_form(target) == expected


# Go 1.26's time.ParseDuration on each (int64 nanoseconds, or an error).
@pytest.mark.parametrize(
    ("text", "nanoseconds"),
    [
        ("32s", 32_000_000_000),
        ("0", 0),
        ("-0", 0),
        ("+0", 0),
        ("1h2m3.5s", 3_723_500_000_000),
        ("1.5h", 5_400_000_000_000),
        (".5s", 500_000_000),
        ("5.s", 5_000_000_000),
        ("1\u00b5s", 1000),
        ("1\u03bcs", 1000),
        ("0.3h", 1_080_000_000_000),
        ("1.0000000000000000000000001s", 1_000_000_000),
        ("9223372036854775807ns", 9_223_372_036_854_775_807),
        ("-9223372036854775808ns", -9_223_372_036_854_775_808),
        ("2562047h", 9_223_369_200_000_000_000),
        ("1", None),
        ("s", None),
        ("", None),
        ("-", None),
        (".s", None),
        ("1x", None),
        ("10s ", None),
        ("9223372036854775808ns", None),
        ("2562048h", None),
    ],
)
def test_parse_duration_like_go(text: str, nanoseconds: int | None) -> None:
    if nanoseconds is None:
        with pytest.raises(GoDurationError):
            parse_duration(text)
    else:
        assert parse_duration(text) == nanoseconds


@pytest.mark.parametrize(
    ("text", "value"),
    [
        *((text, True) for text in ("1", "t", "T", "TRUE", "true", "True")),
        *((text, False) for text in ("0", "f", "F", "FALSE", "false", "False")),
        *((text, None) for text in ("tRuE", "yes", "", "fAlse")),
    ],
)
def test_parse_bool_like_go(text: str, value: bool | None) -> None:
    if value is None:
        with pytest.raises(GoNumError, match=r"strconv\.ParseBool"):
            parse_bool(text)
    else:
        assert parse_bool(text) is value
