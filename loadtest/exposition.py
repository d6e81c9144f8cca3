"""Reading Prometheus text exposition (warmwatch's ``/metrics``, toxiproxy's), one way for the
harness: ``samples(text, name)`` is every sample of one metric with its labels.

Comment lines are skipped; label values are unquoted but not unescaped (the harness's metrics
carry no escaped quotes or commas in the labels it reads).
"""

from __future__ import annotations

from collections.abc import Mapping


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of ``name`` in ``text``: its labels and its value."""
    found = []
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        series, _, value = line.rpartition(" ")
        metric, _, label_text = series.partition("{")
        if metric != name:
            continue
        labels = dict(
            part.split("=", 1) for part in label_text.rstrip("}").split(",") if "=" in part
        )
        found.append(({k: v.strip('"') for k, v in labels.items()}, float(value)))
    return found


def total(text: str, name: str, labels: Mapping[str, str] | None = None) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels`` (0 when none)."""
    return sum(
        value
        for found, value in samples(text, name)
        if all(found.get(k) == v for k, v in (labels or {}).items())
    )
