"""Crash safety: ``kill -9`` of warmwatch in the middle of a write burst never leaves a cache
that cannot open or that disagrees with the apiserver once it caught up."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable

import pytest

from loadtest import kubeapi
from loadtest.goclient import GoClient
from loadtest.sidecar import Sidecar
from tests.e2e.conftest import Kubectl, converge, listed_keys

pytestmark = pytest.mark.e2e

WRITES = 15_000
"""Enough to outlast three crashes and restarts (~5 s) when the apiserver creates ~1,800/s."""


async def test_kill_9_during_a_write_burst(
    namespace: str,
    kubectl: Kubectl,
    admin_api: kubeapi.RawClient,
    start_sidecar: Callable[..., Sidecar],
    start_goclient: Callable[..., GoClient],
) -> None:
    shape = f"v1/configmaps@{namespace}"
    sidecar = start_sidecar(resources=[shape])
    client = start_goclient(kubeconfig=sidecar.kubeconfig, resources=[shape])
    client.wait_synced()

    burst = asyncio.create_task(
        kubeapi.create_configmaps(admin_api, namespace=namespace, count=WRITES, size=512)
    )
    for _ in range(3):  # three crashes at different points of the burst
        await asyncio.sleep(1.0)
        assert not burst.done(), "the burst ended before the crash: make it longer"
        sidecar.kill()
        sidecar.restart()  # the database opens (integrity-checked at start)
    await burst

    expected = listed_keys(kubectl, "configmaps", namespace)
    assert len(expected) == WRITES
    await converge(client, shape, expected)

    sidecar.stop()
    with sqlite3.connect(sidecar.db) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        (objects,) = db.execute(  # the generation readers see (docs/design.md §3)
            "SELECT count(*) FROM objects o JOIN shapes s ON o.gen = s.gen"
        ).fetchone()
        assert objects == WRITES
