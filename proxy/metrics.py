"""Every Prometheus metric of warmwatch, in one place.

One :class:`Metrics` instance owns one ``CollectorRegistry``: the app creates one and serves
:meth:`Metrics.exposition` on ``/metrics``; tests create their own and read values with
:meth:`Metrics.value`, isolated from each other and from the process-global default registry
(which is never used, so importing this module registers nothing).

Naming: every metric is prefixed ``warmwatch_``; counters get ``_total`` from
prometheus_client; durations are in seconds and sizes in bytes, as Prometheus conventions
ask. ``resource`` is the collection's group, version and plural resource, as
``v1/configmaps`` or ``apps/v1/deployments`` (``GroupVersionResource``'s text); callers pass
it, this module does not parse it.

Every label value is taken from a bounded set, whatever a client sends (docs/design.md §8):
each labelled metric is a :class:`Bounded`, which maps every value through its label's
domain before it names a series. Series are never removed (a dropped shape's excepted), so
a value chosen by a client would grow ``/metrics`` without end: 5,000 LISTs of made-up
resources once made 122,121 series (13 MB), and a scrape then blocked the event loop for
1.9 s. The domains:

- ``resource``: a resource warmwatch holds (configured, or a shape of it was listed) or one
  the apiserver's discovery documents name (:class:`ResourceNames`); anything else is
  ``other``.
- ``shape``: the shape's row id (``shapes.id``), never its selectors, which may be hundreds
  of KiB. The shape's description is logged once when the shape is created or loaded.
  Shapes are bounded (``--max-shapes``) and :meth:`Metrics.forget_shape` removes a dropped
  shape's series.
- ``verb``: HTTP methods and warmwatch's own verbs (:data:`VERBS`); ``code``: a three-digit
  HTTP status or ``error``; every other label: a fixed set named with its metric. A value
  outside its set is ``other``.

This module imports nothing from the rest of ``proxy`` so that any layer may use it.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, TypeAlias

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

__all__ = ["OTHER", "VERBS", "Bounded", "BreakerStateValue", "Metrics", "ResourceNames"]

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


OTHER: Final = "other"
"""The value of a label whose value is outside the label's bounded set."""

ERROR: Final = "error"
"""The ``code`` of a request that got no answer."""

VERBS: Final = frozenset(
    {
        # HTTP methods (RFC 9110, and PATCH), as clients send them through
        *("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE"),
        # warmwatch's own requests to the apiserver (the ``verb`` of Upstream.request)
        *("LIST", "WATCH", "TOKENREVIEW", "SUBJECTACCESSREVIEW", "SELFSUBJECTREVIEW"),
    }
)
"""Values of the ``verb`` label (a client may send any token as its method)."""

UPSTREAM_PURPOSES: Final = frozenset({"reflector", "passthrough", "review", "discovery"})
"""``upstream.connecting.Purpose`` (repeated: this module imports nothing of ours)."""

REJECTED_LIMITS: Final = frozenset(
    {
        "connections",
        "watches",
        "client_watches",
        "requests",
        "client_requests",
        "list_streams",
        "token_reviews",
        *(f"upstream_{purpose}" for purpose in UPSTREAM_PURPOSES),
    }
)

SEEDING_RESULTS: Final = frozenset({"installed", "refused", "failed", "none"})
"""Values of ``seedings_total``'s ``result`` (``upstream.seeding.Result``)."""

LIST_SOURCES: Final = frozenset({"cache", "passthrough", "upstream-list", "upstream-watchlist"})
"""Sources of ``list_duration_seconds``: where a LIST was answered from, or a shape's fill."""

CLIENT_FAULTS: Final = frozenset(
    {"disconnected", "slow", "malformed", "header_timeout", "header_too_large", "unauthorized"}
)
"""Reasons of ``client_errors_total``."""

Domain: TypeAlias = frozenset[str] | Callable[[str], str]
"""A label's bounded set: a fixed set (any other value is :data:`OTHER`), or a function that
maps any value into a bounded set."""


def code_label(code: str) -> str:
    """An HTTP status code as three digits; ``error`` (no answer) or anything else: ``error``."""
    return code if len(code) == 3 and code.isascii() and code.isdigit() else ERROR


def shape_label(shape: str) -> str:
    """A shape's row id (decimal digits); anything else is :data:`OTHER`."""
    return shape if 0 < len(shape) <= 19 and shape.isascii() and shape.isdigit() else OTHER


class ResourceNames:
    """The values the ``resource`` label may take; any other resource is :data:`OTHER`.

    A resource is named when warmwatch holds it (:meth:`hold`: a configured shape, or a
    shape the apiserver listed — so it exists) or a discovery document of the apiserver that
    warmwatch stored or read names it (:meth:`discovered`). Both are bounded by what the
    cluster serves (and the flags), not by what clients ask: a client cannot make a name up.
    Held names stay named for the life of the process, so a shape's series keep their label
    (and :meth:`Metrics.forget_shape` finds them) after the shape is gone.
    """

    def __init__(self) -> None:
        self._held: set[str] = set()
        self._discovered: dict[str, frozenset[str]] = {}
        self._known: frozenset[str] = frozenset()

    def hold(self, resource: str) -> None:
        if resource not in self._held:
            self._held.add(resource)
            self._known = self._known | {resource}

    def discovered(self, *, source: str, resources: Iterable[str]) -> None:
        """The discovery document at path ``source`` names exactly ``resources`` now (what
        it named before and no longer does is forgotten)."""
        named = frozenset(resources)
        if self._discovered.get(source) == named:
            return
        self._discovered[source] = named
        self._known = frozenset(self._held).union(*self._discovered.values())

    def label(self, resource: str) -> str:
        return resource if resource in self._known else OTHER


class Bounded:
    """A labelled collector whose label values are mapped into their bounded sets.

    :meth:`labels` and :meth:`remove` take the labels by name, as prometheus_client does,
    and map each value through its :data:`Domain`; ``collector`` is the prometheus_client
    collector itself.
    """

    def __init__(self, collector: Any, domains: Mapping[str, Domain]) -> None:
        self.collector = collector
        self._domains = dict(domains)

    def labels(self, **values: str | int) -> Any:
        """The child of the bounded values (``inc``, ``set``, ``observe`` it)."""
        return self.collector.labels(**self._bound(values))

    def remove(self, **values: str | int) -> None:
        """Remove the series of the bounded values (a no-op when it was never recorded)."""
        bound = self._bound(values)
        self.collector.remove(*(bound[name] for name in self._domains))

    def _bound(self, values: Mapping[str, str | int]) -> dict[str, str]:
        """(A label the metric does not have is a KeyError; one missing, prometheus_client's
        ValueError.)"""
        bound: dict[str, str] = {}
        for name, value in values.items():
            domain, text = self._domains[name], str(value)
            if isinstance(domain, frozenset):
                bound[name] = text if text in domain else OTHER
            else:
                bound[name] = domain(text)
        return bound


def _bounded(
    kind: Callable[..., Any],
    name: str,
    documentation: str,
    domains: Mapping[str, Domain],
    **options: Any,
) -> Bounded:
    return Bounded(kind(name, documentation, tuple(domains), **options), domains)


class BreakerStateValue(enum.IntEnum):
    """Values of ``warmwatch_circuit_breaker_state``."""

    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class Metrics:
    """All metrics of the app, registered in a registry of their own.

    Use the attributes directly: a labelled one is a :class:`Bounded`
    (``metrics.events_in.labels(resource="v1/configmaps", type="ADDED").inc()``), the others
    plain prometheus_client collectors. :attr:`resources` decides which resources the
    ``resource`` label names.
    """

    content_type: Final = CONTENT_TYPE_LATEST
    """Content type of :meth:`exposition`."""

    def __init__(self) -> None:
        self.registry: Final = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.resources: Final = ResourceNames()
        resource = self.resources.label

        # -- cache content ------------------------------------------------------------
        self.shape_objects: Final = _bounded(
            Gauge,
            f"{PREFIX}shape_objects",
            "Objects currently cached for a shape.",
            {"resource": resource, "shape": shape_label},
            registry=r,
        )
        self.shape_rv: Final = _bounded(
            Gauge,
            f"{PREFIX}shape_resource_version",
            "resourceVersion the shape's cache has reached (NaN when not a well-formed integer).",
            {"resource": resource, "shape": shape_label},
            registry=r,
        )
        self.shape_log_bytes: Final = _bounded(
            Gauge,
            f"{PREFIX}shape_log_bytes",
            "Bytes of the shape's event log in the database (objects, new and old, and labels), "
            "bounded by --retention-bytes.",
            {"resource": resource, "shape": shape_label},
            registry=r,
        )
        self.events_trimmed: Final = _bounded(
            Counter,
            f"{PREFIX}events_trimmed",
            "Event-log entries dropped by retention, by the bound that cut deepest: count "
            "(--retention-events), age (--retention-seconds), bytes (--retention-bytes).",
            {"resource": resource, "reason": frozenset({"count", "age", "bytes"})},
            registry=r,
        )
        self.events_in: Final = _bounded(
            Counter,
            f"{PREFIX}events_in",
            "Watch events received from the apiserver and committed, by event type.",
            {"resource": resource, "type": frozenset({"ADDED", "MODIFIED", "DELETED"})},
            registry=r,
        )
        self.events_out: Final = _bounded(
            Counter,
            f"{PREFIX}events_out",
            "Watch events written to clients (a watch's initial ADDED events included).",
            {"resource": resource},
            registry=r,
        )

        # -- upstream -------------------------------------------------------------------
        self.upstream_requests: Final = _bounded(
            Counter,
            f"{PREFIX}upstream_requests",
            'Requests sent to the apiserver, by verb and HTTP code ("error" when no answer).',
            {"verb": VERBS, "code": code_label},
            registry=r,
        )
        self.upstream_connections: Final = _bounded(
            Gauge,
            f"{PREFIX}upstream_connections",
            "Upstream connections in use, by purpose (reflector, passthrough, review, "
            "discovery); each purpose has its own budget.",
            {"purpose": UPSTREAM_PURPOSES},
            registry=r,
        )
        self.upstream_busy: Final = _bounded(
            Counter,
            f"{PREFIX}upstream_busy",
            "Upstream requests refused because their purpose's connection budget was in use.",
            {"purpose": UPSTREAM_PURPOSES},
            registry=r,
        )
        self.upstream_relists: Final = _bounded(
            Counter,
            f"{PREFIX}upstream_relists",
            "Full upstream lists of a shape (initial fill and after 410 Expired).",
            {"resource": resource},
            registry=r,
        )
        self.watch_restarts: Final = _bounded(
            Counter,
            f"{PREFIX}upstream_watch_restarts",
            "Upstream watches re-established, by reason (ended, idle, error).",
            {"resource": resource, "reason": frozenset({"ended", "idle", "error"})},
            registry=r,
        )
        self.reflector_restarts: Final = _bounded(
            Counter,
            f"{PREFIX}reflector_restarts",
            "Reflectors restarted by their supervisor, by reason: failed (an unexpected "
            "error), refused / revoked (a configured shape starting over after its list was "
            "refused or its access revoked upstream).",
            {"resource": resource, "reason": frozenset({"failed", "refused", "revoked"})},
            registry=r,
        )
        self.shape_limit: Final = _bounded(
            Counter,
            f"{PREFIX}shape_limit",
            "Requests passed through instead of learning a shape, by reason: shapes "
            "(--max-shapes learned shapes exist already), key_bytes (the request's selectors "
            "are longer than a learned shape's key may be; not served from the cache at all).",
            {"reason": frozenset({"shapes", "key_bytes"})},
            registry=r,
        )
        self.shapes_dropped: Final = _bounded(
            Counter,
            f"{PREFIX}shapes_dropped",
            "Shapes dropped with their data, by reason: unused (a learned shape nobody asked "
            "for), refused (its first list was refused upstream), revoked (a filled shape "
            "became unreadable upstream: RBAC changed, CRD deleted), oversized (learned by an "
            "earlier build from selectors longer than a shape's key may be).",
            {
                "resource": resource,
                "reason": frozenset({"unused", "refused", "revoked", "oversized"}),
            },
            registry=r,
        )
        self.circuit_breaker_state: Final = _bounded(
            Gauge,
            f"{PREFIX}circuit_breaker_state",
            "Circuit breaker state per target: 0 closed, 1 half-open, 2 open.",
            {"target": frozenset({"apiserver"})},
            registry=r,
        )
        self.passthrough_requests: Final = _bounded(
            Counter,
            f"{PREFIX}passthrough_requests",
            'Client requests passed through to the apiserver, by verb and code ("error" when no answer).',
            {"verb": VERBS, "code": code_label},
            registry=r,
        )
        self.client_auth_reviews: Final = _bounded(
            Counter,
            f"{PREFIX}client_auth_reviews",
            "TokenReviews (kind=token) and SubjectAccessReviews (kind=access) sent for "
            "clients in --client-auth delegated (decisions reused from the cache are not).",
            {"kind": frozenset({"token", "access"})},
            registry=r,
        )

        self.discovery_answers: Final = _bounded(
            Counter,
            f"{PREFIX}discovery_answers",
            "Discovery requests by where the answer came from: copy (a copy the apiserver "
            "confirmed lately), apiserver (passed through), stored (the apiserver was "
            "unreachable).",
            {"source": frozenset({"copy", "apiserver", "stored"})},
            registry=r,
        )
        self.discovery_revalidations: Final = _bounded(
            Counter,
            f"{PREFIX}discovery_revalidations",
            "Background revalidations of discovery copies, by result: unchanged, changed, "
            "gone (the apiserver answered neither 200 nor 304), too large, error.",
            {"result": frozenset({"unchanged", "changed", "gone", "too large", "error"})},
            registry=r,
        )
        self.discovery_copies: Final = Gauge(
            f"{PREFIX}discovery_copies",
            "Discovery documents stored (at most --discovery-max-copies).",
            registry=r,
        )
        self.discovery_copy_bytes: Final = Gauge(
            f"{PREFIX}discovery_copy_bytes",
            "Bytes of the discovery documents stored (at most --discovery-max-bytes).",
            registry=r,
        )
        self.discovery_copies_dropped: Final = _bounded(
            Counter,
            f"{PREFIX}discovery_copies_dropped",
            "Discovery documents not kept to stay within the bounds, by reason: evicted (the "
            "least recently asked, to make room), no room (a new one, while every other was "
            "in use).",
            {"reason": frozenset({"evicted", "no room"})},
            registry=r,
        )

        # -- serving --------------------------------------------------------------------
        self.watchers: Final = _bounded(
            Gauge,
            f"{PREFIX}watchers",
            "Client watches currently open.",
            {"resource": resource},
            registry=r,
        )
        self.list_bytes: Final = _bounded(
            Counter,
            f"{PREFIX}list_bytes",
            "Bytes of LIST responses, by source: cache (answered from the cache) or passthrough "
            "(passed to the apiserver; bytes as it sent them, possibly compressed).",
            {"resource": resource, "source": frozenset({"cache", "passthrough"})},
            registry=r,
        )
        self.list_duration: Final = _bounded(
            Histogram,
            f"{PREFIX}list_duration_seconds",
            "Time to answer a LIST, by source: cache, passthrough, or upstream-list / "
            "upstream-watchlist (a shape's fill or relist).",
            {"resource": resource, "source": LIST_SOURCES},
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.client_errors: Final = _bounded(
            Counter,
            f"{PREFIX}client_errors",
            "Client connections and requests ended for the client's fault, by reason: "
            "disconnected (left mid-answer), slow (stopped reading), malformed (not HTTP "
            "aiohttp could parse), header_timeout, header_too_large, unauthorized (401: no "
            "token, or not the token file's, in token-file mode).",
            {"reason": CLIENT_FAULTS},
            registry=r,
        )
        self.rejected: Final = _bounded(
            Counter,
            f"{PREFIX}rejected",
            "Requests and connections refused over a limit (429, or closed at once), by limit: "
            "connections, watches, client_watches, requests, client_requests, list_streams, "
            "token_reviews, upstream_review, upstream_discovery (and upstream_reflector, "
            "upstream_passthrough, which the limits above keep from being reached).",
            {"limit": REJECTED_LIMITS},
            registry=r,
        )
        self.connections: Final = Gauge(
            f"{PREFIX}connections",
            "Client connections currently open on the API listener.",
            registry=r,
        )
        self.event_delivery_lag: Final = _bounded(
            Histogram,
            f"{PREFIX}event_delivery_lag_seconds",
            "Time from an event's commit to its write to a client.",
            {"resource": resource},
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

        # -- peer seeding -----------------------------------------------------------------
        self.seedings: Final = _bounded(
            Counter,
            f"{PREFIX}seedings",
            "Starts by how seeding from a peer ended: installed, refused (by every peer), "
            "failed, none (not asked: off, no peer, or a database already there).",
            {"result": SEEDING_RESULTS},
            registry=r,
        )
        self.seeding_bytes: Final = Counter(
            f"{PREFIX}seeding_bytes",
            "Bytes of peers' snapshots received.",
            registry=r,
        )

    # ---------------------------------------------------------------------- helpers

    def set_shape_resource_version(self, *, resource: str, shape: int, rv: str) -> None:
        """Record the shape's RV: its integer value when well-formed (KEP-5504), else NaN.

        Gauges are floats: integers above 2**53 lose precision here, which is acceptable for
        a dashboard but means this gauge must never be read back as an RV.
        """
        value = float(int(rv)) if _WELL_FORMED_RV.fullmatch(rv) else math.nan
        self.shape_rv.labels(resource=resource, shape=shape).set(value)

    def set_breaker_state(self, *, target: str, state: BreakerStateValue | int) -> None:
        self.circuit_breaker_state.labels(target=target).set(int(state))

    def forget_shape(self, *, resource: str, shape: int) -> None:
        """Drop the per-shape series of a shape (by its row id) that is no longer cached."""
        for gauge in (self.shape_objects, self.shape_rv, self.shape_log_bytes):
            gauge.remove(resource=resource, shape=shape)

    def exposition(self) -> bytes:
        """The text exposition for ``/metrics``; serve it with :attr:`content_type`."""
        return generate_latest(self.registry)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """The current value of one sample, e.g. ``value("warmwatch_events_out_total",
        {"resource": "configmaps"})``, or None when it has not been recorded (a reflector reads
        the objects its shape held before a relist; tests read any)."""
        result = self.registry.get_sample_value(name, labels or {})
        return None if result is None else float(result)
