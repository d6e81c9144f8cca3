"""Go-compatible primitives. Expected texts come from Go 1.26 (strconv, encoding/json)."""

from __future__ import annotations

import pytest

from proxy.kube.gocompat import GoNumError, go_json, go_quote, parse_int64, parse_uint64


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
        (["x", "<&>"], '["x","\\u003c\\u0026\\u003e"]'),
        ([], "[]"),
    ],
)
def test_go_json(value: str | list[str], encoded: str) -> None:
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
