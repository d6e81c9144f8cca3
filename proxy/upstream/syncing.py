"""Owns the shapes' reflectors: starts them, learns new shapes, drops unused ones.

Every reflector runs under a supervisor task owned here and awaited on shutdown. Configured
shapes (``--resource``) and every persisted shape resume at start, before any client asks; a
learned shape is created the first time a client lists or watches a collection no shape
covers. Any number of shapes fill at once: the list limiter bounds only their list phases.

The supervisor never leaves a shape without its reflector:

- a reflector that fails unexpectedly is restarted with backoff
  (``warmwatch_reflector_restarts_total{reason="failed"}``);
- a first list refused upstream (401/403/404): a learned shape is dropped (the waiting client
  is passed through and gets the apiserver's answer); a configured one is retried with backoff;
- access revoked from a filled shape (403/404 in a row: RBAC changed, CRD deleted): the shape
  and its data are dropped, which ends its watches; clients then get the apiserver's own
  answer, as they would without warmwatch. A configured shape starts over, empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from proxy.cache.shapes import Request, Shape, ShapeKey, choose
from proxy.cache.store import Store
from proxy.kube.resources import GroupVersionResource
from proxy.metrics import Metrics
from proxy.upstream.connecting import Upstream
from proxy.upstream.errors import UpstreamStatusError
from proxy.upstream.reflecting import Ending, FillState, Reflector, ReflectorSettings
from proxy.upstream.resilience import Backoff, BackoffSettings, CircuitBreaker, ListLimiter

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class SyncSettings:
    learn: bool = True
    """Cache collections that clients ask for, not only the configured ones."""
    fill_stall: float = 60.0
    """A client's request for a shape that is being filled waits for the fill as long as the
    fill (or, while it is queued, the fills ahead of it) made progress within this time;
    a fill that failed, or stalled this long, has the request passed through instead. A
    LIST page or a batch of WatchList events arrives in well under a second from a healthy
    apiserver, so a minute of silence means trouble, not a big collection."""
    max_shapes: int = 500
    """Learned shapes at most (configured ones come on top). Each is an upstream watch, a
    reflector and a ring of up to 4,096 recent events in memory; a client that asks for
    ever new namespaces or selectors must not multiply them without bound. Beyond the limit,
    requests for new shapes pass through to the apiserver. kube-controller-manager with every
    controller needs about 60."""
    max_key_bytes: int = 4096
    """Selectors (label and field together, canonical) of a learned shape at most; a request
    with longer ones is passed through, not learned (``warmwatch_shape_limit_total{reason=
    "key_bytes"}``). A shape holds its key for its life, in its reflector's requests, its
    metrics' labels and its log lines: 12 shapes learned from 683 KiB label selectors took
    warmwatch from 50 to 234 MiB. Real controllers' selectors are tens to a few hundred
    bytes (kubelet's ``spec.nodeName=<node>``; a requirement's key is at most 316 bytes and a
    value 63); 4 KiB leaves room for a dozen full-length requirements."""
    unused_after: float = 6 * 3600.0
    """Learned shapes no client used for this long are dropped, so upstream watches stay
    bounded. Long enough to survive a controller's restart loop or a slow rollout."""
    backoff: BackoffSettings = field(default_factory=BackoffSettings)
    """Retry delays of each reflector, and of its supervisor between restarts."""
    maintenance_interval: float = 60.0
    """How often log retention, unused-shape dropping and size metrics run."""
    refused_for: float = 60.0
    """A collection whose first list the apiserver refused (a resource that does not exist, a
    field selector it does not support, no permission) is not learned again for this long:
    its requests pass through at once. Without it every such request — a typo repeated by a
    controller's retries, or a hostile client — costs an upstream list and a warning."""


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
        self._refused: dict[ShapeKey, float] = {}
        """Learned shapes whose first list was refused, and when (``refused_for``)."""
        self.without_protobuf: set[GroupVersionResource] = set()
        """Resources whose apiserver answered a protobuf list in JSON (custom resources in a
        ``*.k8s.io`` group): their clients are served from JSON shapes."""

    def has_protobuf(self, gvr: GroupVersionResource) -> bool:
        """``gvr`` has a protobuf form: a built-in type the apiserver did not answer in JSON."""
        return gvr.may_have_protobuf and gvr not in self.without_protobuf

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, configured: Iterable[ShapeKey]) -> None:
        for key in configured:
            await self.store.ensure_shape(key, configured=True)
            self.configured.append(key)
        for shape in list(self.store.shapes.values()):
            if not shape.configured and self._oversized(shape.key):
                # Learned by a build without the bound: not kept (nor watched) for its key.
                logger.info("dropping shape %s: its selectors are too long", shape.resource)
                await self._forget(shape, reason="oversized")
                continue
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
        # The first reflector exists before the task runs: a client may wait for it at once.
        first = self._reflector(shape)
        task = asyncio.create_task(
            self._supervise(shape, first), name=f"reflector {shape.key.identity}"
        )
        self._tasks[shape.key] = task
        task.add_done_callback(functools.partial(self._ended, shape.key))

    def _reflector(self, shape: Shape) -> Reflector:
        reflector = Reflector(
            shape=shape,
            store=self.store,
            upstream=self.upstream,
            settings=self.reflector_settings,
            limiter=self.limiter,
            breaker=self.breaker,
            backoff=Backoff(self.settings.backoff),
            metrics=self.metrics,
        )
        self.reflectors[shape.key] = reflector
        return reflector

    async def _supervise(self, shape: Shape, reflector: Reflector) -> None:
        """Run the shape's reflector; restart it, or drop the shape, as the module says."""
        backoff = Backoff(self.settings.backoff)
        while True:
            reason: str
            try:
                ending = await reflector.run()
            except Exception:
                logger.exception("reflector %s failed; restarting it", shape.key)
                reason = "failed"
            else:
                reason = ending.value
                refusal = reflector.fill.refusal
                if refusal is not None and refusal.code == 406:
                    self.without_protobuf.add(shape.key.gvr)
                if ending is Ending.REFUSED and not shape.configured:
                    self._note_refused(shape.key)
                try:
                    await self._forget(shape, reason=reason)
                    if not shape.configured:
                        return
                    shape = await self.store.ensure_shape(shape.key, configured=True)
                except Exception:
                    logger.exception("cannot reset shape %s; retrying", shape.key)
            self.metrics.reflector_restarts.labels(resource=shape.resource, reason=reason).inc()
            await asyncio.sleep(backoff.next_delay())
            reflector = self._reflector(shape)

    def _recently_refused(self, key: ShapeKey) -> bool:
        at = self._refused.get(key)
        return at is not None and time.monotonic() - at < self.settings.refused_for

    def _note_refused(self, key: ShapeKey) -> None:
        now = time.monotonic()
        for old in [k for k, at in self._refused.items() if now - at >= self.settings.refused_for]:
            del self._refused[old]
        self._refused[key] = now

    def _ended(self, key: ShapeKey, task: asyncio.Task[None]) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]
        if not task.cancelled() and task.exception() is not None:
            logger.error("supervisor of %s failed", key, exc_info=task.exception())

    # -- serving support ---------------------------------------------------------------------

    def ready(self) -> bool:
        """Every configured shape is serveable (loaded from disk or listed)."""
        return all(
            (shape := self.store.shapes.get(key)) is not None and shape.rv is not None
            for key in self.configured
        )

    def holds(self, gvr: GroupVersionResource) -> bool:
        """Some shape of ``gvr`` has been listed: the apiserver serves that resource."""
        return any(
            key.gvr == gvr and shape.rv is not None for key, shape in self.store.shapes.items()
        )

    def find(self, request: Request, *, namespaced: bool | None) -> Shape | None:
        key = choose(request, self.store.shapes.keys(), namespaced=namespaced)
        return self.store.shapes.get(key) if key is not None else None

    async def learn(self, key: ShapeKey) -> Shape | None:
        """The shape ``key``, learned now if new; None when its selectors are longer than
        ``max_key_bytes`` or ``max_shapes`` learned shapes exist already (the request is
        passed through: ``warmwatch_shape_limit_total``) or its first list was refused within
        ``refused_for`` (passed through too)."""
        shape = self.store.shapes.get(key)
        if shape is None and self._recently_refused(key):
            return None
        if shape is None and self._oversized(key):
            self.metrics.shape_limit.labels(reason="key_bytes").inc()
            logger.debug("not learning a shape of %s: its selectors are too long", key.gvr)
            return None
        if shape is None:
            learned = sum(1 for s in self.store.shapes.values() if not s.configured)
            if learned >= self.settings.max_shapes:
                self.metrics.shape_limit.labels(reason="shapes").inc()
                logger.info("not learning %s: %d learned shapes already", key, learned)
                return None
            shape = await self.store.ensure_shape(key, configured=False)
        self._ensure_running(shape)
        return shape

    def _ensure_running(self, shape: Shape) -> None:
        """Start the shape's reflector unless it runs. A new shape is in the store (where
        requests find it) from its insert on, and every learner of it resumes after that:
        a request planned meanwhile waits for its fill before any learner has started it."""
        if shape.key not in self._tasks:
            self._run(shape)

    def _oversized(self, key: ShapeKey) -> bool:
        return key.selector_bytes > self.settings.max_key_bytes

    async def wait_filled(self, shape: Shape) -> bool:
        """Wait for the shape's first list while the fill makes progress.

        True once filled; False when the fill failed or stalled (see ``fill_stall``): pass the
        request through. A refusal by the apiserver raises its UpstreamStatusError (the
        supervisor drops the shape: never cache what the sidecar may not read)."""
        while shape.rv is None:
            if self.store.shapes.get(shape.key) is not shape:
                return False  # dropped meanwhile
            self._ensure_running(shape)
            reflector = self.reflectors.get(shape.key)
            if reflector is None:
                return False  # a configured shape's supervisor restarting it
            fill = reflector.fill
            if fill.state is FillState.REFUSED:
                assert fill.refusal is not None
                raise fill.refusal
            if fill.state is FillState.BACKING_OFF:
                return False
            progressed = fill.progressed_at
            if fill.state is FillState.QUEUED:
                progressed = max(progressed, self.limiter.progressed_at)
            remaining = progressed + self.settings.fill_stall - time.monotonic()
            if remaining <= 0:
                logger.warning("%s: fill made no progress for %.0fs", shape.key, -remaining)
                return False
            await fill.changed(timeout=min(remaining, 1.0))
        return True

    async def drop(self, shape: Shape) -> None:
        if self.store.shapes.get(shape.key) is not shape:
            return  # dropped meanwhile (refused, revoked): its key's task may be a new shape's
        task = self._tasks.pop(shape.key, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self._forget(shape, reason="unused")

    async def _forget(self, shape: Shape, *, reason: str) -> None:
        """Drop the shape's data and close its log (open watches end)."""
        if self.reflectors.get(shape.key) is not None:
            del self.reflectors[shape.key]
        if self.store.shapes.get(shape.key) is shape:
            await self.store.drop_shape(shape)
            self.metrics.shapes_dropped.labels(resource=shape.resource, reason=reason).inc()
        self.metrics.forget_shape(resource=shape.resource, shape=shape.id)

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
            if shape.rv is not None:  # (a shape not listed yet holds nothing)
                self.metrics.shape_objects.labels(resource=shape.resource, shape=shape.id).set(
                    counts.get(shape.id, 0)
                )
            self.metrics.shape_log_bytes.labels(resource=shape.resource, shape=shape.id).set(
                shape.log_bytes
            )
        await self.store.save_usage()
        db, wal = self.store.size()
        self.metrics.db_size.set(db)
        self.metrics.db_wal_size.set(wal)


__all__ = ["SyncSettings", "Syncer", "UpstreamStatusError"]
