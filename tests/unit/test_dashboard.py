"""deploy/grafana/warmwatch.json queries only metrics that proxy/metrics.py exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from proxy.metrics import Metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "warmwatch.json"

_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exported() -> set[str]:
    """Every series name Prometheus can scrape from warmwatch, suffixes included."""
    names = set()
    for family in Metrics().registry.collect():
        names |= {family.name + suffix for suffix in _SUFFIXES[family.type]}
    return names


def expressions(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for value in node.values() for e in expressions(value)]
    if isinstance(node, list):
        return [e for value in node for e in expressions(value)]
    return []


def test_every_queried_metric_exists() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = expressions(dashboard["panels"])
    queried = {name for expr in exprs for name in re.findall(r"\bwarmwatch_[a-z_]+\b", expr)}
    variables = " ".join(v.get("definition", "") for v in dashboard["templating"]["list"])
    queried |= set(re.findall(r"\bwarmwatch_[a-z_]+\b", variables))
    assert len(exprs) >= 20
    assert queried - exported() == set()


def test_the_dashboard_covers_what_the_issue_asks_for() -> None:
    text = DASHBOARD.read_text()
    for metric in (
        "warmwatch_shape_objects",
        "warmwatch_shape_resource_version",
        "warmwatch_events_in_total",
        "warmwatch_events_out_total",
        "warmwatch_event_delivery_lag_seconds_bucket",
        "warmwatch_upstream_requests_total",
        "warmwatch_upstream_relists_total",
        "warmwatch_circuit_breaker_state",
        "warmwatch_list_bytes_total",
        "warmwatch_list_duration_seconds_bucket",
        "warmwatch_storage_errors_total",
    ):
        assert metric in text, metric


def test_the_exported_names_are_what_a_scrape_shows() -> None:
    metrics = Metrics()
    metrics.events_in.labels(resource="v1/configmaps", type="ADDED").inc()
    metrics.list_duration.labels(resource="v1/configmaps", source="cache").observe(0.1)
    metrics.db_size.set(1)
    scraped = {
        line.split("{")[0].split(" ")[0]
        for line in metrics.exposition().decode().splitlines()
        if line.startswith("warmwatch_")
    }
    assert {n for n in scraped if not n.endswith("_created")} <= exported()
    assert {"warmwatch_events_in_total", "warmwatch_list_duration_seconds_bucket"} <= scraped
