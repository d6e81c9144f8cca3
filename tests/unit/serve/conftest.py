"""A real aiohttp server on loopback in front of a real store, for the serving tests that
need sockets (answers cut, watchers following the log)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, cast

from aiohttp import web

from proxy.cache.freshness import RecentWrites
from proxy.cache.shapes import Request, ShapeKey, choose
from proxy.cache.store import Store
from proxy.metrics import Metrics
from proxy.serve import routing
from proxy.serve.authenticating import ClientAuth
from proxy.serve.context import Context, ServeSettings
from proxy.serve.limiting import Admission, Limits
from proxy.upstream.syncing import SyncSettings


@contextlib.asynccontextmanager
async def serving(
    store: Store,
    *,
    settings: ServeSettings,
    limits: Limits | None = None,
    learned: list[ShapeKey] | None = None,
) -> AsyncIterator[int]:
    """The API listener on a free loopback port (yielded), serving ``store``'s shapes.

    ``learned``: warmwatch learns shapes, and each shape it learns is appended there (and not
    filled); else it learns none."""

    async def learn(key: ShapeKey) -> None:
        assert learned is not None
        learned.append(key)

    def find(request: Request, *, namespaced: bool | None) -> Any:
        key = choose(request, store.shapes.keys(), namespaced=namespaced)
        return store.shapes.get(key) if key else None

    ctx = Context(
        store=store,
        syncer=cast(
            Any,
            SimpleNamespace(
                find=find,
                holds=lambda gvr: True,
                has_protobuf=lambda gvr: gvr.may_have_protobuf,
                learn=learn,
                settings=SyncSettings(),
            ),
        ),
        upstream=cast(Any, None),
        discovery=cast(Any, None),
        metrics=Metrics(),
        settings=settings,
        credentials="sidecar",
        learn=learned is not None,
        breaker=cast(Any, None),
        ready=lambda: (True, "ok"),
        writes=RecentWrites(),
        admission=Admission(limits or Limits()),
    )
    runner = web.AppRunner(routing.api_app(ctx, auth=ClientAuth(mode="none")))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()
