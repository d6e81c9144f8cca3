"""ListOptions decoding, validation and semantics. Status texts are those of the v1.37
apiserver handler chain (DecodeParameters → SetListOptionsDefaults → ValidateListOptions →
storage.ValidateListOptions)."""

from __future__ import annotations

import base64
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from proxy.kube.options import (
    ListOptions,
    ListSemantics,
    ListSemanticsKind,
    WatchStart,
    WatchStartKind,
    decode_list_options,
    first_values,
    list_options_errors,
    list_semantics,
    parse_bool,
    selector_bytes,
    watch_start,
)
from proxy.kube.selectors import FieldSelector, LabelSelector
from proxy.kube.status import StatusError

TOKEN = (
    base64.urlsafe_b64encode(b'{"v":"meta.k8s.io/v1","rv":5,"start":"ns/a\\u0000"}')
    .rstrip(b"=")
    .decode()
)


def q(text: str) -> list[tuple[str, str]]:
    """A query string into pairs (values here need no percent-decoding)."""
    pairs = []
    for part in text.split("&"):
        if part:
            key, _, value = part.partition("=")
            pairs.append((key, value))
    return pairs


def parse(text: str, *, watch_path: bool = False) -> ListOptions:
    return ListOptions.parse(q(text), watch_path=watch_path)


def failure(text: str, *, watch_path: bool = False) -> dict[str, Any]:
    with pytest.raises(StatusError) as info:
        parse(text, watch_path=watch_path)
    return dict(info.value.to_payload())


# --------------------------------------------------------------------- decoding


@pytest.mark.parametrize(
    "query",
    [
        [("limit", "5"), ("limit", "7"), ("watch", "true")],
        {"limit": "5", "watch": "true"},
        {"limit": ["5", "7"], "watch": ["true"], "continue": []},
    ],
)
def test_first_values_forms(query: Any) -> None:
    assert first_values(query) == {"limit": "5", "watch": "true"}


class _MultiDict(Mapping[str, str]):
    """Like aiohttp's MultiDictProxy: a Mapping whose items() yields repeated keys."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self._pairs = pairs

    def __getitem__(self, key: str) -> str:
        return next(v for k, v in self._pairs if k == key)

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._pairs)

    def __len__(self) -> int:
        return len(self._pairs)

    def items(self) -> Any:
        return list(self._pairs)


def test_first_values_multidict_keeps_first() -> None:
    query = _MultiDict([("watch", "false"), ("watch", "true"), ("limit", "1")])
    assert first_values(query) == {"watch": "false", "limit": "1"}
    assert ListOptions.parse(query).is_watch is False


def test_selector_bytes_counts_both_selectors_as_decoded_before_parsing() -> None:
    """What ``serve.reading`` checks before it parses a query: the first of each selector,
    in UTF-8 (an invalid selector counts too: the apiserver answers it)."""
    query = [
        ("labelSelector", "app=\u00e9"),
        ("labelSelector", "ignored-repeat"),
        ("fieldSelector", "metadata.name=x"),
        ("limit", "500"),
    ]
    assert selector_bytes(query) == len("app=") + 2 + len("metadata.name=x")
    assert selector_bytes([("labelSelector", "((( not a selector")]) == 18
    assert selector_bytes([]) == 0


@pytest.mark.parametrize(
    ("value", "result"),
    [
        ("true", True),
        ("1", True),
        ("True", True),  # Python clients up to v35
        ("", True),  # an empty value is true
        ("yes", True),
        ("no", True),
        ("00", True),
        (" 0", True),
        ("0", False),
        ("false", False),
        ("FALSE", False),
        ("False", False),
        ("fAlSe", False),
    ],
)
def test_parse_bool(value: str, result: bool) -> None:
    assert parse_bool(value) is result


def test_decode_all_fields() -> None:
    options = parse(
        "resourceVersion=10&resourceVersionMatch=NotOlderThan&limit=500&labelSelector=a=b"
        "&fieldSelector=metadata.name=x&timeoutSeconds=300&allowWatchBookmarks=true"
        "&timeout=5m30s&unknown=1"
    )
    assert options.resource_version == "10"
    assert options.resource_version_match == "NotOlderThan"
    assert options.limit == 500
    assert options.page_limit == 500
    assert options.timeout_seconds == 300
    assert options.allow_watch_bookmarks is True
    assert options.watch is False
    assert options.send_initial_events is None
    assert options.field_selector == FieldSelector.parse("metadata.name=x")
    assert options.label_selector == LabelSelector.parse("a=b")


def test_decode_defaults_and_empty_values() -> None:
    options = parse(
        "resourceVersion=&resourceVersionMatch=&continue=&labelSelector=&fieldSelector="
    )
    assert options == ListOptions()
    assert options.label_selector.is_everything
    assert options.field_selector.is_everything
    assert options.page_limit is None


@pytest.mark.parametrize(
    ("query", "watch", "is_watch"),
    [
        ("watch=true", True, True),
        ("watch=True", True, True),
        ("watch=", True, True),
        ("watch", True, True),
        ("watch=1", True, True),
        ("watch=0", False, False),
        ("watch=false", False, False),
        ("watch=false&watch=true", False, False),  # first value wins
        ("", False, False),
    ],
)
def test_decode_watch(query: str, watch: bool, is_watch: bool) -> None:
    options = decode_list_options(q(query))
    assert options.watch is watch
    assert options.is_watch is is_watch


def test_watch_path_makes_a_watch() -> None:
    options = decode_list_options(q("watch=false"), watch_path=True)
    assert (options.watch, options.watch_path, options.is_watch) == (False, True, True)


@pytest.mark.parametrize(
    ("query", "value"),
    [
        ("sendInitialEvents=true", True),
        ("sendInitialEvents=false", False),
        ("sendInitialEvents=", True),
        ("", None),
    ],
)
def test_decode_send_initial_events(query: str, value: bool | None) -> None:
    assert decode_list_options(q(query)).send_initial_events is value


@pytest.mark.parametrize(("limit", "page_limit"), [("-1", None), ("0", None), ("+3", 3)])
def test_limit_is_kept_raw(limit: str, page_limit: int | None) -> None:
    options = parse(f"limit={limit}")
    assert options.limit == int(limit)
    assert options.page_limit == page_limit


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("limit=abc", 'strconv.ParseInt: parsing "abc": invalid syntax'),
        ("limit=", 'strconv.ParseInt: parsing "": invalid syntax'),
        ("limit=1.5", 'strconv.ParseInt: parsing "1.5": invalid syntax'),
        (
            "limit=99999999999999999999",
            'strconv.ParseInt: parsing "99999999999999999999": value out of range',
        ),
        ("timeoutSeconds=x", 'strconv.ParseInt: parsing "x": invalid syntax'),
        # Go converts timeoutSeconds before limit, and both before the selectors
        ("limit=abc&timeoutSeconds=1.5", 'strconv.ParseInt: parsing "1.5": invalid syntax'),
        ("labelSelector=a in (&limit=x", 'strconv.ParseInt: parsing "x": invalid syntax'),
        (
            "labelSelector=a in (",
            "unable to parse requirement: found '', expected: ',', ')' or identifier",
        ),
        ("fieldSelector=a", "invalid selector: 'a'; can't understand 'a'"),
        (
            "fieldSelector=a&labelSelector=b c",
            "unable to parse requirement: found 'c', expected: in, notin, =, ==, !=, gt, lt",
        ),
    ],
)
def test_decode_errors_are_400(query: str, message: str) -> None:
    payload = failure(query)
    assert (payload["code"], payload.get("reason"), payload.get("message")) == (
        400,
        "BadRequest",
        message,
    )
    assert "details" not in payload


def test_decode_error_wins_over_validation() -> None:
    payload = failure("resourceVersionMatch=Exact&limit=x")
    assert payload["code"] == 400


# ------------------------------------------------------------------- validation

FORBIDDEN = "FieldValueForbidden"
NOT_SUPPORTED = "FieldValueNotSupported"
RVM = "resourceVersionMatch"
SIE = "sendInitialEvents"

MSG_RVM_NEEDS_RV = "resourceVersionMatch is forbidden unless resourceVersion is provided"
MSG_RVM_CONTINUE = "resourceVersionMatch is forbidden when continue is provided"
MSG_EXACT_ZERO = 'resourceVersionMatch "exact" is forbidden for resourceVersion "0"'
MSG_SIE_LIST = "sendInitialEvents is forbidden for list"
MSG_SIE_NEEDS_NOT_OLDER = "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"
MSG_RVM_WATCH = "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"
LIST_SUPPORTED = 'supported values: "Exact", "NotOlderThan", ""'
WATCH_SUPPORTED = 'supported values: "NotOlderThan"'


def forbidden(field: str, detail: str) -> tuple[str, str, str]:
    return (FORBIDDEN, f"Forbidden: {detail}", field)


def unsupported(value: str, supported: str) -> tuple[str, str, str]:
    return (NOT_SUPPORTED, f'Unsupported value: "{value}": {supported}', RVM)


# (query, watch_path, causes) — the 422 rows of the apiserver's full rule set
VALIDATION_CASES = [
    # resourceVersionMatch without resourceVersion
    ("resourceVersionMatch=NotOlderThan", False, [forbidden(RVM, MSG_RVM_NEEDS_RV)]),
    ("resourceVersionMatch=Exact", False, [forbidden(RVM, MSG_RVM_NEEDS_RV)]),
    # ... with continue
    (
        f"resourceVersionMatch=Exact&resourceVersion=5&continue={TOKEN}",
        False,
        [forbidden(RVM, MSG_RVM_CONTINUE)],
    ),
    # ... not Exact / NotOlderThan (case-sensitive)
    ("resourceVersionMatch=foo&resourceVersion=5", False, [unsupported("foo", LIST_SUPPORTED)]),
    (
        "resourceVersionMatch=notolderthan&resourceVersion=5",
        False,
        [unsupported("notolderthan", LIST_SUPPORTED)],
    ),
    # ... Exact with RV "0"
    ("resourceVersionMatch=Exact&resourceVersion=0", False, [forbidden(RVM, MSG_EXACT_ZERO)]),
    # several rules at once, in the apiserver's order
    (
        "resourceVersionMatch=bogus",
        False,
        [forbidden(RVM, MSG_RVM_NEEDS_RV), unsupported("bogus", LIST_SUPPORTED)],
    ),
    # sendInitialEvents on a LIST (whatever its value)
    ("sendInitialEvents=true", False, [forbidden(SIE, MSG_SIE_LIST)]),
    ("sendInitialEvents=false", False, [forbidden(SIE, MSG_SIE_LIST)]),
    (
        "sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
        False,
        [forbidden(RVM, MSG_RVM_NEEDS_RV), forbidden(SIE, MSG_SIE_LIST)],
    ),
    # sendInitialEvents on a watch without resourceVersionMatch=NotOlderThan
    ("watch=true&sendInitialEvents=true", False, [forbidden(RVM, MSG_SIE_NEEDS_NOT_OLDER)]),
    ("watch=true&sendInitialEvents=false", False, [forbidden(RVM, MSG_SIE_NEEDS_NOT_OLDER)]),
    (
        "watch=true&sendInitialEvents=true&resourceVersionMatch=Exact&allowWatchBookmarks=true",
        False,
        [forbidden(RVM, MSG_SIE_NEEDS_NOT_OLDER), unsupported("Exact", WATCH_SUPPORTED)],
    ),
    # resourceVersionMatch on a watch without sendInitialEvents
    ("watch=true&resourceVersionMatch=NotOlderThan", False, [forbidden(RVM, MSG_RVM_WATCH)]),
    (
        "watch=true&resourceVersionMatch=NotOlderThan&resourceVersion=5",
        False,
        [forbidden(RVM, MSG_RVM_WATCH)],
    ),
    (
        "watch=true&resourceVersionMatch=Exact&resourceVersion=5",
        False,
        [forbidden(RVM, MSG_RVM_WATCH), unsupported("Exact", WATCH_SUPPORTED)],
    ),
    # WatchList with continue
    (
        "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&continue=x",
        False,
        [forbidden(RVM, MSG_RVM_CONTINUE)],
    ),
    # quirk: WatchList defaulting makes a legacy watch with continue invalid
    ("watch=true&continue=x", False, [forbidden(RVM, MSG_RVM_CONTINUE)]),
    ("watch=true&resourceVersion=0&continue=x", False, [forbidden(RVM, MSG_RVM_CONTINUE)]),
    # quirk: the /watch/ path is validated with the LIST rules
    ("sendInitialEvents=true", True, [forbidden(SIE, MSG_SIE_LIST)]),
    ("resourceVersionMatch=NotOlderThan", True, [forbidden(RVM, MSG_RVM_NEEDS_RV)]),
]


@pytest.mark.parametrize(("query", "watch_path", "causes"), VALIDATION_CASES)
def test_validation_422(query: str, watch_path: bool, causes: list[tuple[str, str, str]]) -> None:
    payload = failure(query, watch_path=watch_path)
    assert payload["code"] == 422
    assert payload.get("reason") == "Invalid"
    details = payload["details"]
    assert (details.get("group"), details.get("kind"), details.get("name")) == (
        "meta.k8s.io",
        "ListOptions",
        None,
    )
    got = [(c["reason"], c["message"], c["field"]) for c in details["causes"]]
    assert got == causes
    texts = [f"{field}: {message}" for _, message, field in causes]
    aggregate = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    assert payload.get("message") == f'ListOptions.meta.k8s.io "" is invalid: {aggregate}'


def test_validation_message_example() -> None:
    payload = failure("resourceVersionMatch=Exact&resourceVersion=0")
    assert payload["message"] == (
        'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: '
        'resourceVersionMatch "exact" is forbidden for resourceVersion "0"'
    )


def test_unsupported_value_is_json_quoted() -> None:
    payload = failure("resourceVersionMatch=a<b&resourceVersion=1")
    assert (
        payload["details"]["causes"][0]["message"]
        == f'Unsupported value: "a\\u003cb": {LIST_SUPPORTED}'
    )


@pytest.mark.parametrize(
    ("query", "watch_path"),
    [
        ("", False),
        ("resourceVersion=0&resourceVersionMatch=NotOlderThan", False),
        ("resourceVersion=5&resourceVersionMatch=Exact&limit=10", False),
        ("resourceVersion=5&resourceVersionMatch=NotOlderThan&limit=10", False),
        ("limit=500&resourceVersion=0", False),
        (f"continue={TOKEN}", False),
        (f"continue={TOKEN}&resourceVersion=0", False),
        ("watch=true", False),
        ("watch=true&resourceVersion=0&allowWatchBookmarks=true", False),
        ("watch=true&resourceVersion=12&allowWatchBookmarks=true&timeoutSeconds=300", False),
        (
            "watch=true&resourceVersion=5&continue=x",
            False,
        ),  # continue is ignored on a watch with RV
        (
            "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
            False,
        ),
        ("watch=true&sendInitialEvents=false&resourceVersionMatch=NotOlderThan", False),
        # not refused: the apiserver sends the initial events and no end bookmark
        ("watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan", False),
        (
            "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=7",
            False,
        ),
        ("resourceVersionMatch=NotOlderThan&resourceVersion=5", True),
        ("resourceVersion=5&continue=garbage!", True),  # a watch does not decode continue
        # A LIST's continue page is passed through: its token and RV are the apiserver's to check
        ("continue=abc", False),
        (f"continue={TOKEN}&resourceVersion=5", False),
        ("continue=abc&resourceVersion=abc", False),
    ],
)
def test_valid_queries(query: str, watch_path: bool) -> None:
    options = parse(query, watch_path=watch_path)
    assert list_options_errors(options) == []


# ---------------------------------------------------------------- storage checks


@pytest.mark.parametrize(
    ("query", "watch_path", "code", "reason", "message"),
    [
        (
            "resourceVersion=abc",
            False,
            400,
            "BadRequest",
            'invalid resource version: resourceVersion: Invalid value: "abc": strconv.ParseUint: parsing "abc": invalid syntax',
        ),
        (
            "resourceVersion=18446744073709551616&resourceVersionMatch=NotOlderThan",
            False,
            400,
            "BadRequest",
            'invalid resource version: resourceVersion: Invalid value: "18446744073709551616": '
            'strconv.ParseUint: parsing "18446744073709551616": value out of range',
        ),
        (
            "watch=true&resourceVersion=abc",
            False,
            500,
            None,
            'resourceVersion: Invalid value: "abc": strconv.ParseUint: parsing "abc": invalid syntax',
        ),
        (
            "resourceVersion=-1",
            True,
            500,
            None,
            'resourceVersion: Invalid value: "-1": strconv.ParseUint: parsing "-1": invalid syntax',
        ),
    ],
)
def test_storage_errors(
    query: str, watch_path: bool, code: int, reason: str | None, message: str
) -> None:
    payload = failure(query, watch_path=watch_path)
    assert (payload["code"], payload.get("reason"), payload.get("message")) == (
        code,
        reason,
        message,
    )


def test_leading_zero_rv_is_accepted_by_the_apiserver() -> None:
    assert parse("resourceVersion=007").resource_version == "7"  # and read as uint64


# -------------------------------------------------------------------- semantics


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", ListSemantics(kind=ListSemanticsKind.MOST_RECENT)),
        ("limit=500", ListSemantics(kind=ListSemanticsKind.MOST_RECENT, limit=500)),
        ("resourceVersion=0", ListSemantics(kind=ListSemanticsKind.ANY)),
        ("resourceVersion=0&limit=500", ListSemantics(kind=ListSemanticsKind.ANY)),  # limit ignored
        (
            "resourceVersion=7",
            ListSemantics(kind=ListSemanticsKind.NOT_OLDER_THAN, resource_version="7"),
        ),
        (
            "resourceVersion=7&limit=0",
            ListSemantics(kind=ListSemanticsKind.NOT_OLDER_THAN, resource_version="7"),
        ),
        (
            "resourceVersion=7&limit=-1",
            ListSemantics(kind=ListSemanticsKind.NOT_OLDER_THAN, resource_version="7"),
        ),
        (
            "resourceVersion=7&limit=500",
            ListSemantics(kind=ListSemanticsKind.EXACT, resource_version="7", limit=500),
        ),
        (
            "resourceVersion=0&resourceVersionMatch=NotOlderThan",
            ListSemantics(kind=ListSemanticsKind.ANY),
        ),
        (
            "resourceVersion=0&resourceVersionMatch=NotOlderThan&limit=5",
            ListSemantics(kind=ListSemanticsKind.ANY),
        ),
        (
            "resourceVersion=7&resourceVersionMatch=NotOlderThan",
            ListSemantics(kind=ListSemanticsKind.NOT_OLDER_THAN, resource_version="7"),
        ),
        (
            "resourceVersion=7&resourceVersionMatch=NotOlderThan&limit=5",
            ListSemantics(kind=ListSemanticsKind.NOT_OLDER_THAN, resource_version="7", limit=5),
        ),
        (
            "resourceVersion=7&resourceVersionMatch=Exact",
            ListSemantics(kind=ListSemanticsKind.EXACT, resource_version="7"),
        ),
        (  # "00" passes validation and is read as 0 (found by fuzzing): passed through
            "resourceVersion=00&resourceVersionMatch=Exact",
            ListSemantics(kind=ListSemanticsKind.EXACT, resource_version="0"),
        ),
        (f"continue={TOKEN}&limit=50", ListSemantics(kind=ListSemanticsKind.CONTINUE, limit=50)),
        (f"continue={TOKEN}&resourceVersion=0", ListSemantics(kind=ListSemanticsKind.CONTINUE)),
        # not decoded: a continue page is passed through, and the apiserver answers a bad token
        ("continue=abc", ListSemantics(kind=ListSemanticsKind.CONTINUE)),
    ],
)
def test_list_semantics(query: str, expected: ListSemantics) -> None:
    assert list_semantics(parse(query)) == expected


def test_list_semantics_rejects_watch_and_invalid() -> None:
    with pytest.raises(ValueError, match="watch"):
        list_semantics(parse("watch=true"))
    with pytest.raises(ValueError, match="invalid"):
        list_semantics(ListOptions(resource_version_match="Exact"))


@pytest.mark.parametrize(
    ("query", "watch_path", "expected"),
    [
        # sendInitialEvents unset (legacy watch)
        (
            "watch=true",
            False,
            WatchStart(kind=WatchStartKind.INITIAL_STATE, freshness=ListSemanticsKind.MOST_RECENT),
        ),
        (
            "watch=true&resourceVersion=0&allowWatchBookmarks=true",
            False,
            # defaulted to a WatchList (1.34+): the initial-events-end bookmark, as the apiserver
            WatchStart(
                kind=WatchStartKind.INITIAL_STATE,
                freshness=ListSemanticsKind.ANY,
                initial_events_end_bookmark=True,
            ),
        ),
        (
            "watch=true&allowWatchBookmarks=true",
            False,
            WatchStart(
                kind=WatchStartKind.INITIAL_STATE,
                freshness=ListSemanticsKind.MOST_RECENT,
                initial_events_end_bookmark=True,
            ),
        ),
        (
            # the /watch/ path alone is not defaulted: no bookmark
            "allowWatchBookmarks=true",
            True,
            WatchStart(kind=WatchStartKind.INITIAL_STATE, freshness=ListSemanticsKind.MOST_RECENT),
        ),
        (
            "watch=true&resourceVersion=12&allowWatchBookmarks=true",
            False,
            WatchStart(kind=WatchStartKind.FROM_RESOURCE_VERSION, resource_version="12"),
        ),
        (
            "resourceVersion=12",
            True,
            WatchStart(kind=WatchStartKind.FROM_RESOURCE_VERSION, resource_version="12"),
        ),
        (
            "",
            True,
            WatchStart(kind=WatchStartKind.INITIAL_STATE, freshness=ListSemanticsKind.MOST_RECENT),
        ),
        # WatchList
        (
            "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
            False,
            WatchStart(
                kind=WatchStartKind.INITIAL_STATE,
                freshness=ListSemanticsKind.MOST_RECENT,
                initial_events_end_bookmark=True,
            ),
        ),
        (
            "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&resourceVersion=0",
            False,
            WatchStart(
                kind=WatchStartKind.INITIAL_STATE,
                freshness=ListSemanticsKind.ANY,
                initial_events_end_bookmark=True,
            ),
        ),
        (
            "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&resourceVersion=9",
            False,
            WatchStart(
                kind=WatchStartKind.INITIAL_STATE,
                resource_version="9",
                freshness=ListSemanticsKind.NOT_OLDER_THAN,
                initial_events_end_bookmark=True,
            ),
        ),
        (
            "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
            False,
            WatchStart(kind=WatchStartKind.INITIAL_STATE, freshness=ListSemanticsKind.MOST_RECENT),
        ),
        # sendInitialEvents=false
        (
            "watch=true&sendInitialEvents=false&resourceVersionMatch=NotOlderThan",
            False,
            WatchStart(kind=WatchStartKind.FROM_NOW, freshness=ListSemanticsKind.MOST_RECENT),
        ),
        (
            "watch=true&sendInitialEvents=false&resourceVersionMatch=NotOlderThan&resourceVersion=0",
            False,
            WatchStart(kind=WatchStartKind.FROM_NOW, freshness=ListSemanticsKind.ANY),
        ),
        (
            "watch=true&sendInitialEvents=false&resourceVersionMatch=NotOlderThan&resourceVersion=4",
            False,
            WatchStart(kind=WatchStartKind.FROM_RESOURCE_VERSION, resource_version="4"),
        ),
    ],
)
def test_watch_start(query: str, watch_path: bool, expected: WatchStart) -> None:
    assert watch_start(parse(query, watch_path=watch_path)) == expected


def test_watch_start_rejects_list() -> None:
    with pytest.raises(ValueError, match="list"):
        watch_start(parse(""))


@pytest.mark.parametrize(
    ("value", "canonical"),
    [("007", "7"), ("00", "0"), ("0", "0"), ("120", "120"), ("18446744073709551615", None)],
)
def test_a_query_resource_version_is_read_as_the_apiserver_parses_it(
    value: str, canonical: str | None
) -> None:
    """Found by review: "007" passed validation but was then looked up verbatim (410/504)."""
    options = ListOptions.parse({"resourceVersion": [value], "watch": ["1"]})
    assert options.resource_version == (canonical or value)
