"""Storage faults and shutdown: a full disk, a broken database file, SIGTERM.

- The database on a small filesystem that fills up: serving continues from what is committed,
  the error shows in metrics and /readyz, nothing is corrupted, and writing resumes (from the
  last committed RV) once space is freed.
- A corrupted or foreign database file at start is moved aside and rebuilt from upstream.
- SIGTERM: open watches end cleanly, and warmwatch exits well within a pod's grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from loadtest import kubeapi
from loadtest.goclient import GoClient
from loadtest.sidecar import Sidecar
from tests.e2e.conftest import CreateMany, Kubectl, converge, listed_keys

pytestmark = pytest.mark.e2e


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 6 MiB tmpfs, remounted larger by the test to free space."""
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


async def test_full_disk_keeps_serving_and_recovers(
    small_disk: Path,
    namespace: str,
    kubectl: Kubectl,
    admin_api: kubeapi.RawClient,
    create_many: CreateMany,
    start_sidecar: Callable[..., Sidecar],
    start_goclient: Callable[..., GoClient],
) -> None:
    shape = f"v1/configmaps@{namespace}"
    await create_many(namespace=namespace, count=50, size=1024)
    sidecar = start_sidecar(resources=[shape], db=small_disk / "cache.db")
    client = start_goclient(kubeconfig=sidecar.kubeconfig, resources=[shape])
    assert client.wait_synced()[0]["count"] == 50

    # ~12 MiB of new objects cannot fit in 6 MiB: writes fail, serving goes on.
    await kubeapi.create_configmaps(
        admin_api, namespace=namespace, count=120, size=100_000, prefix="big"
    )
    for _ in range(120):
        if sidecar.metric("warmwatch_storage_errors_total") > 0:
            break
        await asyncio.sleep(0.5)
    assert sidecar.metric("warmwatch_storage_errors_total") > 0
    code, text = sidecar.readyz()
    assert code == 503 and "storage" in text, (code, text)
    listed = json.loads(
        kubectl(
            "get", "configmaps", "-n", namespace, "-o", "json", kubeconfig=sidecar.kubeconfig
        ).stdout
    )
    assert len(listed["items"]) >= 50  # what was committed is still served
    with sqlite3.connect(small_disk / "cache.db") as db:
        assert db.execute("PRAGMA quick_check").fetchone()[0] == "ok"

    subprocess.run(["mount", "-o", "remount,size=256m", str(small_disk)], check=True)
    await converge(client, shape, listed_keys(kubectl, "configmaps", namespace))
    for _ in range(60):
        if sidecar.readyz()[0] == 200:
            break
        await asyncio.sleep(0.5)
    assert sidecar.readyz()[0] == 200


@pytest.mark.parametrize(
    "content", [b"this is not a database" * 100, b"SQLite format 3\x00" + b"\x01" * 4000]
)
def test_broken_database_is_moved_aside_and_rebuilt(
    content: bytes,
    namespace: str,
    start_sidecar: Callable[..., Sidecar],
    tmp_path: Path,
    kubectl: Kubectl,
) -> None:
    kubectl("create", "configmap", "present", "-n", namespace)
    db = tmp_path / "broken.db"
    db.write_bytes(content)
    sidecar = start_sidecar(resources=[f"v1/configmaps@{namespace}"], db=db)
    names = kubectl(
        "get", "configmaps", "-n", namespace, "-o", "name", kubeconfig=sidecar.kubeconfig
    ).stdout.split()
    assert names == ["configmap/present"]
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("broken.db.broken-")]
    assert aside and aside[0].read_bytes() == content
    assert "moved to" in sidecar.log.read_text()


def test_foreign_sqlite_database_is_moved_aside(
    namespace: str,
    start_sidecar: Callable[..., Sidecar],
    tmp_path: Path,
    kubectl: Kubectl,
) -> None:
    db = tmp_path / "foreign.db"
    with sqlite3.connect(db) as foreign:
        foreign.execute("CREATE TABLE users (id INTEGER)")
    sidecar = start_sidecar(resources=[f"v1/configmaps@{namespace}"], db=db)
    assert kubectl("get", "configmaps", "-n", namespace, kubeconfig=sidecar.kubeconfig)
    assert any(p.name.startswith("foreign.db.broken-") for p in tmp_path.iterdir())


async def test_sigterm_ends_watches_cleanly_and_exits_fast(
    namespace: str,
    start_sidecar: Callable[..., Sidecar],
    create_many: CreateMany,
) -> None:
    await create_many(namespace=namespace, count=20)
    sidecar = start_sidecar(resources=[f"v1/configmaps@{namespace}"])
    async with kubeapi.RawClient(base_url=sidecar.url) as client:
        events: list[dict[str, object]] = []
        initial_state = asyncio.Event()

        async def watch() -> None:
            async for event in client.watch(
                f"/api/v1/namespaces/{namespace}/configmaps", resourceVersion="0"
            ):
                events.append(event)
                if len(events) == 20:
                    initial_state.set()

        watcher = asyncio.create_task(watch())
        await asyncio.wait_for(initial_state.wait(), 30)
        started = time.monotonic()
        code = await asyncio.to_thread(sidecar.stop, 30)
        elapsed = time.monotonic() - started
        # The stream ended cleanly (end of the chunked body), not with a reset.
        await asyncio.wait_for(watcher, 10)
    assert code == 0
    assert elapsed < 20, elapsed  # a pod's default grace period is 30 s
    with contextlib.closing(sqlite3.connect(sidecar.db)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
