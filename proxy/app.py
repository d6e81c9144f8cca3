"""Settings, wiring, task ownership and shutdown.

``run`` opens the cache, connects upstream, resumes every persisted and configured shape,
serves the API listener and the metrics/health listener, and on SIGTERM/SIGINT shuts down in
order: stop accepting, end open watches cleanly, stop the reflectors (the last committed batch
is already durable: every batch is its own transaction), close the database.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from aiohttp import web

from proxy.cache.freshness import RecentWrites
from proxy.cache.shapes import Encoding, ShapeKey
from proxy.cache.store import Store, StoreSettings
from proxy.kube.resources import ResourceFlag
from proxy.metrics import Metrics
from proxy.serve import connections, routing
from proxy.serve.authenticating import ClientAuth
from proxy.serve.context import Context, ServeSettings
from proxy.serve.limiting import Admission, Limits
from proxy.upstream.connecting import ConnectionSettings, connect
from proxy.upstream.passing import CachedDocument
from proxy.upstream.reflecting import ReflectorSettings
from proxy.upstream.resilience import CircuitBreaker, ListLimiter
from proxy.upstream.syncing import Syncer, SyncSettings

logger = logging.getLogger("warmwatch")


@dataclass(frozen=True, kw_only=True)
class Settings:
    kubeconfig: str | None = None
    context: str | None = None
    listen: tuple[str, int] = ("127.0.0.1", 8001)
    metrics_listen: tuple[str, int] = ("127.0.0.1", 9090)
    db: Path = Path("warmwatch.db")
    resources: tuple[ResourceFlag, ...] = ()
    client_auth: ClientAuth = field(default_factory=lambda: ClientAuth(mode="none"))
    store: StoreSettings | None = None
    sync: SyncSettings = field(default_factory=SyncSettings)
    reflector: ReflectorSettings = field(default_factory=ReflectorSettings)
    serve: ServeSettings = field(default_factory=ServeSettings)
    limits: Limits = field(default_factory=Limits)
    shutdown_timeout: float = 20.0
    """Less than a pod's default 30 s grace period, so we exit before the SIGKILL."""

    def store_settings(self) -> StoreSettings:
        """The store's settings, with a reader for each LIST stream and 4 for short reads
        (``Limits.max_list_streams``)."""
        store = self.store or StoreSettings(path=self.db)
        return dataclasses.replace(store, readers=self.limits.max_list_streams + 4)


class StoredDiscovery:
    """Discovery documents in the cache's SQLite file (passthrough's DiscoveryCache)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def get(self, key: str) -> CachedDocument | None:
        row = await self.store.get_document(key)
        if row is None:
            return None
        status, headers, body, etag = row
        return CachedDocument(
            status=status,
            headers=tuple(tuple(h) for h in orjson.loads(headers)),
            body=body,
            etag=etag or None,
        )

    async def put(self, key: str, doc: CachedDocument) -> None:
        await self.store.put_document(
            key,
            status=doc.status,
            headers=orjson.dumps([list(h) for h in doc.headers]),
            body=doc.body,
            etag=doc.etag or "",
        )


class App:
    """A running warmwatch; ``start`` then ``stop`` (tests drive it in-process too)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self._runners: list[web.AppRunner] = []
        self.store: Store | None = None
        self.syncer: Syncer | None = None
        self._integrity: asyncio.Task[bool] | None = None

    async def start(self) -> None:
        settings = self.settings
        if settings.client_auth.mode == "none":
            if settings.listen[0] not in ("127.0.0.1", "::1", "localhost"):
                raise ValueError("--client-auth none is only allowed on a loopback listener")
            logger.warning(
                "--client-auth none: every local caller acts with warmwatch's own "
                "identity (like kubectl proxy); for development and tests only"
            )
        self.store = store = await Store.open(settings.store_settings(), metrics=self.metrics)
        # O(size), so in the background: a warm start serves before it has read every page.
        self._integrity = asyncio.create_task(store.check_integrity(), name="integrity check")
        upstream = await connect(
            ConnectionSettings(kubeconfig=settings.kubeconfig, context=settings.context),
            metrics=self.metrics,
        )
        self.upstream = upstream
        breaker = CircuitBreaker(target="apiserver", metrics=self.metrics)
        self.syncer = syncer = Syncer(
            store=store,
            upstream=upstream,
            settings=settings.sync,
            reflector_settings=settings.reflector,
            limiter=ListLimiter(),
            breaker=breaker,
            metrics=self.metrics,
        )
        self.breaker = breaker
        await syncer.start(
            ShapeKey.of(
                flag.gvr,
                namespace=flag.namespace,
                encoding=Encoding.PROTOBUF if flag.protobuf else Encoding.JSON,
            )
            for flag in settings.resources
        )
        ctx = Context(
            store=store,
            syncer=syncer,
            upstream=upstream,
            discovery=StoredDiscovery(store),
            metrics=self.metrics,
            settings=settings.serve,
            credentials="sidecar" if settings.client_auth.mode == "none" else "client",
            learn=settings.sync.learn,
            breaker=breaker,
            ready=self.ready,
            writes=RecentWrites(),
            admission=Admission(settings.limits),
        )
        await self._serve(
            routing.api_app(ctx, auth=settings.client_auth),
            settings.listen,
        )
        await self._serve(
            routing.health_app(metrics=self.metrics, ready=self.ready),
            settings.metrics_listen,
        )
        logger.info(
            "serving on %s:%d (metrics on %s:%d), %d shapes",
            *settings.listen,
            *settings.metrics_listen,
            len(store.shapes),
        )

    async def _serve(self, app: web.Application, address: tuple[str, int]) -> None:
        runner, _ = await connections.serve(
            app,
            address=address,
            limits=self.settings.limits,
            metrics=self.metrics,
            shutdown_timeout=self.settings.shutdown_timeout / 2,
        )
        self._runners.append(runner)

    def ready(self) -> tuple[bool, str]:
        if self.syncer is None or self.store is None:
            return False, "starting"
        if not self.syncer.ready():
            return False, "configured shapes not serveable yet"
        if self.store.storage_error or self.store.integrity_error:
            return False, f"storage: {self.store.storage_error or self.store.integrity_error}"
        return True, f"ok (upstream circuit {self.breaker.state.value})"

    async def stop(self) -> None:
        if self.store is not None:
            for shape in self.store.shapes.values():
                shape.log.close()  # open watches end cleanly
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
        if self._integrity is not None:
            self._integrity.cancel()
            await asyncio.gather(self._integrity, return_exceptions=True)
        if self.syncer is not None:
            await self.syncer.stop()
        if self.store is not None:
            await self.store.close()
        if getattr(self, "upstream", None) is not None:
            await self.upstream.close()


async def run(settings: Settings) -> None:
    app = App(settings)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await app.start()
    await stopping.wait()
    logger.info("shutting down")
    await asyncio.wait_for(app.stop(), settings.shutdown_timeout)
