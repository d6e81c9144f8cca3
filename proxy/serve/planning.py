"""A cached read decided: from a collection GET's attributes and the collections warmwatch
holds, what to do and why (a :data:`Plan`). Pure: no I/O, no awaits, nothing but its
arguments, so each rule of the README's "How requests are served" is a unit test without
sockets. ``executing`` (a LIST or a WATCH) and ``offline`` (a GET while the apiserver is
unreachable) carry plans out.

Order, as the apiserver's: find the resource (404), negotiate the representation (406),
decode and validate the query (400/422 Status), then choose. warmwatch answers a bad query
itself only when the apiserver would reach that check too: the resource is one a shape has
listed, and the Accept header is one the cache serves; otherwise (an unknown resource, YAML,
a Table, an Accept nobody serves) the apiserver answers, in its own order.

A query whose selectors are longer than a learned shape's key may be
(``SyncSettings.max_key_bytes``) is passed through first, before anything parses them (nor
is it authorized by ``executing`` first): no real controller's selectors come near it, and
parsing a 683 KiB label selector took 0.4 s of the event loop, peaked at 23 MB and kept 6 MB
for as long as its request was in flight.

The cache answers when the representation is one it can produce (JSON or protobuf, full
objects or metadata only: ``negotiating``), the semantics allow it (not ``Exact``, not a
``continue`` page) and a shape serves the request — an existing one, or one learned now
(:class:`Fill`). A protobuf client that accepts JSON is served from a warm JSON shape while
its protobuf one is not (not filled, or not reaching back to a watch's resourceVersion); the
protobuf shape is learned behind it. What a plan leaves to its execution: a fill that fails
or is refused, a most-recent read that does not catch up with the writes made through
warmwatch (``read_your_writes``), a not-older-than resourceVersion the cache does not reach
in time — each is passed through then.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Protocol, TypeAlias

from proxy.cache.filtering import Filter
from proxy.cache.shapes import Encoding, Request, Shape, ShapeKey
from proxy.kube.gocompat import parse_query
from proxy.kube.options import (
    ListOptions,
    ListSemanticsKind,
    WatchStart,
    WatchStartKind,
    list_semantics,
    selector_bytes,
    watch_start,
)
from proxy.kube.resources import GroupVersionResource, RequestPath
from proxy.kube.selectors import FieldSelector, LabelSelector
from proxy.kube.status import StatusError
from proxy.kube.versions import compare
from proxy.serve.negotiating import Negotiated, Representation, negotiate
from proxy.serve.rendering import Renderer


class Collections(Protocol):
    """The collections warmwatch holds, as a plan reads them (``upstream.syncing.Syncer``)."""

    def find(self, request: Request, *, namespaced: bool | None) -> Shape | None:
        """The shape that serves ``request``: equal to it, or broader."""

    def holds(self, gvr: GroupVersionResource) -> bool:
        """Some shape of ``gvr`` has been listed (the apiserver serves the resource)."""

    def has_protobuf(self, gvr: GroupVersionResource) -> bool:
        """``gvr`` has a protobuf form."""


class Why(enum.StrEnum):
    """Why a plan is what it is."""

    SELECTORS_TOO_LONG = "its selectors are longer than a shape's key may be"
    APISERVER_VALIDATES = "a bad query the apiserver answers in its own order"
    BAD_QUERY = "a bad query of a listed collection: the apiserver's Status"
    REPRESENTATION = "a representation the cache does not produce (Table, YAML, CBOR, ...)"
    EXACT = "resourceVersionMatch=Exact"
    CONTINUE = "a continue page"
    NOT_LEARNING = "no collection serves it, and learning is off"
    EQUAL = "the collection that equals it"
    BROADER = "a broader collection, filtered locally"
    JSON_FOR_PROTOBUF = "a warm JSON collection, while the protobuf one is not"
    NEW = "no collection serves it: its own is learned and filled"
    FILLING = "its collection is being filled"


@dataclass(frozen=True, kw_only=True, slots=True)
class ReadAttributes:
    """What a collection GET asks, as a plan reads it."""

    path: RequestPath
    raw_query: str
    accept: str | None
    query: list[tuple[str, str]]
    """The query as the apiserver decodes it (Go's ``URL.Query()``), not as aiohttp does:
    a parameter with a bad escape is dropped rather than kept verbatim."""

    @classmethod
    def of(cls, path: RequestPath, *, raw_query: str, accept: str | None) -> ReadAttributes:
        return cls(path=path, raw_query=raw_query, accept=accept, query=parse_query(raw_query))

    def too_long(self, max_key_bytes: int) -> bool:
        """Its selectors are longer than a shape's key may be: passed through unparsed."""
        return selector_bytes(self.query) > max_key_bytes


@dataclass(frozen=True, kw_only=True, slots=True)
class PassThrough:
    why: Why


@dataclass(frozen=True, kw_only=True, slots=True)
class Reject:
    """Answer the Status the apiserver would."""

    error: StatusError
    why: Why = Why.BAD_QUERY


@dataclass(frozen=True, kw_only=True, slots=True)
class Serve:
    """Answer from ``shape``: its objects through ``view``, written by ``renderer``."""

    shape: Shape
    namespace: str | None
    """The request's namespace (None: all of them)."""
    view: Filter
    renderer: Renderer
    options: ListOptions
    start: WatchStart | None
    """A WATCH from here; None: a LIST."""
    not_older_than: str | None
    """A LIST not older than this resourceVersion (waited for, within ``too_large_wait``)."""
    most_recent: bool
    """Serve only once the cache shows the writes made through warmwatch."""
    why: Why
    learn_behind: ShapeKey | None = None
    """Learn this shape (the client's protobuf one) without waiting for it, once the answer's
    list or initial state is sent (``executing``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class _Decided:
    """Everything of a read but the shape that serves it."""

    path: RequestPath
    wanted: Request
    negotiated: Negotiated
    options: ListOptions
    start: WatchStart | None
    not_older_than: str | None
    most_recent: bool
    protobuf_ok: bool

    def serve(self, shape: Shape, *, why: Why, learn_behind: ShapeKey | None = None) -> Serve:
        view = Filter()
        if self.wanted.needs_filter(shape.key):
            view = Filter(
                namespace=self.path.namespace,
                labels=self.options.label_selector,
                fields=self.options.field_selector,
            )
        return Serve(
            shape=shape,
            namespace=self.path.namespace,
            view=view,
            renderer=renderer(shape, self.negotiated, untyped_list_items=self.protobuf_ok),
            options=self.options,
            start=self.start,
            not_older_than=self.not_older_than,
            most_recent=self.most_recent,
            why=why,
            learn_behind=learn_behind,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Fill:
    """Wait for the fill of ``shape`` (None: learn ``learn`` first), then serve from it
    (:meth:`then`); passed through when it fails, stalls or is refused."""

    shape: Shape | None
    learn: ShapeKey
    why: Why
    decided: _Decided

    def then(self, shape: Shape) -> Serve:
        """The plan once ``shape`` is filled."""
        return self.decided.serve(shape, why=self.why)


Plan: TypeAlias = PassThrough | Reject | Serve | Fill


def plan_read(read: ReadAttributes, held: Collections, *, learn: bool, max_key_bytes: int) -> Plan:
    """What to do with a LIST or WATCH of a collection (see the module docstring)."""
    if read.too_long(max_key_bytes):
        return PassThrough(why=Why.SELECTORS_TOO_LONG)
    gvr = read.path.gvr
    protobuf_ok = held.has_protobuf(gvr)
    try:
        options = ListOptions.parse(read.query, watch_path=read.path.is_watch_path)
    except StatusError as invalid:
        if invalid.code < 500 and held.holds(gvr) and _servable(read.accept, protobuf_ok):
            return Reject(error=invalid)
        # The apiserver finds the resource (404) and negotiates (406) before it decodes the
        # query, and a watch's unparsable resourceVersion is its InternalError: its answer.
        return PassThrough(why=Why.APISERVER_VALIDATES)
    negotiated = negotiate(read.accept, single=options.is_watch, protobuf_ok=protobuf_ok)
    if negotiated.representation is Representation.PASS_THROUGH:
        return PassThrough(why=Why.REPRESENTATION)
    decided = _semantics(read.path, options, negotiated, protobuf_ok=protobuf_ok)
    if isinstance(decided, PassThrough):
        return decided
    return _choose(read.accept, decided, held, learn=learn)


def _semantics(
    path: RequestPath, options: ListOptions, negotiated: Negotiated, *, protobuf_ok: bool
) -> _Decided | PassThrough:
    start = watch_start(options) if options.is_watch else None
    not_older_than: str | None = None
    if start is None:
        semantics = list_semantics(options)
        if semantics.kind is ListSemanticsKind.EXACT:
            return PassThrough(why=Why.EXACT)
        if semantics.kind is ListSemanticsKind.CONTINUE:
            return PassThrough(why=Why.CONTINUE)
        if semantics.kind is ListSemanticsKind.NOT_OLDER_THAN:
            not_older_than = semantics.resource_version
        most_recent = semantics.kind is ListSemanticsKind.MOST_RECENT
    else:
        most_recent = start.freshness is ListSemanticsKind.MOST_RECENT
    wanted = Request(
        gvr=path.gvr,
        namespace=path.namespace,
        label_selector=options.label_selector,
        field_selector=options.field_selector,
        encoding=negotiated.encoding,
    )
    return _Decided(
        path=path,
        wanted=wanted,
        negotiated=negotiated,
        options=options,
        start=start,
        not_older_than=not_older_than,
        most_recent=most_recent,
        protobuf_ok=protobuf_ok,
    )


def _choose(accept: str | None, decided: _Decided, held: Collections, *, learn: bool) -> Plan:
    """The shape that serves ``decided``: found, its JSON twin for a protobuf client, or
    learned."""
    namespaced = True if decided.path.namespace else None
    shape = held.find(decided.wanted, namespaced=namespaced)
    start = decided.start
    if decided.negotiated.encoding is Encoding.PROTOBUF and not _serves(shape, start):
        # The client's first choice is not warm (a first start; the apiserver slow or down)
        # or not learned: a warm JSON collection serves a client that accepts JSON too, and
        # the protobuf one fills behind it for the client's later requests.
        as_json = negotiate(accept, single=decided.options.is_watch, protobuf_ok=False)
        if as_json.representation is not Representation.PASS_THROUGH:
            json_wanted = dataclasses.replace(decided.wanted, encoding=Encoding.JSON)
            other = held.find(json_wanted, namespaced=namespaced)
            if _serves(other, start) or (shape is None and not learn and other is not None):
                behind = decided.wanted.exact_key if shape is None and learn else None
                decided = dataclasses.replace(decided, wanted=json_wanted, negotiated=as_json)
                assert other is not None
                if other.rv is not None:
                    return decided.serve(other, why=Why.JSON_FOR_PROTOBUF, learn_behind=behind)
                shape = other
    if shape is None and not learn:
        return PassThrough(why=Why.NOT_LEARNING)
    if shape is None or shape.rv is None:
        why = Why.NEW if shape is None else Why.FILLING
        return Fill(shape=shape, learn=decided.wanted.exact_key, why=why, decided=decided)
    filtered = decided.wanted.needs_filter(shape.key)
    return decided.serve(shape, why=Why.BROADER if filtered else Why.EQUAL)


def _serves(shape: Shape | None, start: WatchStart | None) -> bool:
    """``shape`` is filled and, for a watch from a resourceVersion, its log reaches back to it
    (a collection filled later than the client's RV would answer 410 Expired)."""
    if shape is None or shape.rv is None:
        return False
    if start is None or start.kind is not WatchStartKind.FROM_RESOURCE_VERSION:
        return True
    assert start.resource_version is not None
    since = shape.log_start_rv
    order = compare(since, start.resource_version) if since is not None else None
    return order is None or order <= 0


def _servable(accept: str | None, protobuf_ok: bool) -> bool:
    """The cache serves ``accept`` for a list or a watch (which one, the query would say):
    then the apiserver's own negotiation accepts it too."""
    return any(
        negotiate(accept, single=single, protobuf_ok=protobuf_ok).representation
        is not Representation.PASS_THROUGH
        for single in (False, True)
    )


def renderer(shape: Shape, negotiated: Negotiated, *, untyped_list_items: bool) -> Renderer:
    """How ``shape``'s objects are written in the ``negotiated`` representation."""
    return Renderer(
        encoding=shape.key.encoding,
        metadata_only=negotiated.representation is Representation.METADATA,
        kind=shape.kind,
        api_version=shape.api_version,
        untyped_list_items=untyped_list_items,
    )


# ------------------------------------------------------------------------- one object


@dataclass(frozen=True, kw_only=True, slots=True)
class ServeObject:
    """Answer a GET of one object from ``shape`` (when it holds it), by ``renderer``."""

    shape: Shape
    renderer: Renderer


def plan_object_get(path: RequestPath, accept: str | None, held: Collections) -> ServeObject | None:
    """Which filled collection answers a GET of the object at ``path`` while the apiserver is
    unreachable (``offline``): one without selectors covering its namespace, in the first
    encoding the client accepts that has one (protobuf, then JSON); None when none does (the
    answer stays 503)."""
    protobuf_ok = held.has_protobuf(path.gvr)
    for ok in (protobuf_ok, False) if protobuf_ok else (False,):
        negotiated = negotiate(accept, single=True, protobuf_ok=ok)
        if negotiated.representation is Representation.PASS_THROUGH:
            continue
        wanted = Request(
            gvr=path.gvr,
            namespace=path.namespace,
            label_selector=LabelSelector.EVERYTHING,
            field_selector=FieldSelector.EVERYTHING,
            encoding=negotiated.encoding,
        )
        shape = held.find(wanted, namespaced=True if path.namespace else None)
        if shape is None or shape.rv is None:
            continue
        return ServeObject(
            shape=shape, renderer=renderer(shape, negotiated, untyped_list_items=False)
        )
    return None
