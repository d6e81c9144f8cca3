"""resourceVersion comparison (KEP-5504) and query parsing."""

from __future__ import annotations

import pytest

from proxy.kube.versions import (
    InvalidResourceVersion,
    compare,
    is_well_formed,
    parse_query_resource_version,
)


@pytest.mark.parametrize(
    ("rv", "ok"),
    [
        ("1", True),
        ("123", True),
        ("99999999999999999999999999", True),  # no length limit
        ("0", False),  # special value, never a live RV
        ("", False),
        ("01", False),
        ("007", False),
        ("-1", False),
        ("+1", False),
        ("1 ", False),
        ("1a", False),
        ("١٢", False),  # non-ASCII digits
        ("abc", False),
    ],
)
def test_is_well_formed(rv: str, ok: bool) -> None:
    assert is_well_formed(rv) is ok


@pytest.mark.parametrize(
    ("a", "b", "result"),
    [
        ("1", "2", -1),
        ("2", "1", 1),
        ("5", "5", 0),
        ("9", "10", -1),  # shorter is smaller, not lexical
        ("10", "9", 1),
        ("123", "124", -1),
        ("100000000000000000000000", "99999999999999999999999", 1),  # beyond uint64
        ("0", "1", None),
        ("1", "0", None),
        ("01", "1", None),
        ("abc", "abc", None),  # equal but opaque: not comparable
        ("", "", None),
        ("5", "x5", None),
    ],
)
def test_compare(a: str, b: str, result: int | None) -> None:
    assert compare(a, b) == result


@pytest.mark.parametrize(
    ("value", "parsed"),
    [("", 0), ("0", 0), ("5", 5), ("007", 7), ("18446744073709551615", 2**64 - 1)],
)
def test_parse_query_resource_version(value: str, parsed: int) -> None:
    assert parse_query_resource_version(value) == parsed


@pytest.mark.parametrize(
    ("value", "go_error"),
    [
        ("abc", 'strconv.ParseUint: parsing "abc": invalid syntax'),
        ("-1", 'strconv.ParseUint: parsing "-1": invalid syntax'),
        ("1.0", 'strconv.ParseUint: parsing "1.0": invalid syntax'),
        (
            "18446744073709551616",
            'strconv.ParseUint: parsing "18446744073709551616": value out of range',
        ),
    ],
)
def test_invalid_query_resource_version(value: str, go_error: str) -> None:
    with pytest.raises(InvalidResourceVersion) as info:
        parse_query_resource_version(value)
    field_error = f'resourceVersion: Invalid value: "{value}": {go_error}'
    assert str(info.value) == field_error

    as_list = info.value.to_status(watch=False).to_payload()
    assert (as_list["code"], as_list.get("reason")) == (400, "BadRequest")
    assert as_list.get("message") == f"invalid resource version: {field_error}"

    as_watch = info.value.to_status(watch=True).to_payload()
    assert as_watch["code"] == 500
    assert "reason" not in as_watch
    assert as_watch.get("message") == field_error
