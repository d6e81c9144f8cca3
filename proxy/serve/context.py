"""What the handlers share: the cache, the syncer, the upstream, metrics and settings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

from proxy.cache.freshness import RecentWrites
from proxy.cache.store import Store
from proxy.metrics import Metrics
from proxy.serve.limiting import Admission, Limits
from proxy.serve.rendering import Frames
from proxy.upstream.connecting import Credentials, Upstream
from proxy.upstream.delegating import Delegation
from proxy.upstream.discovering import DiscoveryCache, DiscoveryCopies
from proxy.upstream.resilience import CircuitBreaker
from proxy.upstream.syncing import Syncer


@dataclass(frozen=True, kw_only=True, slots=True)
class ServeSettings:
    bookmark_interval: float = 60.0
    """Periodic BOOKMARKs on watches that allow them (the apiserver sends one about every
    minute) keep clients' RVs fresh, so their resumes land inside the log."""
    min_request_timeout: float = 1800.0
    """A watch without ``timeoutSeconds`` ends after this times [1, 2), as the apiserver's
    ``--min-request-timeout`` does, spreading reconnects out."""
    too_large_wait: float = 3.0
    """A read for an RV the cache has not reached waits this long before 504 (the apiserver
    waits ~3 s for its watch cache); a most-recent read that does not show a write made
    through warmwatch waits this long before it is passed through."""
    slow_write_timeout: float = 30.0
    """A watcher whose socket has not accepted a write for this long is closed; it resumes from
    its last RV out of the log. One stuck client must not pin memory or a task forever."""
    list_timeout: float = 60.0
    """A LIST from the cache is sent within this long, plus its size at ``list_min_rate``, or
    cut (``proxy.serve.listing``): the apiserver's ``--request-timeout``, which bounds its
    own LISTs. The initial state of a watch is bounded by the watch's own timeout, as the
    apiserver's is."""
    list_min_rate: float = 1024 * 1024
    """Bytes per second: a LIST that the client reads at least this fast is never cut. Ours:
    a million objects are ~1.4 GB, which the apiserver could not send in 60 s at all."""
    idle_check: float = 5.0
    """How often an idle watch checks that its client is still connected."""
    event_batch: int = 512
    """Log entries read per step when a watcher catches up."""
    event_batch_bytes: int = 128 * 1024
    """...and at most about this many bytes of them (read from the database: entries in the
    in-memory ring are shared, not copied). A watcher whose client stopped reading holds one
    such batch until it is cut: bounded per watcher whatever the objects' size."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Context:
    store: Store
    syncer: Syncer
    upstream: Upstream
    discovery: DiscoveryCache
    metrics: Metrics
    settings: ServeSettings
    credentials: Credentials
    """How passthrough authenticates upstream: as the sidecar, or with the client's own
    credentials (the authenticated modes)."""
    learn: bool
    breaker: CircuitBreaker
    """Open: the apiserver counts as unreachable, passthrough fails (or falls back) at once."""
    ready: Callable[[], tuple[bool, str]]
    """warmwatch's own readiness (every configured shape serveable)."""
    writes: RecentWrites
    """Writes passed through, for read your writes (``proxy.serve.read_your_writes``)."""
    discovery_copies: DiscoveryCopies | None = None
    """Discovery documents that may be answered without asking the apiserver."""
    delegation: Delegation | None = None
    """``--client-auth delegated``: reads served from the cache are authorized per client
    (``proxy.serve.authorizing``)."""
    admission: Admission = field(default_factory=lambda: Admission(Limits()))
    """What clients hold against the limits (``proxy.serve.limiting``)."""
    frames: Frames = field(default_factory=Frames)
    """Watch frames shared by the watchers of each shape (``proxy.serve.rendering``)."""


CONTEXT: web.AppKey[Context] = web.AppKey("context", Context)
"""The API listener's Context (``routing.api_app``)."""
