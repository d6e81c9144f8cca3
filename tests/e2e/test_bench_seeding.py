"""The seeding benchmark (``python -m loadtest.bench --seeding``, loadtest/bench/seeding.py),
a fast run on the suite's control plane: OBJECTS ConfigMaps, one run of its three cells over
the slow link.

Its table is only worth reading if each row is the restart it names: the cold warmwatch filled
the collection from the apiserver (one upstream LIST, no seeding, the fill's bytes over its
link); the seeded one installed its peer's snapshot and listed nothing upstream; the warm one
resumed on its own database and listed nothing. Each is checked from the warmwatch's own
counters and toxiproxy's, not from the bench's notes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtest import goclient, seeding, toxiproxy
from loadtest.bench.clients import CLIENTS_NAMESPACE, grow_random
from loadtest.bench.seeding import CONDITIONS, SeedingBench
from loadtest.cluster import ControlPlane

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

OBJECTS = 1000
KB = 2
"""~2.7 MB of protobuf for the cold fill: well above what discovery and the seeding's token
requests carry over the link."""


async def _clean(plane: ControlPlane) -> None:
    """The benchmark's namespace (its ConfigMaps, account and namespaced grants) and its
    cluster-wide grants: later tests list every ConfigMap."""
    async with seeding.admin(plane) as api:
        await seeding.revoke(api, home=CLIENTS_NAMESPACE)
        await api.delete(f"/api/v1/namespaces/{CLIENTS_NAMESPACE}")


@pytest.fixture
def bench(plane: ControlPlane, tmp_path: Path) -> Iterator[SeedingBench]:
    asyncio.run(grow_random(plane, to=OBJECTS, kb=KB))
    try:
        started = SeedingBench.start(
            plane=plane, directory=tmp_path, link=toxiproxy.Link(), binary=goclient.build()
        )
        try:
            yield started
        finally:
            started.stop()
    finally:
        asyncio.run(_clean(plane))


def test_the_three_restarts_are_what_their_rows_say(bench: SeedingBench) -> None:
    bench.run_size(OBJECTS, runs=1)

    (cold,), (seeded,), (warm,) = (bench.samples[(OBJECTS, c)] for c in ("cold", "seeded", "warm"))
    assert (cold.lists, cold.installed, cold.seed_bytes) == (1, 0, 0)
    assert (seeded.lists, seeded.installed) == (0, 1) and seeded.seed_bytes > 0
    assert seeded.seed_seconds > 0 and cold.seed_seconds != cold.seed_seconds  # NaN: none
    assert (warm.lists, warm.installed) == (0, 0)
    # The fill crossed the link (gzip takes a quarter off random data); a seeded or warm start
    # carries far less over it.
    assert cold.link_down > OBJECTS * KB * 1024 / 2
    assert seeded.link_down < cold.link_down / 2 and warm.link_down < cold.link_down / 2
    for restart in (cold, seeded, warm):
        assert restart.ready > 0 and restart.client > 0  # every client synced (not NaN)
        assert restart.synced == pytest.approx(restart.ready + restart.client)

    table = bench.table(sizes=[OBJECTS], runs=1, kb=KB)
    rows = [line for line in table if line.startswith("| ") and f"| {OBJECTS:,} |" in line]
    assert [row.split("|")[1].strip() for row in rows] == list(CONDITIONS.values())
    cold_row, seeded_row, _ = (row.split("|") for row in rows)
    assert cold_row[6].strip() == "1.00x" and cold_row[7].strip() == "1"
    assert seeded_row[7].strip() == "0"
