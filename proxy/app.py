"""Settings, wiring, task ownership and shutdown.

``run`` opens the cache, connects upstream, resumes every persisted and configured shape,
serves the API listener and the metrics/health listener, and on SIGTERM/SIGINT shuts down in
order: stop accepting, end open watches cleanly, stop the reflectors (the last committed batch
is already durable: every batch is its own transaction), close the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import ipaddress
import logging
import signal
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from aiohttp import web

from proxy.cache.freshness import RecentWrites
from proxy.cache.shapes import Encoding, ShapeKey
from proxy.cache.store import Store, StoreSettings
from proxy.kube.discovery import lists_resources, named_resources
from proxy.kube.resources import ResourceFlag
from proxy.metrics import Metrics, ResourceNames
from proxy.serve import connections, routing
from proxy.serve.authenticating import (
    DEFAULT_REJECT_PATHS,
    ClientAuth,
    Guard,
    RejectPaths,
    TokenFile,
)
from proxy.serve.context import Context, ServeSettings
from proxy.serve.limiting import Admission, Limits
from proxy.serve.securing import ServingCertificate, self_signed
from proxy.serve.seeding import SnapshotServer
from proxy.upstream.connecting import ConnectionBudget, ConnectionSettings, Upstream, connect
from proxy.upstream.delegating import Delegation, DelegationSettings
from proxy.upstream.discovering import (
    CachedDocument,
    DiscoveryCopies,
    DiscoverySettings,
    keep_confirmed,
    parse_discovery_key,
)
from proxy.upstream.errors import UpstreamAuthError, UpstreamError
from proxy.upstream.forwarding import PassthroughSettings
from proxy.upstream.reflecting import ReflectorSettings
from proxy.upstream.resilience import CircuitBreaker, ListLimiter
from proxy.upstream.reviewing import IdentityMismatch, check_same_identity
from proxy.upstream.seeding import SeedSettings, remember_cluster, seed
from proxy.upstream.syncing import Syncer, SyncSettings

logger = logging.getLogger("warmwatch")


@dataclass(frozen=True, kw_only=True)
class Settings:
    kubeconfig: str | None = None
    context: str | None = None
    listen: tuple[str, int] = ("127.0.0.1", 8001)
    metrics_listen: tuple[str, int] = ("127.0.0.1", 9090)
    seed_listen: tuple[str, int] | None = None
    """Serve the cache's snapshot to peers here (TLS, ``serve.seeding``). None: not served;
    a port of its own is opened only when asked for (a pod's other processes, tests)."""
    db: Path = Path("warmwatch.db")
    resources: tuple[ResourceFlag, ...] = ()
    client_auth: ClientAuth = field(default_factory=lambda: ClientAuth(mode="none"))
    delegation: DelegationSettings = field(default_factory=DelegationSettings)
    reject_paths: RejectPaths = field(
        default_factory=lambda: RejectPaths.parse(DEFAULT_REJECT_PATHS)
    )
    """Refused in ``--client-auth none`` (kubectl proxy's default, and port-forward)."""
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    """Serve the API listener over TLS; required beyond loopback."""
    cert_dir: Path | None = None
    """Without ``tls_cert_file``: serve the loopback listener over TLS with a self-signed
    pair kept in this directory (``securing.self_signed``), so that a Go controller sends
    its token (client-go sends none to an ``http://`` server)."""
    tls_reload_interval: float = 10.0
    """How often the serving certificate files are checked for a rotation."""
    store: StoreSettings | None = None
    sync: SyncSettings = field(default_factory=SyncSettings)
    reflector: ReflectorSettings = field(default_factory=ReflectorSettings)
    serve: ServeSettings = field(default_factory=ServeSettings)
    discovery: DiscoverySettings = field(default_factory=DiscoverySettings)
    limits: Limits = field(default_factory=Limits)
    identity_check_wait: float = 1.0
    """``token-file``: how long the start waits for the check that the file's token is
    warmwatch's own identity (two SelfSubjectReviews, milliseconds from a healthy apiserver).
    Past it the port opens and the check is made on use, as when the apiserver cannot be
    reached: a slow or blackholed apiserver (the 10 s connect timeout) must not hold back a
    warm start that only needs the cache."""
    seed: SeedSettings = field(default_factory=SeedSettings)
    """Peer seeding of a new database (``upstream.seeding``)."""
    shutdown_timeout: float = 20.0
    """Less than a pod's default 30 s grace period, so we exit before the SIGKILL."""

    def connection_budget(self) -> ConnectionBudget:
        """Upstream connections by purpose, from the limits that bound each: the learned and
        configured collections, and the passed-through watches and requests."""
        return ConnectionBudget.sized(
            shapes=self.sync.max_shapes + len(self.resources),
            watches=self.limits.max_watches,
            requests=self.limits.max_requests,
        )

    def store_settings(self) -> StoreSettings:
        """The store's settings, with a reader for each LIST stream and 4 for short reads
        (``Limits.max_list_streams``)."""
        store = self.store or StoreSettings(path=self.db)
        return dataclasses.replace(store, readers=self.limits.max_list_streams + 4)


class StartRefused(Exception):
    """The settings, or the identities they name, do not allow a start (a clear message,
    exit code 1)."""


def is_loopback_address(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listener(settings: Settings) -> None:
    """Beyond loopback only ``delegated`` with TLS (docs/design.md §6)."""
    mode = settings.client_auth.mode
    if (settings.tls_cert_file is None) != (settings.tls_key_file is None):
        raise StartRefused("--tls-cert-file and --tls-private-key-file go together")
    loopback = is_loopback_address(settings.listen[0])
    if settings.cert_dir is not None and (settings.tls_cert_file is not None or not loopback):
        raise StartRefused(
            "--cert-dir makes a self-signed certificate for a loopback listener; with "
            "--tls-cert-file, or beyond loopback, name the certificate to serve instead"
        )
    if loopback:
        return
    if mode != "delegated":
        raise StartRefused(
            f"--client-auth {mode} is only allowed on a loopback listener; listening on "
            f"{settings.listen[0]} requires --client-auth delegated and TLS"
        )
    if settings.tls_cert_file is None:
        raise StartRefused(
            f"listening on {settings.listen[0]} requires TLS (--tls-cert-file and "
            "--tls-private-key-file): clients send bearer tokens"
        )


class StoredDiscovery:
    """Discovery documents in the cache's SQLite file (passthrough's DiscoveryCache).

    Every document stored or read back passes here, so here the resources the apiserver's
    documents name become values of the ``resource`` metric label (``ResourceNames``)."""

    def __init__(self, store: Store, *, resources: ResourceNames) -> None:
        self.store = store
        self.resources = resources
        self._named: dict[str, int] = {}
        """Path -> hash of the body its names were last taken from (bounded: only paths the
        apiserver answered with a document naming resources)."""

    async def get(self, key: str) -> CachedDocument | None:
        row = await self.store.get_document(key)
        if row is None:
            return None
        status, headers, body, etag = row
        document = CachedDocument(
            status=status,
            headers=tuple(tuple(h) for h in orjson.loads(headers)),
            body=body,
            etag=etag or None,
        )
        self._name(key, document)
        return document

    def _name(self, key: str, document: CachedDocument) -> None:
        path = parse_discovery_key(key)[0].partition("?")[0]
        if not lists_resources(path) or self._named.get(path) == hash(document.body):
            return  # (an unchanged document is not parsed again: /apis is ~100s of KiB)
        named = named_resources(document.body)
        if named is not None:
            self._named[path] = hash(document.body)
            self.resources.discovered(source=path, resources=(str(gvr) for gvr in named))

    async def put(self, key: str, doc: CachedDocument, *, evict: Sequence[str] = ()) -> None:
        self._name(key, doc)
        await self.store.put_document(
            key,
            status=doc.status,
            headers=orjson.dumps([list(h) for h in doc.headers]),
            body=doc.body,
            etag=doc.etag or "",
            evict=evict,
        )

    async def drop(self, keys: Sequence[str]) -> None:
        await self.store.drop_documents(keys)


class App:
    """A running warmwatch; ``start`` then ``stop`` (tests drive it in-process too)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self._runners: list[web.AppRunner] = []
        self.store: Store | None = None
        self.syncer: Syncer | None = None
        self._integrity: asyncio.Task[bool] | None = None
        self._checkpoints: asyncio.Task[None] | None = None
        self._discovery: asyncio.Task[None] | None = None
        self._tls_reload: asyncio.Task[None] | None = None
        self._cluster: asyncio.Task[None] | None = None
        self.delegation: Delegation | None = None
        self.certificate: ServingCertificate | None = None
        self.serving = False
        """The API port is open. The health port opens first, and /readyz says "starting"
        until then: a probe (or a controller started on it) must not be told ready while
        its connections would still be refused."""

    async def start(self) -> None:
        settings = self.settings
        check_listener(settings)
        pair = (settings.tls_cert_file, settings.tls_key_file)
        try:
            if settings.cert_dir is not None:
                pair = await self_signed(settings.cert_dir)
            if pair[0] is not None and pair[1] is not None:
                self.certificate = ServingCertificate(cert_file=pair[0], key_file=pair[1])
        except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
            raise StartRefused(f"cannot load the serving certificate: {error}") from error
        if settings.client_auth.mode == "none":
            logger.warning(
                "--client-auth none: every local caller acts with warmwatch's own "
                "identity (like kubectl proxy); only for a loopback that only trusted "
                "clients share (a pod's own, without hostNetwork)"
            )
        # The health port first: /livez answers while the cache opens, /readyz says "starting".
        await self._serve(
            routing.health_app(metrics=self.metrics, ready=self.ready), settings.metrics_listen
        )
        try:
            upstream = await connect(
                ConnectionSettings(
                    kubeconfig=settings.kubeconfig,
                    context=settings.context,
                    budget=settings.connection_budget(),
                ),
                metrics=self.metrics,
            )
        except UpstreamAuthError as error:  # no kubeconfig, a broken one, a failing exec plugin
            raise StartRefused(str(error)) from error
        self.upstream = upstream
        store = await self._open_store(upstream)
        tokens = await self._client_tokens(upstream)
        breaker = CircuitBreaker(target="apiserver", metrics=self.metrics)
        if settings.client_auth.mode == "delegated":
            self.delegation = Delegation(
                upstream=upstream,
                settings=settings.delegation,
                metrics=self.metrics,
                breaker=breaker,
            )
        syncer = await self._start_syncing(store=store, upstream=upstream, breaker=breaker)
        discovery = StoredDiscovery(store, resources=self.metrics.resources)
        copies = await self._discovery_copies(discovery, upstream=upstream, breaker=breaker)
        ctx = self._context(
            store=store, syncer=syncer, upstream=upstream, discovery=discovery, copies=copies
        )
        guard = Guard(
            loopback_listener=is_loopback_address(settings.listen[0]),
            reject_paths=settings.reject_paths,
        )
        api = routing.api_app(ctx, auth=settings.client_auth, guard=guard, tokens=tokens)
        certificate = self.certificate
        await self._serve(
            api, settings.listen, ssl_context=certificate.context if certificate else None
        )
        self.serving = True
        await self._serve_snapshots(store=store, upstream=upstream, breaker=breaker)
        if certificate is not None:
            self._tls_reload = asyncio.create_task(
                self._reload_certificate(certificate), name="serving certificate reload"
            )
        logger.info(
            "serving on %s:%d (metrics on %s:%d), %d shapes",
            *settings.listen,
            *settings.metrics_listen,
            len(store.shapes),
        )

    async def _serve_snapshots(
        self, *, store: Store, upstream: Upstream, breaker: CircuitBreaker
    ) -> None:
        """``--seed-listen``: the seeding listener, over TLS with the self-signed pair of
        ``--cert-dir`` (else one made the same way in the database's directory), which
        nobody verifies by name: the seeding tokens are bound to it (``upstream.binding``).
        Opened after the API port: a peer can wait, the controller should not."""
        address = self.settings.seed_listen
        if address is None:
            return
        try:
            cert_file, key_file = await self_signed(
                self.settings.cert_dir or self.settings.store_settings().path.parent
            )
            certificate = ServingCertificate(cert_file=cert_file, key_file=key_file)
            der = ssl.PEM_cert_to_DER_cert(cert_file.read_text())
        except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
            raise StartRefused(f"cannot load the seeding certificate: {error}") from error
        snapshots = SnapshotServer(settings=self.settings.seed, certificate=der)
        snapshots.bind(store=store, upstream=upstream, breaker=breaker)
        await self._serve(routing.seed_app(snapshots), address, ssl_context=certificate.context)

    async def _open_store(self, upstream: Upstream) -> Store:
        """The cache: seeded from a peer when new (``upstream.seeding``), then opened; its
        integrity check, checkpoints and cluster identity in the background."""
        store_settings = self.settings.store_settings()
        await seed(
            self.settings.seed,
            upstream=upstream,
            database=store_settings.path,
            metrics=self.metrics,
        )
        self.store = store = await Store.open(store_settings, metrics=self.metrics)
        # O(size), so in the background: a warm start serves before it has read every page.
        self._integrity = asyncio.create_task(store.check_integrity(), name="integrity check")
        self._checkpoints = asyncio.create_task(store.keep_checkpointed(), name="wal checkpoints")
        self._cluster = asyncio.create_task(
            remember_cluster(store, upstream=upstream), name="cluster identity"
        )
        return store

    def _context(
        self,
        *,
        store: Store,
        syncer: Syncer,
        upstream: Upstream,
        discovery: StoredDiscovery,
        copies: DiscoveryCopies,
    ) -> Context:
        """What the API's handlers share."""
        settings = self.settings
        return Context(
            store=store,
            syncer=syncer,
            upstream=upstream,
            discovery=discovery,
            discovery_copies=copies,
            metrics=self.metrics,
            settings=settings.serve,
            credentials="sidecar" if settings.client_auth.mode == "none" else "client",
            learn=settings.sync.learn,
            breaker=syncer.breaker,
            ready=self.ready,
            writes=RecentWrites(),
            delegation=self.delegation,
            admission=Admission(settings.limits),
        )

    async def _start_syncing(
        self, *, store: Store, upstream: Upstream, breaker: CircuitBreaker
    ) -> Syncer:
        """The syncer, started with the configured collections (``--resource``)."""
        settings = self.settings
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
        return syncer

    async def _discovery_copies(
        self, discovery: StoredDiscovery, *, upstream: Upstream, breaker: CircuitBreaker
    ) -> DiscoveryCopies:
        """The account of the stored discovery documents, brought within its bounds, and
        (not delegated) the task that keeps them confirmed."""
        settings = self.settings
        delegated = settings.client_auth.mode == "delegated"
        copies = DiscoveryCopies(
            # Delegated: discovery goes to the apiserver with each client's own credentials,
            # which decides who may read it; a copy would answer any caller. Copies are
            # only stored (within the same bounds) for an offline start.
            settings=dataclasses.replace(settings.discovery, max_age=0)
            if delegated
            else settings.discovery,
            metrics=self.metrics,
        )
        await discovery.drop(copies.remember(await discovery.store.document_sizes()))
        if not delegated:
            self._discovery = asyncio.create_task(
                keep_confirmed(
                    copies,
                    upstream=upstream,
                    cache=discovery,
                    breaker=breaker,
                    settings=PassthroughSettings(),
                ),
                name="discovery copies",
            )
        return copies

    async def _client_tokens(self, upstream: Upstream) -> TokenFile | None:
        """``token-file``: the file's token must be warmwatch's own identity — checked now
        (a different one refuses the start; an apiserver that cannot be asked, or does not
        answer within ``identity_check_wait``, only delays the check) and after each
        rotation (``TokenFile``)."""
        path = self.settings.client_auth.token_file
        if path is None:
            return None

        async def verify(token: str) -> None:
            await check_same_identity(upstream, token)

        tokens = TokenFile(path, verify=verify)
        try:
            async with asyncio.timeout(self.settings.identity_check_wait):
                await tokens.check()
        except IdentityMismatch as error:
            raise StartRefused(f"--client-auth token-file:{path}: {error}") from error
        except (UpstreamError, TimeoutError) as error:
            logger.warning(
                "cannot check the identity of %s yet (%s); checked again on use",
                path,
                str(error) or f"no answer within {self.settings.identity_check_wait:g} s",
            )
        return tokens

    async def _reload_certificate(self, certificate: ServingCertificate) -> None:
        while True:
            await asyncio.sleep(self.settings.tls_reload_interval)
            certificate.reload_if_changed()

    async def _serve(
        self,
        app: web.Application,
        address: tuple[str, int],
        *,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        runner, _ = await connections.serve(
            app,
            address=address,
            limits=self.settings.limits,
            metrics=self.metrics,
            shutdown_timeout=self.settings.shutdown_timeout / 2,
            ssl_context=ssl_context,
        )
        self._runners.append(runner)

    def ready(self) -> tuple[bool, str]:
        if not self.serving or self.syncer is None or self.store is None:
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
        for task in (
            self._integrity,
            self._checkpoints,
            self._tls_reload,
            self._discovery,
            self._cluster,
        ):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self.delegation is not None:
            await self.delegation.close()
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
    try:
        await app.start()
    except BaseException:
        with contextlib.suppress(Exception):
            await app.stop()
        raise
    # Everything imported and wired so far lives as long as the process: ~40,000 objects
    # that each full collection of the cyclic garbage collector would traverse again, a
    # 30-40 ms pause of the event loop in which no watcher is served. Frozen, they are out
    # of its sight; it only looks at what is allocated from here on. (In the process's
    # entry, not in App.start: tests start many Apps in one process.)
    gc.freeze()
    await stopping.wait()
    logger.info("shutting down")
    await asyncio.wait_for(app.stop(), settings.shutdown_timeout)
