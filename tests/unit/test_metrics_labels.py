"""Every label value of every metric is from a bounded set (proxy/metrics.py)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from prometheus_client import Counter, Gauge, Histogram

from proxy.metrics import OTHER, VERBS, Bounded, Metrics, ResourceNames, code_label, shape_label


def _labelled(metrics: Metrics) -> dict[str, Bounded]:
    return {name: value for name, value in vars(metrics).items() if isinstance(value, Bounded)}


def _record(child: Any) -> None:
    for method, argument in (("inc", 1), ("set", 1), ("observe", 0.1)):
        if hasattr(child, method):
            getattr(child, method)(argument)
            return


def _series(metrics: Metrics, collector: Any) -> set[tuple[tuple[str, str], ...]]:
    """The label sets of ``collector``'s series in the exposition (without ``le``)."""
    (family,) = [m for m in metrics.registry.collect() if m.name == collector._name]
    return {
        tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
        for sample in family.samples
    }


def test_every_labelled_metric_is_bounded() -> None:
    metrics = Metrics()
    labelled = _labelled(metrics)
    assert len(labelled) == 27
    for name, value in vars(metrics).items():
        if isinstance(value, Counter | Gauge | Histogram):
            assert not value._labelnames, f"{name}: a labelled metric must be Bounded"


def test_values_made_up_by_clients_make_one_series_per_metric() -> None:
    """A thousand distinct values in every label of every metric (what a client could send:
    paths, methods, selectors) end in a single series each."""
    metrics = Metrics()
    for name, metric in _labelled(metrics).items():
        labels = metric._domains
        for i in range(1000):
            _record(metric.labels(**dict.fromkeys(labels, f"x{i}.example/v1/r{i}q")))
        series = _series(metrics, metric.collector)
        assert len(series) == 1, name
        (values,) = series
        assert {v for _, v in values} <= {OTHER, "error"}, (name, values)


def test_resource_label_names_only_held_or_discovered_resources() -> None:
    names = ResourceNames()
    assert names.label("v1/configmaps") == OTHER
    names.hold("v1/configmaps")
    assert names.label("v1/configmaps") == "v1/configmaps"
    names.discovered(source="/apis", resources=["apps/v1/deployments", "batch/v1/jobs"])
    assert names.label("apps/v1/deployments") == "apps/v1/deployments"
    assert names.label("x1.example/v1/r1q") == OTHER
    # A document names what it names now: a removed CRD is no longer named by it...
    names.discovered(source="/apis", resources=["apps/v1/deployments"])
    assert names.label("batch/v1/jobs") == OTHER
    # ...but a held resource stays named (its shapes' series keep their label).
    names.discovered(source="/api/v1", resources=[])
    assert names.label("v1/configmaps") == "v1/configmaps"
    names.discovered(source="/api/v1", resources=["v1/pods"])
    assert {names.label(r) for r in ("v1/pods", "apps/v1/deployments")} == {
        "v1/pods",
        "apps/v1/deployments",
    }


def test_metrics_label_resources_through_their_names() -> None:
    metrics = Metrics()
    metrics.events_out.labels(resource="v1/configmaps").inc()
    metrics.resources.hold("v1/configmaps")
    metrics.events_out.labels(resource="v1/configmaps").inc(2)
    assert metrics.value("warmwatch_events_out_total", {"resource": OTHER}) == 1
    assert metrics.value("warmwatch_events_out_total", {"resource": "v1/configmaps"}) == 2


@pytest.mark.parametrize(
    ("shape", "label"),
    [
        (1, "1"),
        (4711, "4711"),
        ("17", "17"),
        ("v1/configmaps@ns?labelSelector=app in (a,b)", OTHER),
        ("", OTHER),
        ("-1", OTHER),
        ("١٢", OTHER),  # digits, but not ASCII ones
        ("1" * 20, OTHER),
    ],
)
def test_shape_label_is_the_row_id(shape: int | str, label: str) -> None:
    assert shape_label(str(shape)) == label
    metrics = Metrics()
    metrics.resources.hold("v1/configmaps")
    metrics.shape_objects.labels(resource="v1/configmaps", shape=shape).set(5)
    value = metrics.value("warmwatch_shape_objects", {"resource": "v1/configmaps", "shape": label})
    assert value == 5.0


@pytest.mark.parametrize(
    ("code", "label"),
    [("200", "200"), ("101", "101"), ("error", "error"), ("2000", "error"), ("²00", "error")],
)
def test_code_label(code: str, label: str) -> None:
    assert code_label(code) == label


def test_verbs() -> None:
    metrics = Metrics()
    for verb in ("GET", "LIST", "WATCH", "SUBJECTACCESSREVIEW", "FROBNICATE", "get"):
        metrics.passthrough_requests.labels(verb=verb, code=403).inc()
    assert "FROBNICATE" not in VERBS
    counted = {
        verb: metrics.value("warmwatch_passthrough_requests_total", {"verb": verb, "code": "403"})
        for verb in ("GET", "LIST", "WATCH", "SUBJECTACCESSREVIEW", OTHER)
    }
    assert counted == {"GET": 1, "LIST": 1, "WATCH": 1, "SUBJECTACCESSREVIEW": 1, OTHER: 2}


def test_forget_shape_finds_series_of_a_resource_known_when_they_were_made() -> None:
    metrics = Metrics()
    metrics.resources.discovered(source="/apis", resources=["apps/v1/deployments"])
    metrics.resources.hold("apps/v1/deployments")  # the shape was listed
    metrics.shape_objects.labels(resource="apps/v1/deployments", shape=9).set(3)
    metrics.resources.discovered(source="/apis", resources=[])  # CRD-like removal
    metrics.forget_shape(resource="apps/v1/deployments", shape=9)
    assert (
        metrics.value("warmwatch_shape_objects", {"resource": "apps/v1/deployments", "shape": "9"})
        is None
    )


def test_nan_rv_still_bounded() -> None:
    metrics = Metrics()
    metrics.set_shape_resource_version(resource="x.example/v1/r", shape=1, rv="junk")
    value = metrics.value("warmwatch_shape_resource_version", {"resource": OTHER, "shape": "1"})
    assert value is not None and math.isnan(value)
