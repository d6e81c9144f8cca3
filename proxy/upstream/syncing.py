"""Owns the shapes' reflectors: starts them, learns new shapes, drops unused ones.

Every reflector runs as a named task owned here and awaited on shutdown. Configured shapes
(``--resource``) and every persisted shape resume at start, before any client asks; a learned
shape is created the first time a client lists or watches a collection no shape covers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from proxy.cache.shapes import Request, ShapeKey, choose
from proxy.cache.store import Shape, Store
from proxy.metrics import Metrics
from proxy.upstream.connecting import Upstream
from proxy.upstream.errors import UpstreamStatusError
from proxy.upstream.reflecting import Reflector, ReflectorSettings
from proxy.upstream.resilience import Backoff, CircuitBreaker, ListLimiter

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class SyncSettings:
    learn: bool = True
    """Cache collections that clients ask for, not only the configured ones."""
    fill_wait: float = 120.0
    """How long a client's request for a newly learned shape waits for its first list before
    it is passed through instead (a huge collection may take longer than a client waits)."""
    unused_after: float = 6 * 3600.0
    """Learned shapes no client used for this long are dropped, so upstream watches stay
    bounded. Long enough to survive a controller's restart loop or a slow rollout."""
    maintenance_interval: float = 60.0
    """How often log retention, unused-shape dropping and size metrics run."""


class Syncer:
    def __init__(
        self,
        *,
        store: Store,
        upstream: Upstream,
        settings: SyncSettings,
        reflector_settings: ReflectorSettings,
        limiter: ListLimiter,
        breaker: CircuitBreaker,
        metrics: Metrics,
    ) -> None:
        self.store = store
        self.upstream = upstream
        self.settings = settings
        self.reflector_settings = reflector_settings
        self.limiter = limiter
        self.breaker = breaker
        self.metrics = metrics
        self.reflectors: dict[ShapeKey, Reflector] = {}
        self._tasks: dict[ShapeKey, asyncio.Task[None]] = {}
        self._maintenance: asyncio.Task[None] | None = None
        self.configured: list[ShapeKey] = []

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, configured: Iterable[ShapeKey]) -> None:
        for key in configured:
            await self.store.ensure_shape(key, configured=True)
            self.configured.append(key)
        for shape in list(self.store.shapes.values()):
            self._run(shape)
        self._maintenance = asyncio.create_task(self._maintain(), name="maintenance")

    async def stop(self) -> None:
        tasks = [*self._tasks.values()]
        if self._maintenance is not None:
            tasks.append(self._maintenance)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        with contextlib.suppress(Exception):
            await self.store.save_usage()

    def _run(self, shape: Shape) -> None:
        reflector = Reflector(
            shape=shape,
            store=self.store,
            upstream=self.upstream,
            settings=self.reflector_settings,
            limiter=self.limiter,
            breaker=self.breaker,
            backoff=Backoff(),
            metrics=self.metrics,
        )
        self.reflectors[shape.key] = reflector
        task = asyncio.create_task(reflector.run(), name=f"reflector {shape.key.identity}")
        self._tasks[shape.key] = task
        task.add_done_callback(functools.partial(self._ended, shape.key))

    def _ended(self, key: ShapeKey, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.error("reflector %s failed", key, exc_info=task.exception())

    # -- serving support ---------------------------------------------------------------------

    def ready(self) -> bool:
        """Every configured shape is serveable (loaded from disk or listed)."""
        return all(
            (shape := self.store.shapes.get(key)) is not None and shape.rv is not None
            for key in self.configured
        )

    def find(self, request: Request, *, namespaced: bool | None) -> Shape | None:
        key = choose(request, self.store.shapes.keys(), namespaced=namespaced)
        return self.store.shapes.get(key) if key is not None else None

    async def learn(self, key: ShapeKey) -> Shape:
        shape = self.store.shapes.get(key)
        if shape is None:
            shape = await self.store.ensure_shape(key, configured=False)
            logger.info("learned shape %s", key)
        if key not in self._tasks:
            self._run(shape)
        return shape

    async def wait_filled(self, shape: Shape, *, timeout: float | None = None) -> bool:
        """Wait for the shape's first list. False on timeout; a refusal by the apiserver
        raises its UpstreamStatusError (and the shape is dropped: never cache what the
        sidecar may not read)."""
        try:
            await asyncio.wait_for(
                shape.filled.wait(), self.settings.fill_wait if timeout is None else timeout
            )
        except TimeoutError:
            return False
        reflector = self.reflectors.get(shape.key)
        if reflector is not None and reflector.refused is not None:
            await self.drop(shape)
            raise reflector.refused.error
        return shape.rv is not None

    async def drop(self, shape: Shape) -> None:
        task = self._tasks.pop(shape.key, None)
        self.reflectors.pop(shape.key, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if shape.key in self.store.shapes:
            await self.store.drop_shape(shape)
        self.metrics.forget_shape(resource=shape.resource, shape=shape.key.identity)

    def upstream_lists(self, key: ShapeKey) -> int:
        reflector = self.reflectors.get(key)
        return reflector.lists if reflector else 0

    # -- maintenance -------------------------------------------------------------------------

    async def _maintain(self) -> None:
        while True:
            await asyncio.sleep(self.settings.maintenance_interval)
            try:
                await self.maintain_once()
            except Exception:
                logger.exception("maintenance failed")
                self.metrics.storage_errors.inc()

    async def maintain_once(self) -> None:
        now = time.time()
        for shape in list(self.store.shapes.values()):
            if not shape.configured and now - shape.used_at > self.settings.unused_after:
                logger.info("dropping unused shape %s", shape.key)
                await self.drop(shape)
        await self.store.trim()
        counts = await self.store.object_counts()
        for shape in self.store.shapes.values():
            self.metrics.shape_objects.labels(
                resource=shape.resource, shape=shape.key.identity
            ).set(counts.get(shape.id, 0))
        await self.store.save_usage()
        db, wal = self.store.size()
        self.metrics.db_size.set(db)
        self.metrics.db_wal_size.set(wal)


__all__ = ["SyncSettings", "Syncer", "UpstreamStatusError"]
