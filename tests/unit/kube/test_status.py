"""Status errors: payload bytes, constructors, Retry-After. Expected JSON is what the
apiserver (apimachinery pkg/api/errors + apiserver pkg/storage) writes."""

from __future__ import annotations

import orjson
import pytest

from proxy.kube.field_errors import FieldError, FieldErrorType, aggregate_message
from proxy.kube.status import Cause, Details, Reason, StatusError


def test_payload_key_order_and_bytes() -> None:
    err = StatusError.expired("too old resource version: 5 (900)")
    assert err.to_json() == (
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
        b'"message":"too old resource version: 5 (900)","reason":"Expired","code":410}'
    )


def test_details_key_order() -> None:
    err = StatusError(
        code=409,
        reason="Conflict",
        message="m",
        details=Details(
            name="n",
            group="g",
            kind="k",
            uid="u",
            causes=(Cause(reason="r", message="cm", field="f"),),
            retry_after_seconds=3,
        ),
    )
    body = err.to_json().decode()
    assert (
        body.index('"message"')
        < body.index('"reason"')
        < body.index('"details"')
        < body.index('"code"')
    )
    assert (
        '"details":{"name":"n","group":"g","kind":"k","uid":"u",'
        '"causes":[{"reason":"r","message":"cm","field":"f"}],"retryAfterSeconds":3}'
    ) in body


def test_empty_reason_and_absent_details_are_omitted() -> None:
    payload = StatusError.unknown(code=500, message="boom").to_payload()
    assert payload == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "boom",
        "code": 500,
    }
    assert "details" not in StatusError.bad_request("x").to_payload()
    assert "details" not in StatusError.service_unavailable("x").to_payload()


def test_allocated_empty_details_are_written() -> None:
    # NewTooManyRequests / NewTimeoutError always allocate details, as the apiserver writes them
    assert StatusError.too_many_requests("x", retry_after_seconds=0).to_json() == (
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"x",'
        b'"reason":"TooManyRequests","details":{},"code":429}'
    )
    assert StatusError.timeout("t").to_payload()["details"] == {}


def test_json_escapes_html_like_go() -> None:
    err = StatusError.bad_request("a<b>&c")
    assert b'"message":"a\\u003cb\\u003e\\u0026c"' in err.to_json()


def test_http_body_forms() -> None:
    err = StatusError.bad_request("x")
    assert err.to_http_body() == err.to_json() + b"\n"


def test_continue_token_goes_to_metadata() -> None:
    payload = StatusError.expired("gone", continue_token="tok").to_payload()
    assert payload["metadata"] == {"continue": "tok"}


@pytest.mark.parametrize(
    ("err", "code", "reason", "message", "details"),
    [
        (StatusError.bad_request("nope"), 400, "BadRequest", "nope", None),
        (StatusError.unauthorized(), 401, "Unauthorized", "Unauthorized", None),
        (StatusError.unauthorized(""), 401, "Unauthorized", "not authorized", None),
        (
            StatusError.forbidden(group="", resource="configmaps", reason="no"),
            403,
            "Forbidden",
            "configmaps is forbidden: no",
            {"kind": "configmaps"},
        ),
        (
            StatusError.forbidden(group="apps", resource="deployments", name="d", reason="no"),
            403,
            "Forbidden",
            'deployments.apps "d" is forbidden: no',
            {"name": "d", "group": "apps", "kind": "deployments"},
        ),
        (
            StatusError.forbidden(group="", resource="", reason="no"),
            403,
            "Forbidden",
            "forbidden: no",
            {},  # Go allocates empty details here: "details":{}
        ),
        (StatusError.expired("old"), 410, "Expired", "old", None),
        (
            StatusError.too_many_requests("slow down", retry_after_seconds=2),
            429,
            "TooManyRequests",
            "slow down",
            {"retryAfterSeconds": 2},
        ),
        (
            StatusError.internal_error(RuntimeError("disk on fire")),
            500,
            "InternalError",
            "Internal error occurred: disk on fire",
            {"causes": [{"message": "disk on fire"}]},
        ),
        (StatusError.service_unavailable("later"), 503, "ServiceUnavailable", "later", None),
        (
            StatusError.timeout("took too long", retry_after_seconds=5),
            504,
            "Timeout",
            "Timeout: took too long",
            {"retryAfterSeconds": 5},
        ),
    ],
)
def test_constructors(
    err: StatusError, code: int, reason: str, message: str, details: dict[str, object] | None
) -> None:
    payload = err.to_payload()
    assert (payload["code"], payload.get("reason"), payload.get("message")) == (
        code,
        reason,
        message,
    )
    assert payload.get("details") == details
    assert str(err) == message
    assert err.code == code


def test_too_large_resource_version() -> None:
    err = StatusError.too_large_resource_version(requested=1000, current=500)
    assert err.to_json() == (
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
        b'"message":"Timeout: Too large resource version: 1000, current: 500","reason":"Timeout",'
        b'"details":{"causes":[{"reason":"ResourceVersionTooLarge",'
        b'"message":"Too large resource version"}],"retryAfterSeconds":1},"code":504}'
    )
    assert err.retry_after == 1
    assert err.is_too_large_resource_version
    assert not StatusError.timeout("x", retry_after_seconds=1).is_too_large_resource_version


def test_retry_after() -> None:
    assert StatusError.too_many_requests("x", retry_after_seconds=7).retry_after == 7
    assert StatusError.too_many_requests("x", retry_after_seconds=0).retry_after is None
    assert StatusError.bad_request("x").retry_after is None


def test_forbidden_request_wording() -> None:
    namespaced = StatusError.forbidden_request(
        user="system:serviceaccount:a:b",
        verb="list",
        group="",
        resource="configmaps",
        namespace="ns",
    )
    assert namespaced.message == (
        'configmaps is forbidden: User "system:serviceaccount:a:b" cannot list resource '
        '"configmaps" in API group "" in the namespace "ns"'
    )
    cluster = StatusError.forbidden_request(
        user="u<1>",
        verb="watch",
        group="apps",
        resource="deployments",
        subresource="scale",
        reason="RBAC: no",
    )
    assert cluster.message == (
        'deployments.apps is forbidden: User "u&lt;1&gt;" cannot watch resource '
        '"deployments/scale" in API group "apps" at the cluster scope: RBAC: no'
    )


def test_invalid_list_options_single_error() -> None:
    err = StatusError.invalid_list_options(
        [
            FieldError.forbidden(
                field="resourceVersionMatch",
                detail="resourceVersionMatch is forbidden unless resourceVersion is provided",
            )
        ]
    )
    assert err.to_payload() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: '
        "resourceVersionMatch is forbidden unless resourceVersion is provided",
        "reason": "Invalid",
        "details": {
            "group": "meta.k8s.io",
            "kind": "ListOptions",
            "causes": [
                {
                    "reason": "FieldValueForbidden",
                    "message": "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
                    "field": "resourceVersionMatch",
                }
            ],
        },
        "code": 422,
    }


def test_invalid_aggregates_but_keeps_every_cause() -> None:
    same = FieldError.forbidden(field="f", detail="d")
    other = FieldError.not_supported(field="g", value="x", supported=["A", ""])
    err = StatusError.invalid(group="", kind="Pod", name="p", errors=[same, same, other])
    assert (
        err.message
        == 'Pod "p" is invalid: [f: Forbidden: d, g: Unsupported value: "x": supported values: "A", ""]'
    )
    assert err.details is not None
    assert len(err.details.causes) == 3
    assert StatusError.invalid(group="", kind="Pod", errors=[]).message == 'Pod "" is invalid'


def test_field_error_rendering() -> None:
    assert (
        str(FieldError.invalid(field="a", value='x"y', detail="bad"))
        == 'a: Invalid value: "x\\"y": bad'
    )
    assert FieldError.not_supported(field="m", value="a<b", supported=["Exact"]).body() == (
        'Unsupported value: "a\\u003cb": supported values: "Exact"'
    )
    # Forbidden never shows the value.
    assert (
        FieldError(type=FieldErrorType.FORBIDDEN, field="f", bad_value='"v"', detail="d").body()
        == "Forbidden: d"
    )
    assert FieldError(type=FieldErrorType.REQUIRED, field="f").body() == "Required value"


@pytest.mark.parametrize(
    ("messages", "expected"),
    [([], ""), (["a"], "a"), (["a", "a"], "a"), (["a", "b", "a"], "[a, b]")],
)
def test_aggregate_message(messages: list[str], expected: str) -> None:
    assert aggregate_message(messages) == expected


def test_from_payload_round_trip() -> None:
    original = StatusError.too_large_resource_version(requested=9, current=3)
    rebuilt = StatusError.from_payload(orjson.loads(original.to_json()))
    assert rebuilt == original
    assert rebuilt.retry_after == 1
    assert rebuilt.is_too_large_resource_version


def test_from_payload_defaults_code_from_http_status() -> None:
    rebuilt = StatusError.from_payload({"kind": "Status", "message": "x"}, http_status=503)
    assert (rebuilt.code, rebuilt.reason, rebuilt.details) == (503, "", None)
    expired = StatusError.from_payload(
        {"code": 410, "reason": "Gone", "metadata": {"continue": "t"}}
    )
    assert expired.is_expired
    assert expired.continue_token == "t"
    assert str(Reason.EXPIRED) == "Expired"
    assert not StatusError.bad_request("x").is_expired


def test_unauthorized_body_matches_apiserver() -> None:
    # confirmed against kube-apiserver v1.37.2 (bad bearer token)
    assert StatusError.unauthorized().to_http_body() == (
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
        b'"message":"Unauthorized","reason":"Unauthorized","code":401}\n'
    )
