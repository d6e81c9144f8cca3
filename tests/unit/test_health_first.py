"""The health port opens first: /livez answers and /readyz says "starting" while the cache
opens (a large cache's first open, a slow disk), so a probe or a benchmark polling it right
after the start is answered instead of refused."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from loadtest.ports import free_port
from proxy.app import App, Settings
from proxy.cache.store import Store
from tests.unit.upstream.conftest import token_kubeconfig


def app_on_free_ports(tmp_path: Path, **settings: Any) -> tuple[App, str]:
    """An App listening on free ports, and the base URL of its health port."""
    metrics_port = free_port()
    app = App(
        Settings(
            listen=("127.0.0.1", free_port()),
            metrics_listen=("127.0.0.1", metrics_port),
            db=tmp_path / "c.db",
            **settings,
        )
    )
    return app, f"http://127.0.0.1:{metrics_port}"


async def test_probes_are_answered_while_the_cache_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opening, release = asyncio.Event(), asyncio.Event()

    async def slow_open(*args: Any, **kwargs: Any) -> Store:
        opening.set()
        await release.wait()
        raise RuntimeError("not opened in this test")

    monkeypatch.setattr(Store, "open", slow_open)
    # (Upstream credentials are loaded before the cache opens: a new cache may be seeded.)
    kubeconfig = token_kubeconfig(tmp_path / "kc", server="http://127.0.0.1:9", token="t")
    app, health = app_on_free_ports(tmp_path, kubeconfig=str(kubeconfig))
    starting = asyncio.create_task(app.start())
    try:
        await asyncio.wait_for(opening.wait(), 5)
        async with aiohttp.ClientSession(health) as session:
            async with session.get("/livez") as live:
                assert live.status == 200
            async with session.get("/readyz?verbose") as ready:
                assert ready.status == 503
                assert "starting" in await ready.text()
    finally:
        release.set()
        with pytest.raises(RuntimeError):
            await starting
        await app.stop()


async def test_not_ready_before_the_api_port_is_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found measuring pod restarts: /readyz said ready once the shapes were loaded, before
    the API port opened; kube-controller-manager started on it had its first connections
    refused and synced a second later."""
    reached, release = asyncio.Event(), asyncio.Event()
    document_sizes = Store.document_sizes

    async def held_document_sizes(self: Store) -> list[tuple[str, int]]:  # before the API port
        reached.set()
        await release.wait()
        return await document_sizes(self)

    monkeypatch.setattr(Store, "document_sizes", held_document_sizes)
    kubeconfig = token_kubeconfig(tmp_path / "kc", server="http://127.0.0.1:9", token="t")
    app, health = app_on_free_ports(tmp_path, kubeconfig=str(kubeconfig))
    starting = asyncio.create_task(app.start())
    try:
        await asyncio.wait_for(reached.wait(), 5)
        assert app.syncer is not None and app.syncer.ready()  # all there is to load is loaded
        async with aiohttp.ClientSession(health) as session:
            async with session.get("/readyz?verbose") as ready:
                assert ready.status == 503
                assert "starting" in await ready.text()
            release.set()
            await asyncio.wait_for(starting, 5)
            async with session.get("/readyz") as ready:
                assert ready.status == 200
    finally:
        release.set()
        await asyncio.gather(starting, return_exceptions=True)
        await app.stop()
