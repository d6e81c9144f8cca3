"""Label and field selectors. Expected strings and errors were produced by apimachinery
v0.37.2 (labels.Parse / fields.ParseSelector) and are asserted byte for byte."""

from __future__ import annotations

import pytest

from proxy.kube.selectors import (
    FieldSelector,
    LabelSelector,
    Operator,
    SelectorSyntaxError,
    escape_field_value,
    generic_fields,
)

VALUE_RULE = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  "
    "or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
NAME_RULE = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
    "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
SUBDOMAIN_RULE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)

# ----------------------------------------------------------------- label parsing


@pytest.mark.parametrize(
    ("text", "string"),
    [
        ("a=b", "a=b"),
        ("a==b", "a==b"),
        ("a!=b", "a!=b"),
        (" a = b , c ", "a=b,c"),
        ("x in (foo,,baz),y,z notin ()", "x in (,baz,foo),y,z notin ()"),
        ("in in (in)", "in in (in)"),
        ("a in ()", "a in ()"),
        ("a in (,)", "a in ()"),
        ("b=1,a=2", "a=2,b=1"),
        ("a=b,a=c", "a=b,a=c"),
        ("!a", "!a"),
        ("a>1", "a>1"),
        ("a=", "a="),
        ("a in (b,a,b)", "a in (a,b)"),
        ("k8s.io/name=x,!example.com/k", "!example.com/k,k8s.io/name=x"),
        ("a\tnotin\n(x)", "a notin (x)"),
        ("", ""),
        ("  ", ""),
    ],
)
def test_label_parse_string(text: str, string: str) -> None:
    assert str(LabelSelector.parse(text)) == string


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a=b c", "found 'c', expected: ',' or 'end of string'"),
        ("a in (x", "unable to parse requirement: found '', expected: ',' or ')'"),
        ("a in x", "unable to parse requirement: found 'x' expected: '('"),
        ("!a=b", "found '=', expected: ',' or 'end of string'"),
        ("a,", "found '', expected: identifier after ','"),
        (",a", "found ',', expected: !, identifier, or 'end of string'"),
        ("a,,b", "found ',', expected: identifier after ','"),
        ("a (b)", "unable to parse requirement: found '(', expected: in, notin, =, ==, !=, gt, lt"),
        ("a!b", "unable to parse requirement: found '!', expected: in, notin, =, ==, !=, gt, lt"),
        ("a in ((", "unable to parse requirement: found '(', expected: ',', ')' or identifier"),
        ("!", "unable to parse requirement: found '', expected: identifier"),
        ("a=(b)", "unable to parse requirement: found '(', expected: identifier"),
        ("a=b)", "found ')', expected: ',' or 'end of string'"),
        # a NUL byte separates the identifier it ends, then lexing goes on
        ("a=b\x00garbage", "found 'garbage', expected: ',' or 'end of string'"),
        (
            "a>x",
            "unable to parse requirement: values[0]: Invalid value: \"x\": for 'Gt', 'Lt' operators, the value must be an integer",
        ),
        (
            "a>",
            "unable to parse requirement: values[0]: Invalid value: \"\": for 'Gt', 'Lt' operators, the value must be an integer",
        ),
        # "-1" is an integer but not a valid label value
        ("a<-1", f'unable to parse requirement: values[0][a]: Invalid value: "-1": {VALUE_RULE}'),
        (
            "a>1,a<b$",
            "unable to parse requirement: [values[0]: Invalid value: \"b$\": for 'Gt', 'Lt' operators, "
            f'the value must be an integer, values[0][a]: Invalid value: "b$": {VALUE_RULE}]',
        ),
        ("a=B$", f'unable to parse requirement: values[0][a]: Invalid value: "B$": {VALUE_RULE}'),
        (
            "a=" + "x" * 64,
            f'unable to parse requirement: values[0][a]: Invalid value: "{"x" * 64}": must be no more than 63 bytes',
        ),
        (
            "A/b=c",
            f'unable to parse requirement: <nil>: Invalid value: "A/b": prefix part {SUBDOMAIN_RULE}',
        ),
        (
            "/a",
            'unable to parse requirement: <nil>: Invalid value: "/a": prefix part must be non-empty',
        ),
        (
            "a/",
            f'unable to parse requirement: <nil>: Invalid value: "a/": name part must be non-empty; name part {NAME_RULE}',
        ),
        (
            "x/y/z",
            f'unable to parse requirement: <nil>: Invalid value: "x/y/z": a valid label key {NAME_RULE} '
            "with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
        ),
        (
            "x" * 64,
            f'unable to parse requirement: <nil>: Invalid value: "{"x" * 64}": name part must be no more than 63 bytes',
        ),
    ],
)
def test_label_parse_errors(text: str, message: str) -> None:
    with pytest.raises(SelectorSyntaxError) as info:
        LabelSelector.parse(text)
    assert str(info.value) == message
    status = info.value.to_status().to_payload()
    assert (status["code"], status.get("reason"), status.get("message")) == (
        400,
        "BadRequest",
        message,
    )


def test_label_key_length_limits() -> None:
    LabelSelector.parse("x" * 63)
    LabelSelector.parse("p" * 253 + "/a")
    with pytest.raises(SelectorSyntaxError, match="prefix part must be no more than 253 bytes"):
        LabelSelector.parse("p" * 254 + "/a")


def test_label_requirement_fields() -> None:
    selector = LabelSelector.parse("b in (y,x),!c,a")
    reqs = {r.key: (r.operator, r.values) for r in selector.requirements}
    assert reqs == {
        "a": (Operator.EXISTS, ()),
        "b": (Operator.IN, ("x", "y")),
        "c": (Operator.DOES_NOT_EXIST, ()),
    }
    assert [r.key for r in selector.requirements] == ["a", "b", "c"]


# ---------------------------------------------------------------- label matching

LABELS_A_B = {"a": "b"}


@pytest.mark.parametrize(
    ("text", "labels", "matches"),
    [
        ("a=b", {"a": "b"}, True),
        ("a=b", {"a": "c"}, False),
        ("a=b", {}, False),
        ("a==b", {"a": "b"}, True),
        ("a!=b", {"a": "b"}, False),
        ("a!=b", {"a": "c"}, True),
        ("a!=b", {}, True),  # absent key matches !=
        ("a in (x,b)", {"a": "b"}, True),
        ("a in (x,b)", {}, False),
        ("a notin (x)", {}, True),
        ("a notin (x)", {"a": "x"}, False),
        ("a notin ()", {"a": ""}, False),
        ("a in ()", {"a": ""}, True),
        ("a in (,b)", {"a": ""}, True),
        ("a", {"a": ""}, True),
        ("a", {"b": "x"}, False),
        ("!a", {}, True),
        ("!a", {"a": "x"}, False),
        ("a>1", {"a": "2"}, True),
        ("a>1", {"a": "1"}, False),
        ("a>1", {"a": "x"}, False),  # not an integer: no match
        ("a>1", {}, False),
        ("a<1", {"a": "-1"}, True),
        ("a<1", {"a": "01"}, False),  # 01 parses as 1
        ("a>0,a<3", {"a": "2"}, True),
        ("a>0,a<3", {"a": "3"}, False),
        ("a=", {"a": ""}, True),
        ("a=", {}, False),
        ("a,b", {"a": "1", "b": "1"}, True),
        ("a,b", {"a": "1"}, False),
        ("", {}, True),
    ],
)
def test_label_matches(text: str, labels: dict[str, str], matches: bool) -> None:
    assert LabelSelector.parse(text).matches(labels) is matches


def test_label_everything() -> None:
    assert LabelSelector.parse("").is_everything
    assert LabelSelector.parse(" ") == LabelSelector.EVERYTHING
    assert not LabelSelector.parse("a").is_everything


@pytest.mark.parametrize(
    ("text", "key", "value"),
    [
        ("a=b", "a", "b"),
        ("a==b", "a", "b"),
        ("a in (b)", "a", "b"),
        ("a in (b,c)", "a", None),
        ("a!=b", "a", None),
        ("a=b", "c", None),
        ("a", "a", None),
    ],
)
def test_label_requires_exact_match(text: str, key: str, value: str | None) -> None:
    assert LabelSelector.parse(text).requires_exact_match(key) == value


@pytest.mark.parametrize(
    ("first", "second", "same"),
    [
        ("a=b,c", "c, a==b", True),
        ("a=b,a=b", "a=b", True),
        ("x in (b,a)", "x in (a,b,a)", True),
        ("a=b", "a!=b", False),
        ("a=b", "a in (b)", False),
        ("b=1,!a", "!a,b=1", True),
    ],
)
def test_label_canonical(first: str, second: str, same: bool) -> None:
    assert (LabelSelector.parse(first).canonical == LabelSelector.parse(second).canonical) is same


def test_label_canonical_is_parseable_and_sorted() -> None:
    canonical = LabelSelector.parse("z==1,!b,a in (y,x)").canonical
    assert canonical == "a in (x,y),!b,z=1"
    assert LabelSelector.parse(canonical).canonical == canonical


def test_label_selector_is_hashable_and_cached() -> None:
    assert LabelSelector.parse("a=b") is LabelSelector.parse("a=b")
    assert len({LabelSelector.parse("a=b"), LabelSelector.parse("a==b")}) == 2


# ----------------------------------------------------------------- field selectors


@pytest.mark.parametrize(
    ("text", "string"),
    [
        ("a=b", "a=b"),
        ("a==b", "a=b"),
        ("a!=b", "a!=b"),
        ("c=d,a=b", "a=b,c=d"),
        ("b=1,a!=2,a==3", "a!=2,a=3,b=1"),
        ("a=x\\,y", "a=x\\,y"),
        ("a=\\=\\\\", "a=\\=\\\\"),
        ("a = b", "a = b"),  # no trimming
        (",,a=b,", "a=b"),
        ("=", ""),  # an empty field with an empty value is dropped
        ("=x", "=x"),
        ("x=", "x="),
        ("", ""),
        ("metadata.name=foo,metadata.namespace!=bar", "metadata.name=foo,metadata.namespace!=bar"),
        ("a=é", "a=é"),
        ("a=1,a=1", "a=1,a=1"),
    ],
)
def test_field_parse_string(text: str, string: str) -> None:
    assert str(FieldSelector.parse(text)) == string


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a=b=c", "invalid field selector: unescaped character in value: 61"),
        ("x=1,a=b=c", "invalid field selector: unescaped character in value: 61"),
        ("a=b,c", "invalid selector: 'a=b,c'; can't understand 'c'"),
        ("a=b\\x", "invalid field selector: invalid escape sequence: \\x"),
        ("a=b\\", "invalid field selector: invalid escape sequence: \\"),
        ("ab", "invalid selector: 'ab'; can't understand 'ab'"),
        ("a!b", "invalid selector: 'a!b'; can't understand 'a!b'"),
    ],
)
def test_field_parse_errors(text: str, message: str) -> None:
    with pytest.raises(SelectorSyntaxError) as info:
        FieldSelector.parse(text)
    assert str(info.value) == message
    assert info.value.to_status().code == 400


def test_field_values_are_unescaped() -> None:
    selector = FieldSelector.parse("a=x\\,y\\=z\\\\")
    assert [(r.field, r.operator, r.value) for r in selector.requirements] == [
        ("a", Operator.EQUALS, "x,y=z\\")
    ]


@pytest.mark.parametrize("value", ["plain", "a,b", "a=b", "a\\b", "\\,=", ""])
def test_field_escape_round_trip(value: str) -> None:
    selector = FieldSelector.parse(f"f={escape_field_value(value)}")
    assert selector.requirements[0].value == value
    assert FieldSelector.parse(str(selector)) == selector


@pytest.mark.parametrize(
    ("text", "fields", "matches"),
    [
        ("a=b", {"a": "b"}, True),
        ("a=b", {"a": "c"}, False),
        ("a=b", {}, False),
        ("a!=b", {}, True),
        ("a=", {}, True),  # a missing field reads as ""
        ("a!=", {}, False),
        ("a=x\\,y", {"a": "x,y"}, True),
        ("a = b", {"a ": " b"}, True),
        ("a = b", {"a": "b"}, False),
        ("metadata.name=n,metadata.namespace=ns", generic_fields(name="n", namespace="ns"), True),
        ("metadata.name=n,metadata.namespace!=ns", generic_fields(name="n", namespace="ns"), False),
    ],
)
def test_field_matches(text: str, fields: dict[str, str], matches: bool) -> None:
    assert FieldSelector.parse(text).matches(fields) is matches


@pytest.mark.parametrize(
    ("text", "namespaced", "local"),
    [
        ("", None, True),
        ("metadata.name=x", None, True),
        ("metadata.name!=x", False, True),
        ("metadata.namespace=ns", True, True),
        (
            "metadata.namespace=ns",
            False,
            False,
        ),  # cluster-scoped: apiserver's answer varies by type
        ("metadata.namespace=ns", None, False),
        ("metadata.name=x,metadata.namespace=ns", True, True),
        ("spec.nodeName=n1", True, False),  # pods only: the apiserver decides
        ("type=kubernetes.io/tls", True, False),  # secrets only
        ("metadata.name=x,status.phase=Running", True, False),
        ("=x", True, False),
    ],
)
def test_field_locally_servable(text: str, namespaced: bool | None, local: bool) -> None:
    assert FieldSelector.parse(text).is_locally_servable(namespaced=namespaced) is local


def test_field_selector_helpers() -> None:
    selector = FieldSelector.parse("metadata.name==x,spec.nodeName!=n")
    assert selector.requires_exact_match("metadata.name") == "x"
    assert selector.requires_exact_match("spec.nodeName") is None
    assert FieldSelector.parse("").is_everything
    assert FieldSelector.parse("=") == FieldSelector.EVERYTHING
    assert FieldSelector.parse("b=1,a=2,a=2").canonical == "a=2,b=1"
    assert FieldSelector.parse("a==1").canonical == FieldSelector.parse("a=1").canonical
