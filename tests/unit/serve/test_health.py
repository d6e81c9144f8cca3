"""warmwatch's own health answers, in the apiserver's form (no sockets)."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request

from proxy.serve import health


def answer(path: str, ok: bool = True, why: str = "ok") -> tuple[int, str]:
    response = health.answer(make_mocked_request("GET", path), check=lambda: (ok, why))
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.text is not None
    return response.status, response.text


@pytest.mark.parametrize("endpoint", ["healthz", "livez", "readyz"])
def test_passing(endpoint: str) -> None:
    assert answer(f"/{endpoint}") == (200, "ok")
    assert answer(f"/{endpoint}?verbose") == (
        200,
        f"[+]ping ok\n[+]warmwatch ok\n{endpoint} check passed\n",
    )
    assert answer(f"/{endpoint}/etcd") == (200, "ok")


def test_failing() -> None:
    assert answer("/readyz", ok=False, why="storage: disk full") == (
        503,
        "[+]ping ok\n[-]warmwatch failed: storage: disk full\nreadyz check failed\n",
    )
    status, text = answer("/readyz/informer-sync", ok=False, why="not filled")
    assert status == 503 and "informer-sync failed: not filled" in text


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/healthz", True),
        ("/livez/ping", True),
        ("/readyz/poststarthook/x", True),
        ("/healthzz", False),
        ("/api/v1/healthz", False),
    ],
)
def test_health_paths(path: str, expected: bool) -> None:
    assert health.is_health_path(path) is expected
