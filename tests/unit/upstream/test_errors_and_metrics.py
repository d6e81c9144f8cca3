"""UpstreamStatusError parsing, Retry-After, and the Metrics registry."""

from __future__ import annotations

import math

import orjson
import pytest

from proxy.metrics import Metrics
from proxy.upstream.errors import (
    UpstreamError,
    UpstreamStatusError,
    UpstreamUnavailable,
    parse_retry_after,
    reason_for_code,
)

# ------------------------------------------------------------------------------- errors


def test_hierarchy() -> None:
    assert issubclass(UpstreamUnavailable, UpstreamError)
    assert issubclass(UpstreamStatusError, UpstreamError)


def test_status_body_is_kept_verbatim() -> None:
    status = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Timeout: Too large resource version: 9, current: 5",
        "reason": "Timeout",
        "details": {
            "causes": [
                {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
            ],
            "retryAfterSeconds": 1,
        },
        "code": 504,
    }
    error = UpstreamStatusError.from_response(code=504, body=orjson.dumps(status), headers={})
    assert error.code == 504
    assert error.reason == "Timeout"
    assert error.status == status
    assert error.retry_after == 1.0
    assert error.is_too_large_resource_version
    assert not error.is_expired
    assert error.to_status_error().to_payload() == status


def test_header_retry_after_wins_over_details() -> None:
    status = {
        "kind": "Status",
        "code": 429,
        "reason": "TooManyRequests",
        "details": {"retryAfterSeconds": 9},
    }
    error = UpstreamStatusError.from_response(
        code=429, body=orjson.dumps(status), headers={"Retry-After": "2"}
    )
    assert error.retry_after == 2.0


def test_status_without_code_takes_the_http_code() -> None:
    error = UpstreamStatusError.from_response(
        code=410, body=b'{"kind":"Status","reason":"Expired","message":"too old"}', headers={}
    )
    assert error.code == 410
    assert error.is_expired


@pytest.mark.parametrize(
    ("code", "body", "reason"),
    [
        (503, b"", "ServiceUnavailable"),
        (502, b"<html>bad gateway</html>", ""),
        (404, b"404 page not found", "NotFound"),
        (403, b'{"kind":"Other"}', "Forbidden"),
    ],
)
def test_non_status_bodies_are_synthesized(code: int, body: bytes, reason: str) -> None:
    error = UpstreamStatusError.from_response(code=code, body=body, headers={})
    assert error.code == code
    assert error.reason == reason
    assert error.status["kind"] == "Status"
    assert error.status["code"] == code
    if body:
        assert body.decode() in error.message
    assert error.to_status_error().code == code


def test_reason_for_code() -> None:
    assert reason_for_code(429) == "TooManyRequests"
    assert reason_for_code(418) == ""


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("3", 3.0),
        (" 10 ", 10.0),
        ("-1", None),
        ("soon", None),
        ("Wed, 21 Oct 2015 07:28:10 GMT", 10.0),
        ("Wed, 21 Oct 2015 07:27:00 GMT", 0.0),
    ],
)
def test_parse_retry_after(value: str | None, expected: float | None) -> None:
    now = 1445412480.0  # Wed, 21 Oct 2015 07:28:00 GMT
    assert parse_retry_after(value, now=now) == expected


# ------------------------------------------------------------------------------ metrics


def test_metrics_instances_are_isolated() -> None:
    a, b = Metrics(), Metrics()
    a.events_out.labels(resource="v1/configmaps").inc(3)
    assert a.value("warmwatch_events_out_total", {"resource": "other"}) == 3
    assert b.value("warmwatch_events_out_total", {"resource": "other"}) is None


def test_every_metric_is_exposed_with_the_prefix() -> None:
    metrics = Metrics()
    metrics.shape_objects.labels(resource="v1/pods", shape=1).set(10)
    metrics.set_shape_resource_version(resource="v1/pods", shape=1, rv="123")
    metrics.events_in.labels(resource="v1/pods", type="ADDED").inc()
    metrics.events_out.labels(resource="v1/pods").inc()
    metrics.upstream_requests.labels(verb="LIST", code="200").inc()
    metrics.upstream_relists.labels(resource="v1/pods").inc()
    metrics.watch_restarts.labels(resource="v1/pods", reason="ended").inc()
    metrics.watchers.labels(resource="v1/pods").set(2)
    metrics.list_bytes.labels(resource="v1/pods", source="cache").inc(100)
    metrics.list_duration.labels(resource="v1/pods", source="upstream-list").observe(0.5)
    metrics.event_delivery_lag.labels(resource="v1/pods").observe(0.001)
    metrics.commit_duration.observe(0.01)
    metrics.db_size.set(4096)
    metrics.db_wal_size.set(0)
    metrics.set_breaker_state(target="apiserver", state=2)
    metrics.storage_errors.inc()
    metrics.passthrough_requests.labels(verb="GET", code="200").inc()
    text = metrics.exposition().decode()
    names = {
        line.split("{")[0].split(" ")[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert all(name.startswith("warmwatch_") for name in names)
    for expected in (
        "warmwatch_shape_objects",
        "warmwatch_shape_resource_version",
        "warmwatch_events_in_total",
        "warmwatch_events_out_total",
        "warmwatch_upstream_requests_total",
        "warmwatch_upstream_relists_total",
        "warmwatch_upstream_watch_restarts_total",
        "warmwatch_watchers",
        "warmwatch_list_bytes_total",
        "warmwatch_list_duration_seconds_bucket",
        "warmwatch_event_delivery_lag_seconds_bucket",
        "warmwatch_commit_duration_seconds_bucket",
        "warmwatch_db_size_bytes",
        "warmwatch_db_wal_size_bytes",
        "warmwatch_circuit_breaker_state",
        "warmwatch_storage_errors_total",
        "warmwatch_passthrough_requests_total",
    ):
        assert expected in names, expected
    assert metrics.content_type.startswith("text/plain")


@pytest.mark.parametrize(
    ("rv", "expected"),
    [("123", 123.0), ("0", math.nan), ("0123", math.nan), ("abc", math.nan), ("", math.nan)],
)
def test_shape_resource_version_is_numeric_only_when_well_formed(rv: str, expected: float) -> None:
    metrics = Metrics()
    metrics.resources.hold("v1/pods")
    metrics.set_shape_resource_version(resource="v1/pods", shape=7, rv=rv)
    value = metrics.value("warmwatch_shape_resource_version", {"resource": "v1/pods", "shape": "7"})
    assert value is not None
    if math.isnan(expected):
        assert math.isnan(value)
    else:
        assert value == expected


def test_forget_shape() -> None:
    metrics = Metrics()
    metrics.resources.hold("v1/pods")
    metrics.shape_objects.labels(resource="v1/pods", shape=3).set(1)
    metrics.set_shape_resource_version(resource="v1/pods", shape=3, rv="5")
    metrics.shape_objects.labels(resource="v1/pods", shape=4).set(2)
    metrics.forget_shape(resource="v1/pods", shape=3)
    metrics.forget_shape(resource="v1/pods", shape=99)  # never seen: nothing to do
    labels = {"resource": "v1/pods", "shape": "3"}
    assert metrics.value("warmwatch_shape_objects", labels) is None
    assert metrics.value("warmwatch_shape_resource_version", labels) is None
    assert metrics.value("warmwatch_shape_objects", {"resource": "v1/pods", "shape": "4"}) == 2


def test_metrics_module_is_dependency_free() -> None:
    import ast
    from pathlib import Path

    import proxy.metrics

    tree = ast.parse(Path(proxy.metrics.__file__).read_text())
    imported = {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    } | {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    assert not any(name.startswith("proxy") for name in imported)
