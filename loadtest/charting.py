"""PNG charts of the benchmark's results (``python -m loadtest.bench ... --chart PATH``).

Drawn from what ``loadtest.bench`` already collects, nothing measured here:

- time to synced per client kind, directly from the apiserver vs through a warm warmwatch
  (and over the slow link, when measured), one panel per collection size: ``--clients``
  mode's samples, ``{(client kind, N, condition): [seconds, ...]}`` with conditions ``a``-``d``
  as in ``bench.CONDITIONS`` (medians are drawn);
- warmwatch's memory vs N (RSS once filled and after serving LISTs), and the informer's
  time to synced through warmwatch vs directly: the default mode's rows.

matplotlib is a dev dependency, imported only when a chart is drawn (Agg backend: no
display needed).
"""

from __future__ import annotations

import statistics
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

CONDITION_LABELS = {
    "a": "apiserver (direct)",
    "b": "warm warmwatch",
    "c": "apiserver over slow link",
    "d": "warm warmwatch over slow link",
}
COLORS = {"a": "#7f7f7f", "b": "#1f77b4", "c": "#c5b0d5", "d": "#2ca02c"}

Samples = Mapping[tuple[str, int, str], Sequence[float]]
"""Seconds to synced by (client kind, objects, condition)."""

DEFAULT_KIND = "dynamic informer, JSON"
"""The client the default bench mode measures (tests/goclient's informer)."""


def from_rows(
    rows: Sequence[Sequence[Any]],
) -> tuple[dict[tuple[str, int, str], list[float]], list[tuple[int, float, float]]]:
    """The default bench mode's rows — ``(size, fill s, RSS filled, RSS served, DB bytes,
    LIST rates x3, informer via warmwatch s, informer direct s)`` — as sync samples
    (conditions ``a`` direct and ``b`` through warmwatch) and memory points."""
    synced: dict[tuple[str, int, str], list[float]] = {}
    memory: list[tuple[int, float, float]] = []
    for row in rows:
        size, rss_filled, rss_served = int(row[0]), float(row[2]), float(row[3])
        synced[(DEFAULT_KIND, size, "b")] = [float(row[8])]
        synced[(DEFAULT_KIND, size, "a")] = [float(row[9])]
        memory.append((size, rss_filled, rss_served))
    return synced, memory


def draw(
    path: Path,
    *,
    synced: Samples | None = None,
    memory: Sequence[tuple[int, float, float]] = (),
    title: str = "warmwatch benchmark",
) -> Path:
    """Write the chart to ``path`` (PNG). ``memory``: ``(objects, RSS filled bytes, RSS
    served bytes)`` points. Panels without data are left out; at least one is needed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = dict(synced or {})
    sizes = sorted({size for _, size, _ in samples})
    panels = len(sizes) + (1 if memory else 0)
    if panels == 0:
        raise ValueError("nothing to draw: no sync times and no memory figures")
    figure, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 5.2), squeeze=False)
    for axis, size in zip(axes[0], sizes, strict=False):
        _sync_panel(axis, samples, size)
    if memory:
        _memory_panel(axes[0][-1], memory)
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=100)
    plt.close(figure)
    return path


def _sync_panel(axis: Any, samples: Samples, size: int) -> None:
    kinds = list(dict.fromkeys(kind for kind, n, _ in samples if n == size))
    conditions = [c for c in CONDITION_LABELS if any((k, size, c) in samples for k in kinds)]
    width = 0.8 / max(len(conditions), 1)
    for offset, condition in enumerate(conditions):
        xs, heights = [], []
        for index, kind in enumerate(kinds):
            values = [v for v in samples.get((kind, size, condition), ()) if v == v]  # not NaN
            if values:
                xs.append(index + (offset - (len(conditions) - 1) / 2) * width)
                heights.append(statistics.median(values))
        bars = axis.bar(
            xs, heights, width, label=CONDITION_LABELS[condition], color=COLORS[condition]
        )
        axis.bar_label(bars, fmt="%.2g", fontsize=7, padding=1)
    labels = [textwrap.fill(kind, width=16) for kind in kinds]
    axis.set_xticks(range(len(kinds)), labels, fontsize=8)
    axis.set_ylabel("seconds until the informer is synced")
    axis.set_title(f"Time to synced, {size:,} objects")
    axis.legend(fontsize=8)
    axis.grid(axis="y", alpha=0.3)


def _memory_panel(axis: Any, memory: Sequence[tuple[int, float, float]]) -> None:
    points = sorted(memory)
    sizes = [p[0] for p in points]
    axis.plot(sizes, [p[1] / 1e6 for p in points], "o-", label="RSS filled")
    axis.plot(sizes, [p[2] / 1e6 for p in points], "s--", label="RSS after serving LISTs")
    axis.set_xscale("log")
    axis.set_xticks(sizes, [f"{n:,}" for n in sizes], fontsize=8)
    axis.minorticks_off()
    axis.set_ylim(bottom=0)
    axis.set_xlabel("cached objects (N)")
    axis.set_ylabel("warmwatch RSS, MB")
    axis.set_title("Memory vs N")
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3)


def draw_rows(path: Path, rows: Sequence[Sequence[Any]]) -> Path:
    """The default bench mode's chart: its informer sync times and memory vs N."""
    synced, memory = from_rows(rows)
    return draw(
        path, synced=synced, memory=memory, title="warmwatch: informer sync and memory vs N"
    )
