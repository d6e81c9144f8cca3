"""Hostile input (loadtest/fuzz.py), bounded: 20,000 random requests, malformed HTTP and raw
garbage at warmwatch in front of the real apiserver, with cached shapes. No 5xx the apiserver
does not give for the same bytes, no 4xx to a collection read that it answers with another
code, no traceback or ERROR line in warmwatch's log, no hang (no answer and no close within the
apiserver's own request deadline plus a margin), and RSS bounded.
``python -m loadtest.fuzz --requests N`` is the longer run."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from loadtest import fuzz, kubeapi
from loadtest.cluster import ControlPlane
from loadtest.sidecar import Sidecar

pytestmark = pytest.mark.e2e

REQUESTS = 20_000
RSS_BOUND = 250 * 2**20
"""A fuzz run's peak RSS is ~150 MiB (README: Limits); far more means memory is kept."""


async def test_fuzz(plane: ControlPlane, start_sidecar: Callable[..., Sidecar]) -> None:
    await fuzz.prepare(plane)
    sidecar = start_sidecar(resources=fuzz.SHAPES, extra=fuzz.SIDECAR_FLAGS)
    report = await fuzz.run(
        sidecar=sidecar,
        apiserver=fuzz.apiserver_address(plane),
        apiserver_tls=kubeapi.client_ssl(plane.pki, identity="admin"),
        requests=REQUESTS,
        seed=20_000,
    )
    print("\n".join(report.table()))
    assert sum(report.by_kind.values()) == REQUESTS
    assert report.statuses[200] > 1000  # the cases reach the cache, not only the parsers
    assert not report.server_errors, report.table()
    assert report.client_errors_replayed > 500  # the query checks are reached
    assert not report.client_errors_differing, report.table()
    assert not report.hangs, report.table()
    assert report.tracebacks == 0 and not report.error_lines, report.error_lines[:5]
    assert report.rss_max < RSS_BOUND
    assert sidecar.process.poll() is None
    assert sidecar.metric("warmwatch_client_errors_total", {"reason": "malformed"}) > 100
