"""The database, its WAL and its shared-memory file are readable by warmwatch's user only
(``store.keep_private``): they hold every cached object, Secrets included. Found by a probe:
created under the process umask, they were 0644 under the usual 022.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.cache.shapes import ShapeKey
from proxy.cache.store import Store, StoreSettings
from tests.unit.cache.test_retention import CM, big, filled_shape


@pytest.fixture
def umask_022() -> Iterator[None]:
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def modes(path: Path) -> dict[str, int]:
    return {
        suffix: stat.S_IMODE(Path(f"{path}{suffix}").stat().st_mode)
        for suffix in ("", "-wal", "-shm")
        if Path(f"{path}{suffix}").exists()
    }


@pytest.mark.usefixtures("umask_022")
async def test_the_database_and_its_wal_and_shm_are_private_whatever_the_umask(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.db"
    store = await Store.open(StoreSettings(path=path))
    try:
        shape = await filled_shape(store)
        await store.apply(shape, [big("a", 11)])
        assert modes(path) == {"": 0o600, "-wal": 0o600, "-shm": 0o600}
    finally:
        await store.close()


@pytest.mark.usefixtures("umask_022")
async def test_files_others_could_read_are_made_private_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As an earlier build left them (a crash leaves the WAL and SHM files too)."""
    path = tmp_path / "c.db"
    store = await Store.open(StoreSettings(path=path))
    await filled_shape(store)
    await store.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").touch()
        os.chmod(f"{path}{suffix}", 0o644)
    with caplog.at_level(logging.WARNING, logger="proxy.cache.store"):
        reopened = await Store.open(StoreSettings(path=path))
    try:
        assert modes(path) == {"": 0o600, "-wal": 0o600, "-shm": 0o600}
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warned) == 3 and all("mode 0644" in m for m in warned), warned
        assert set(reopened.shapes) == {ShapeKey.of(CM)}
    finally:
        await reopened.close()
