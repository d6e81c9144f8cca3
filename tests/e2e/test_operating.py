"""``warmwatch verify`` and ``warmwatch inspect`` on a real cache of a real apiserver."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loadtest import kubeapi
from loadtest.cluster import ControlPlane
from loadtest.sidecar import Sidecar
from proxy.cache import schema
from tests.e2e.conftest import CreateMany

pytestmark = pytest.mark.e2e

OBJECTS = 300


async def warmwatch(*args: str) -> tuple[int, str, str]:
    """Run ``python -m proxy ARGS``: exit status, stdout, stderr."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def verify(plane: ControlPlane, db: Path) -> tuple[int, dict[str, Any], str]:
    code, out, err = await warmwatch(
        "verify",
        f"--db={db}",
        f"--kubeconfig={plane.admin_kubeconfig}",
        "--page-size=70",
        "-o",
        "json",
    )
    return code, json.loads(out), err


async def churn(api: kubeapi.RawClient, namespace: str, stop: asyncio.Event) -> int:
    """Patch ConfigMaps one after another until told to stop; how many writes."""
    writes = 0
    while not stop.is_set():
        await api.merge_patch(
            f"/api/v1/namespaces/{namespace}/configmaps/cm-{writes % OBJECTS:06d}",
            {"data": {"churn": str(writes)}},
        )
        writes += 1
    return writes


async def test_verify_and_inspect(
    plane: ControlPlane,
    namespace: str,
    admin_api: kubeapi.RawClient,
    create_many: CreateMany,
    start_sidecar: Callable[..., Sidecar],
) -> None:
    await create_many(namespace=namespace, count=OBJECTS)
    json_shape, protobuf_shape = f"v1/configmaps@{namespace}", f"v1/configmaps@{namespace};protobuf"
    sidecar = start_sidecar(resources=[json_shape, protobuf_shape])  # ready: both filled

    # A converged cache, verified while warmwatch runs and the collection keeps changing:
    # the comparison is at the cache's snapshot RV, so live writes are not differences.
    stop = asyncio.Event()
    writer = asyncio.create_task(churn(admin_api, namespace, stop))
    try:
        code, report, err = await verify(plane, sidecar.db)
    finally:
        stop.set()
        writes = await writer
    assert writes > 0
    assert code == 0, (report, err)
    assert report["equal"] is True and report["errors"] == []
    shapes = {s["shape"]: s for s in report["shapes"]}
    assert set(shapes) == {json_shape, protobuf_shape}
    for shape in shapes.values():
        assert shape["comparedAtCacheResourceVersion"] is True
        assert shape["equal"] == OBJECTS and shape["differences"] == 0
    assert "objects compared" in err or "[1/2]" in err  # progress on stderr

    # inspect against the running warmwatch (read-only beside the writer)
    code, out, _ = await warmwatch("inspect", f"--db={sidecar.db}", "-o", "json")
    assert code == 0
    inspected = json.loads(out)
    assert inspected["database"]["schemaVersion"] == schema.SCHEMA_VERSION
    assert inspected["database"]["dbBytes"] > 0
    assert {s["shape"] for s in inspected["shapes"]} == {json_shape, protobuf_shape}
    for shape in inspected["shapes"]:
        assert shape["objects"] == OBJECTS and shape["objectBytes"] > OBJECTS * 10
        assert shape["resourceVersion"] and shape["lastCommit"]
        assert shape["log"]["events"] >= 1  # the churn's events (and bookmarks)

    assert sidecar.stop() == 0
    # Corruption by hand in the stopped warmwatch's database, one of each kind, in the JSON
    # shape: a row deleted, an extra row, a resourceVersion tampered with.
    with sqlite3.connect(sidecar.db) as db:
        (gen,) = db.execute("SELECT gen FROM shapes WHERE key = ?", (json_shape,)).fetchone()
        db.execute("DELETE FROM objects WHERE gen = ? AND name = 'cm-000010'", (gen,))
        db.execute(
            "INSERT INTO objects (gen, namespace, name, uid, rv, labels, raw) "
            "SELECT gen, namespace, 'cm-extra', uid, rv, labels, raw FROM objects "
            "WHERE gen = ? AND name = 'cm-000020'",
            (gen,),
        )
        db.execute("UPDATE objects SET rv = '1' WHERE gen = ? AND name = 'cm-000030'", (gen,))
    code, report, err = await verify(plane, sidecar.db)
    assert code == 1, (report, err)
    shapes = {s["shape"]: s for s in report["shapes"]}
    assert shapes[protobuf_shape]["differences"] == 0
    broken = shapes[json_shape]
    assert (broken["missing"], broken["extra"], broken["stale"]) == (1, 1, 1)
    assert broken["equal"] == OBJECTS - 2
    examples = {(e["difference"], e["name"]) for e in broken["examples"]}
    assert examples == {("missing", "cm-000010"), ("extra", "cm-extra"), ("stale", "cm-000030")}

    # The human form says the same; inspect's table names both collections.
    code, out, _ = await warmwatch(
        "verify", f"--db={sidecar.db}", f"--kubeconfig={plane.admin_kubeconfig}"
    )
    assert code == 1
    assert f"{json_shape}: DIFFERENT" in out and f"{protobuf_shape}: equal" in out
    assert "cm-extra" in out
    code, out, _ = await warmwatch("inspect", f"--db={sidecar.db}")
    assert (
        code == 0
        and json_shape in out
        and f"{OBJECTS:,}" in out
        and f"schema version {schema.SCHEMA_VERSION}" in out
    )
