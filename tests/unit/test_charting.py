"""loadtest.charting: the bench's results drawn as a PNG."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from loadtest import charting

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def is_png(path: Path) -> bool:
    data = path.read_bytes()
    return data.startswith(PNG_MAGIC) and len(data) > 5000


def test_client_kinds_by_condition_and_memory(tmp_path: Path) -> None:
    kinds = ["dynamic informer, JSON", "typed informer, protobuf"]
    samples = {
        (kind, size, condition): [base * size / 10_000, base * size / 9_000]
        for kind in kinds
        for size in (10_000, 100_000)
        for condition, base in (("a", 1.6), ("b", 1.2), ("c", 3.8), ("d", 1.4))
    }
    samples[(kinds[0], 10_000, "d")] = [math.nan]  # a failed run is left out, not drawn
    path = charting.draw(
        tmp_path / "out" / "bench.png",
        synced=samples,
        memory=[(10_000, 121e6, 121e6), (200_000, 123e6, 133e6)],
    )
    assert path == tmp_path / "out" / "bench.png" and is_png(path)


def test_the_default_mode_rows(tmp_path: Path) -> None:
    rows = [
        (10_000, 1.1, 121e6, 121e6, 34e6, 419.0, 218.0, 230.0, 1.59, 1.64),
        (50_000, 5.2, 123e6, 130e6, 149e6, 305.0, 164.0, 160.0, 10.10, 9.83),
    ]
    synced, memory = charting.from_rows(rows)
    assert synced[(charting.DEFAULT_KIND, 50_000, "b")] == [10.10]
    assert synced[(charting.DEFAULT_KIND, 50_000, "a")] == [9.83]
    assert memory == [(10_000, 121e6, 121e6), (50_000, 123e6, 130e6)]
    assert is_png(charting.draw_rows(tmp_path / "rows.png", rows))


def test_nothing_to_draw_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nothing to draw"):
        charting.draw(tmp_path / "empty.png")
    assert not (tmp_path / "empty.png").exists()
