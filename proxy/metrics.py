"""Every Prometheus metric of warmwatch, in one place.

One :class:`Metrics` instance owns one ``CollectorRegistry``: the app creates one and serves
:meth:`Metrics.exposition` on ``/metrics``; tests create their own and read values with
:meth:`Metrics.value`, isolated from each other and from the process-global default registry
(which is never used, so importing this module registers nothing).

Naming: every metric is prefixed ``warmwatch_``; counters get ``_total`` from
prometheus_client; durations are in seconds and sizes in bytes, as Prometheus conventions
ask. ``resource`` is the plural resource with its group, as ``configmaps`` or
``deployments.apps`` (``GroupResource.String()``); callers pass it, this module does not
parse it. ``shape`` identifies one shape of that resource (namespace and selectors) in a
short human-readable form chosen by the cache; shapes are bounded (unused ones are dropped),
and :meth:`Metrics.forget_shape` removes their series when they are.

This module imports nothing from the rest of ``proxy`` so that any layer may use it.
"""

from __future__ import annotations

import enum
import math
import re
from typing import Final

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

__all__ = ["BreakerStateValue", "Metrics"]

PREFIX: Final = "warmwatch_"

#: Latencies from ~1 ms (a small list from SQLite) to minutes (a cold upstream relist).
_DURATION_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    math.inf,
)

#: Event delivery is expected in the sub-millisecond to second range; a slow consumer is
#: closed long before minutes pass, so the top buckets only catch pathologies.
_LAG_BUCKETS: Final = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    math.inf,
)

#: Commits batch hundreds to thousands of rows; anything above a second is a stall.
_COMMIT_BUCKETS: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    math.inf,
)

# KEP-5504 well-formed resourceVersion: digits without a leading zero. ("0" is the special
# "any" value, never an RV an object or list carries.) Repeated here rather than imported
# from proxy.kube so that this module stays dependency-free.
_WELL_FORMED_RV: Final = re.compile(r"[1-9][0-9]*")


class BreakerStateValue(enum.IntEnum):
    """Values of ``warmwatch_circuit_breaker_state``."""

    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class Metrics:
    """All metrics of the app, registered in a registry of their own.

    The attributes are plain prometheus_client collectors; use them directly
    (``metrics.events_in.labels(resource="configmaps", type="ADDED").inc()``).
    """

    content_type: Final = CONTENT_TYPE_LATEST
    """Content type of :meth:`exposition`."""

    def __init__(self) -> None:
        self.registry: Final = CollectorRegistry(auto_describe=True)
        r = self.registry

        # -- cache content ------------------------------------------------------------
        self.shape_objects: Final = Gauge(
            f"{PREFIX}shape_objects",
            "Objects currently cached for a shape.",
            ("resource", "shape"),
            registry=r,
        )
        self.shape_rv: Final = Gauge(
            f"{PREFIX}shape_resource_version",
            "resourceVersion the shape's cache has reached (NaN when not a well-formed integer).",
            ("resource", "shape"),
            registry=r,
        )
        self.shape_log_bytes: Final = Gauge(
            f"{PREFIX}shape_log_bytes",
            "Bytes of the shape's event log in the database (objects, new and old, and labels), "
            "bounded by --retention-bytes.",
            ("resource", "shape"),
            registry=r,
        )
        self.events_trimmed: Final = Counter(
            f"{PREFIX}events_trimmed",
            "Event-log entries dropped by retention, by the bound that cut deepest: count "
            "(--retention-events), age (--retention-seconds), bytes (--retention-bytes).",
            ("resource", "reason"),
            registry=r,
        )
        self.events_in: Final = Counter(
            f"{PREFIX}events_in",
            "Watch events received from the apiserver and committed, by event type.",
            ("resource", "type"),
            registry=r,
        )
        self.events_out: Final = Counter(
            f"{PREFIX}events_out",
            "Watch events written to clients (a watch's initial ADDED events included).",
            ("resource",),
            registry=r,
        )

        # -- upstream -------------------------------------------------------------------
        self.upstream_requests: Final = Counter(
            f"{PREFIX}upstream_requests",
            'Requests sent to the apiserver, by verb and HTTP code ("error" when no answer).',
            ("verb", "code"),
            registry=r,
        )
        self.upstream_relists: Final = Counter(
            f"{PREFIX}upstream_relists",
            "Full upstream lists of a shape (initial fill and after 410 Expired).",
            ("resource",),
            registry=r,
        )
        self.watch_restarts: Final = Counter(
            f"{PREFIX}upstream_watch_restarts",
            "Upstream watches re-established, by reason (ended, idle, error).",
            ("resource", "reason"),
            registry=r,
        )
        self.reflector_restarts: Final = Counter(
            f"{PREFIX}reflector_restarts",
            "Reflectors restarted by their supervisor, by reason: failed (an unexpected "
            "error), refused / revoked (a configured shape starting over after its list was "
            "refused or its access revoked upstream).",
            ("resource", "reason"),
            registry=r,
        )
        self.shape_limit: Final = Counter(
            f"{PREFIX}shape_limit",
            "Requests passed through instead of learning a shape, by reason: shapes "
            "(--max-shapes learned shapes exist already), key_bytes (the request's selectors "
            "are longer than a learned shape's key may be; not served from the cache at all).",
            ("reason",),
            registry=r,
        )
        self.shapes_dropped: Final = Counter(
            f"{PREFIX}shapes_dropped",
            "Shapes dropped with their data, by reason: unused (a learned shape nobody asked "
            "for), refused (its first list was refused upstream), revoked (a filled shape "
            "became unreadable upstream: RBAC changed, CRD deleted), oversized (learned by an "
            "earlier build from selectors longer than a shape's key may be).",
            ("resource", "reason"),
            registry=r,
        )
        self.circuit_breaker_state: Final = Gauge(
            f"{PREFIX}circuit_breaker_state",
            "Circuit breaker state per target: 0 closed, 1 half-open, 2 open.",
            ("target",),
            registry=r,
        )
        self.passthrough_requests: Final = Counter(
            f"{PREFIX}passthrough_requests",
            'Client requests passed through to the apiserver, by verb and code ("error" when no answer).',
            ("verb", "code"),
            registry=r,
        )
        self.client_auth_reviews: Final = Counter(
            f"{PREFIX}client_auth_reviews",
            "TokenReviews (kind=token) and SubjectAccessReviews (kind=access) sent for "
            "clients in --client-auth delegated (decisions reused from the cache are not).",
            ("kind",),
            registry=r,
        )

        self.discovery_answers: Final = Counter(
            f"{PREFIX}discovery_answers",
            "Discovery requests by where the answer came from: copy (a copy the apiserver "
            "confirmed lately), apiserver (passed through), stored (the apiserver was "
            "unreachable).",
            ("source",),
            registry=r,
        )
        self.discovery_revalidations: Final = Counter(
            f"{PREFIX}discovery_revalidations",
            "Background revalidations of discovery copies, by result: unchanged, changed, "
            "gone (the apiserver answered neither 200 nor 304), too large, error.",
            ("result",),
            registry=r,
        )

        # -- serving --------------------------------------------------------------------
        self.watchers: Final = Gauge(
            f"{PREFIX}watchers",
            "Client watches currently open.",
            ("resource",),
            registry=r,
        )
        self.list_bytes: Final = Counter(
            f"{PREFIX}list_bytes",
            "Bytes of LIST responses, by source: cache (answered from the cache) or passthrough "
            "(passed to the apiserver; bytes as it sent them, possibly compressed).",
            ("resource", "source"),
            registry=r,
        )
        self.list_duration: Final = Histogram(
            f"{PREFIX}list_duration_seconds",
            "Time to answer a LIST, by source: cache, passthrough, or upstream-list / "
            "upstream-watchlist (a shape's fill or relist).",
            ("resource", "source"),
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.client_errors: Final = Counter(
            f"{PREFIX}client_errors",
            "Client connections and requests ended for the client's fault, by reason: "
            "disconnected (left mid-answer), slow (stopped reading), malformed (not HTTP "
            "aiohttp could parse), header_timeout, header_too_large.",
            ("reason",),
            registry=r,
        )
        self.rejected: Final = Counter(
            f"{PREFIX}rejected",
            "Requests and connections refused over a limit (429, or closed at once), by limit: "
            "connections, watches, client_watches, list_streams.",
            ("limit",),
            registry=r,
        )
        self.connections: Final = Gauge(
            f"{PREFIX}connections",
            "Client connections currently open on the API listener.",
            registry=r,
        )
        self.event_delivery_lag: Final = Histogram(
            f"{PREFIX}event_delivery_lag_seconds",
            "Time from an event's commit to its write to a client.",
            ("resource",),
            buckets=_LAG_BUCKETS,
            registry=r,
        )

        # -- storage --------------------------------------------------------------------
        self.commit_duration: Final = Histogram(
            f"{PREFIX}commit_duration_seconds",
            "Duration of one cache write transaction.",
            buckets=_COMMIT_BUCKETS,
            registry=r,
        )
        self.db_size: Final = Gauge(
            f"{PREFIX}db_size_bytes",
            "Size of the SQLite database file.",
            registry=r,
        )
        self.db_wal_size: Final = Gauge(
            f"{PREFIX}db_wal_size_bytes",
            "Size of the SQLite write-ahead log.",
            registry=r,
        )
        self.storage_errors: Final = Counter(
            f"{PREFIX}storage_errors",
            "Failed cache storage operations.",
            registry=r,
        )

    # ---------------------------------------------------------------------- helpers

    def set_shape_resource_version(self, *, resource: str, shape: str, rv: str) -> None:
        """Record the shape's RV: its integer value when well-formed (KEP-5504), else NaN.

        Gauges are floats: integers above 2**53 lose precision here, which is acceptable for
        a dashboard but means this gauge must never be read back as an RV.
        """
        value = float(int(rv)) if _WELL_FORMED_RV.fullmatch(rv) else math.nan
        self.shape_rv.labels(resource=resource, shape=shape).set(value)

    def set_breaker_state(self, *, target: str, state: BreakerStateValue | int) -> None:
        self.circuit_breaker_state.labels(target=target).set(int(state))

    def forget_shape(self, *, resource: str, shape: str) -> None:
        """Drop the per-shape series of a shape that is no longer cached."""
        for gauge in (self.shape_objects, self.shape_rv, self.shape_log_bytes):
            gauge.remove(resource, shape)  # a no-op for series never recorded

    def exposition(self) -> bytes:
        """The text exposition for ``/metrics``; serve it with :attr:`content_type`."""
        return generate_latest(self.registry)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """The current value of one sample, e.g. ``value("warmwatch_events_out_total",
        {"resource": "configmaps"})``, or None when it has not been recorded (for tests and
        the readiness report)."""
        result = self.registry.get_sample_value(name, labels or {})
        return None if result is None else float(result)
