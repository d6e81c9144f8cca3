"""Discovery documents (``/api``, ``/apis``, ``/version``, ``/openapi/...``): kept, so a
controller can start while the apiserver is unreachable, and answered from warmwatch's copy
while the apiserver confirmed that copy recently (docs/design.md §5).

The rule a client sees (written in the README too):

- A document the apiserver confirmed within ``DiscoverySettings.max_age`` is answered from the
  copy, with no round trip: a warm restart of a controller does not wait on the upstream link
  for its discovery. A background task (``keep_confirmed``) re-asks the apiserver for the
  kept documents well within that age (within its rate, below), conditionally
  (``If-None-Match``) where the document has an ETag, so the copies stay confirmed while
  clients are quiet.
- Otherwise (never asked, not confirmed lately, too large to keep confirmed) the request is
  passed through and its 200 answer stored and confirmed.
- A write through warmwatch to CustomResourceDefinitions or APIServices changes what discovery
  says: for ``DiscoverySettings.quiet_after_change`` afterwards every discovery request is
  passed through, so a controller that installs its CRD and then looks it up sees it as soon as
  the apiserver does. A CRD installed by someone else appears at most ``max_age`` late.
- While the apiserver cannot be reached the stored document is answered, however old.

Which copy answers a request (``discovery_key``): one per document the apiserver serves and
``Accept`` header, keyed by the path; of the query only what the apiserver's handlers read
(kube-apiserver 1.37, its generic filters and kube-openapi):

- every document: ``timeout`` (the request-deadline filter; client-go sends ``timeout=32s``
  with its discovery) only bounds the request; a value Go's ``time.ParseDuration`` refuses
  is the apiserver's 400, so such a request is passed through and not stored;
- ``/api``, ``/api/V``, ``/apis``, ``/apis/G``, ``/apis/G/V`` (the negotiated serializer,
  legacy and aggregated discovery alike): ``pretty``, which indents the JSON: a ``pretty``
  that Go's ``ParseBool`` reads as true, or, without one, a ``User-Agent`` starting with
  ``curl``, ``Wget`` or ``Mozilla/5.0``, is a copy of its own;
- ``/openapi/v3/...`` (a group-version's document): ``hash``. A hashed URL (the ones
  ``/openapi/v3`` lists) whose answer the apiserver marks ``Cache-Control: immutable`` never
  changes (another hash is answered 301 to the current one): its copy is answered without
  revalidation;
- ``/version``, ``/openapi/v2``, ``/openapi/v3``: nothing.

Any other parameter changes no answer and is left out of the key: ``/version?n=1`` is
answered from, and stored as, the copy of ``/version``. Only 200 answers are stored: a
document the apiserver does not serve (``/apis/G/V`` of no such group, an unknown
``/openapi/v3/...``) is its 404, a stale ``hash`` its 301.

The copies are bounded (``DiscoverySettings``), in every ``--client-auth`` mode (``delegated``
stores them for an offline start, never answers them while the apiserver is reachable): at
most ``max_copies`` of them and
``max_bytes`` of documents, the least recently asked evicted to make room, never one a client
asked for within ``in_use_for`` (then the new document is passed through unstored);
revalidations run at most ``revalidation_rate`` a second, the most recently asked copies
first, and only of copies asked within ``keep_for``.

The plain health checks (``/healthz``, ``/livez``, ``/readyz``, no query: what controllers
poll before they start) follow the same rule, so a warm restart makes no round trip for them
either: a ``200 ok`` the apiserver gave within ``max_age`` is answered again, and kept
confirmed. Any other answer is not kept (the next check is passed through and sees it), and
while the apiserver cannot be reached the caller's own answer (``proxy.serve.health``)
stands, never a stored one.

This module keeps the copies (their bounds, their confirmation); answering a client from them
is ``proxy.serve.documents``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from proxy.kube.gocompat import GoDurationError, GoNumError, parse_bool, parse_duration, parse_query
from proxy.kube.options import first_values
from proxy.metrics import Metrics
from proxy.upstream.connecting import Upstream
from proxy.upstream.errors import UpstreamError
from proxy.upstream.forwarding import PassthroughSettings, forwarded_response_headers
from proxy.upstream.resilience import BreakerState, CircuitBreaker

logger = logging.getLogger(__name__)

#: Response headers of a cached discovery document that describe that one answer, not the
#: document: they are not stored.
_NOT_CACHED: Final = frozenset(
    {"content-length", "date", "audit-id", "set-cookie", "content-encoding"}
)

HEALTH_ENDPOINTS: Final = ("/healthz", "/livez", "/readyz")
"""The apiserver's health endpoints (``/readyz/etcd`` names one check of one)."""
_UNQUERIED: Final = frozenset({"/version", "/openapi/v2", "/openapi/v3"})
_PRETTY_AGENTS: Final = ("curl", "Wget", "Mozilla/5.0")
"""``negotiation.isPrettyPrint``: clients whose JSON the apiserver indents unasked."""


# ------------------------------------------------------------------------- documents


@dataclass(frozen=True, kw_only=True, slots=True)
class CachedDocument:
    """A discovery answer as stored for offline start."""

    status: int
    headers: tuple[tuple[str, str], ...]
    """End-to-end headers of the answer (Content-Type, ETag, Cache-Control, Vary, ...),
    without those describing one delivery (Date, Content-Length, Audit-Id)."""
    body: bytes
    etag: str | None

    @property
    def immutable(self) -> bool:
        """The apiserver said this answer never changes (a hashed openapi v3 URL)."""
        return any(
            name.lower() == "cache-control" and "immutable" in value.lower()
            for name, value in self.headers
        )


class DiscoveryCache(Protocol):
    """Where discovery documents are kept (SQLite in proxy.cache; in memory in tests)."""

    async def get(self, key: str) -> CachedDocument | None: ...

    async def put(self, key: str, doc: CachedDocument, *, evict: Sequence[str] = ()) -> None:
        """Store ``doc`` and delete the ``evict`` keys, at once."""

    async def drop(self, keys: Sequence[str]) -> None: ...


def discovery_key(*, path: str, query: str, accept: str, user_agent: str) -> str | None:
    """The copy that answers a GET of ``path`` with the raw ``query``: ``path?kept|Accept``
    with the kept parameters of the module's rule; None when warmwatch keeps no copy for it
    (not a discovery document, a health check with a query, a ``timeout`` the apiserver
    refuses): passed through, not stored."""
    if path in HEALTH_ENDPOINTS:
        return _key(path, [], accept) if not query else None
    if not (path in _UNQUERIED or path.startswith("/openapi/v3/") or _is_group_path(path)):
        return None
    params = first_values(parse_query(query))  # Go's URL.Query().Get: the first value
    if params.get("timeout"):
        try:
            parse_duration(params["timeout"])
        except GoDurationError:
            return None
    kept: list[tuple[str, str]] = []
    if path.startswith("/openapi/v3/") and params.get("hash"):
        kept.append(("hash", params["hash"]))
    if _is_group_path(path) and _pretty(query, params.get("pretty", ""), user_agent):
        kept.append(("pretty", "true"))
    return _key(path, kept, accept)


def _key(path: str, kept: list[tuple[str, str]], accept: str) -> str:
    return f"{path}?{urllib.parse.urlencode(kept, quote_via=urllib.parse.quote)}|{accept}"


def _is_group_path(path: str) -> bool:
    """``/api``, ``/api/V``, ``/apis``, ``/apis/G``, ``/apis/G/V``: written by the
    apiserver's negotiated serializer."""
    parts = path.split("/")  # ["", "apis", "G", "V"]
    if parts[1:2] == ["api"]:
        return len(parts) == 2 or (len(parts) == 3 and bool(parts[2]))
    if parts[1:2] == ["apis"]:
        return len(parts) == 2 or (len(parts) in (3, 4) and all(parts[2:]))
    return False


def _pretty(query: str, pretty: str, user_agent: str) -> bool:
    """``negotiation.isPrettyPrint``: ``pretty`` where the raw query names it, else the
    User-Agent."""
    if "pretty" in query and pretty:
        try:
            return parse_bool(pretty)
        except GoNumError:
            return False
    return user_agent.startswith(_PRETTY_AGENTS)


def parse_discovery_key(key: str) -> tuple[str, str]:
    """``(path?query, Accept)`` of a :func:`discovery_key`: what to ask the apiserver to
    revalidate it."""
    target, _, accept = key.partition("|")
    return target.removesuffix("?"), accept


def is_canonical_key(key: str) -> bool:
    """``key`` is what :func:`discovery_key` makes of itself (keys stored by an earlier build
    may hold a query this one leaves out)."""
    target, accept = parse_discovery_key(key)
    path, _, query = target.partition("?")
    return discovery_key(path=path, query=query, accept=accept, user_agent="") == key


def changes_discovery(path: str) -> bool:
    """A write to this path changes what discovery says: CustomResourceDefinitions and
    APIServices (and their status, which makes them Established / Available)."""
    return path.startswith(
        (
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            "/apis/apiregistration.k8s.io/v1/apiservices",
        )
    )


# ------------------------------------------------------------------------- the copies


@dataclass(frozen=True, kw_only=True, slots=True)
class DiscoverySettings:
    max_age: float = 10.0
    """A copy confirmed by the apiserver within this many seconds is answered without asking
    it. 10 s is the TTL of the apiserver's own delegating authn/authz caches: a new CRD or
    aggregated API made by someone else reaches clients at most this much later than through
    the apiserver, and client-go re-reads discovery when it misses a kind anyway. 0 turns
    answering from copies off (they are still kept for an offline start)."""

    quiet_after_change: float = 60.0
    """After a write to CRDs or APIServices through warmwatch, discovery is passed through for
    this long: a CRD becomes Established, and the apiserver's aggregated discovery shows it,
    within seconds of its creation."""

    keep_for: float = 7 * 24 * 3600.0
    """Copies some client asked for within this window are kept confirmed in the background;
    a controller restarted after a longer quiet has its first discovery passed through."""

    keep_max_bytes: int = 2 * 2**20
    """Copies larger than this without an ETag are not kept confirmed (re-reading them every
    few seconds would cost the link more than it saves); they are passed through each time.
    Documents with an ETag are revalidated with a 304 of a few bytes, whatever their size."""

    concurrency: int = 4
    """Revalidations in flight at once."""

    max_copies: int = 2000
    """Copies stored at most. The test apiserver with 150 CRD groups serves 550 discovery
    documents (legacy and aggregated discovery, openapi v2, an openapi v3 document per
    group-version; README, Limits), all of which a client reading everything stores; a second
    Accept header (protobuf) for some of them adds more. A query makes no copy of its own
    unless it changes the answer; each Accept header does."""

    max_bytes: int = 128 * 2**20
    """Bytes of stored documents at most (their bodies; in the database and, while answering
    from copies is on, in memory). Twice the largest document kept
    (``PassthroughSettings.discovery_max_bytes``, 64 MiB), so the largest real ``/openapi/v2``
    fits beside a cluster's whole openapi v3 (of the same size again)."""

    in_use_for: float = 60.0
    """A copy a client asked for within this long is never evicted: a controller reads its
    discovery within seconds of its start, kube-controller-manager re-reads it every 30 s.
    When only such copies are left, a new document is passed through unstored."""

    revalidation_rate: float = 20.0
    """Background revalidations per second at most, the most recently asked copies first:
    with ``max_age`` 10 s, 100 copies stay confirmed; a controller needs a handful (``/api``,
    ``/apis``, ``/version``, a health check). Others, once unconfirmed, are passed through
    when asked (and confirmed by that answer)."""

    def __post_init__(self) -> None:
        for name in ("max_copies", "max_bytes", "revalidation_rate"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--discovery-{name.replace('_', '-')} must be positive")

    @property
    def answering(self) -> bool:
        """Copies may be answered while confirmed (else they only serve offline)."""
        return self.max_age > 0


@dataclass(frozen=True, kw_only=True, slots=True)
class Kept:
    """What :meth:`DiscoveryCopies.keep` decided for a 200 answer."""

    write: bool
    """Store the document (it is new or changed, and it fits)."""
    evict: tuple[str, ...] = ()
    """...and delete these copies with it, to stay within the bounds."""
    same: bool = False
    """The stored copy has this body already: confirmed, nothing to write."""


@dataclass(slots=True)
class _Copy:
    size: int
    """Bytes of the stored body."""
    digest: bytes | None
    """Of the stored body; None until known (a copy stored by an earlier run)."""
    document: CachedDocument | None
    """Held while answering from copies is on, once it was stored or read from the store."""
    asked_at: float
    confirmed_at: float = -math.inf
    revalidating: bool = False

    @property
    def immutable(self) -> bool:
        return self.document is not None and self.document.immutable


def _digest(body: bytes) -> bytes:
    return hashlib.blake2b(body, digest_size=16).digest()


@dataclass(kw_only=True)
class DiscoveryCopies:
    """Which discovery documents are stored (within the bounds), and which may be answered
    from warmwatch's copy (the module's rule). The one account of the stored copies, in
    every ``--client-auth`` mode: the store holds exactly these keys.

    Synchronous bookkeeping with an injectable clock; the I/O is in :func:`serve_discovery`
    and :func:`keep_confirmed`.
    """

    settings: DiscoverySettings = field(default_factory=DiscoverySettings)
    clock: Callable[[], float] = time.monotonic
    metrics: Metrics = field(default_factory=Metrics)
    _copies: OrderedDict[str, _Copy] = field(default_factory=OrderedDict)
    """Least recently asked first."""
    _bytes: int = 0
    _quiet_until: float = -math.inf

    @property
    def count(self) -> int:
        """Copies stored."""
        return len(self._copies)

    @property
    def bytes(self) -> int:
        """Bytes of the stored copies' bodies."""
        return self._bytes

    def answer(self, key: str) -> CachedDocument | None:
        """The copy to answer ``key`` with, if it is confirmed recently enough (an immutable
        one once confirmed)."""
        now = self.clock()
        copy = self._ask(key, now)
        if copy is None or copy.document is None:
            return None
        if copy.immutable and copy.confirmed_at > -math.inf:
            return copy.document
        if now < self._quiet_until or now - copy.confirmed_at > self.settings.max_age:
            return None
        return copy.document

    def variants(self, key: str) -> list[str]:
        """The stored copies of the same document (path and kept query) as ``key``, asked
        with other ``Accept`` headers: the most recently asked first."""
        document = key.partition("|")[0]
        return [
            other
            for other in reversed(self._copies)
            if other != key and other.partition("|")[0] == document
        ]

    def asked(self, key: str) -> None:
        """``key`` was asked and passed through, with no document to keep (not a 200)."""
        self._ask(key, self.clock())

    def _ask(self, key: str, now: float) -> _Copy | None:
        copy = self._copies.get(key)
        if copy is not None:
            copy.asked_at = now
            self._copies.move_to_end(key)
        return copy

    def keep(self, key: str, document: CachedDocument, *, asked: bool = True) -> Kept:
        """The apiserver answered ``key`` with ``document`` (200): confirm the copy, and say
        whether to store it, and what to evict for it. ``asked``: for a client (else a
        revalidation, which does not bring back a copy evicted meanwhile)."""
        now = self.clock()
        copy = self._ask(key, now) if asked else self._copies.get(key)
        if copy is None and not asked:
            return Kept(write=False)
        digest = _digest(document.body)
        if copy is not None and copy.digest == digest:
            self._confirm(copy, document, now)
            return Kept(write=False, same=True)
        size = len(document.body)
        evict = self._room_for(key, size, now)
        if evict is None:
            self.metrics.discovery_copies_dropped.labels(reason="no room").inc()
            logger.debug("No room for discovery document %s (%d bytes)", key, size)
            if copy is not None:  # the stored one is no longer what the apiserver says
                copy.confirmed_at = -math.inf
            return Kept(write=False)
        for evicted in evict:
            self._remove(evicted)
        self.metrics.discovery_copies_dropped.labels(reason="evicted").inc(len(evict))
        if copy is None:
            copy = self._copies[key] = _Copy(size=0, digest=None, document=None, asked_at=now)
        self._bytes += size - copy.size
        copy.size, copy.digest = size, digest
        self._confirm(copy, document, now)
        self._account()
        return Kept(write=True, evict=tuple(evict))

    def _room_for(self, key: str, size: int, now: float) -> list[str] | None:
        """Copies to evict, least recently asked first, so that ``key`` at ``size`` bytes
        fits; None when it cannot without evicting one in use."""
        settings = self.settings
        if size > settings.max_bytes:
            return None
        current = self._copies.get(key)
        count = len(self._copies) + (current is None)
        total = self._bytes + size - (current.size if current is not None else 0)
        evict: list[str] = []
        for other, copy in self._copies.items():
            if count <= settings.max_copies and total <= settings.max_bytes:
                break
            if other == key or copy.revalidating or now - copy.asked_at <= settings.in_use_for:
                continue
            evict.append(other)
            count -= 1
            total -= copy.size
        if count > settings.max_copies or total > settings.max_bytes:
            return None
        return evict

    def confirmed(self, key: str, document: CachedDocument) -> None:
        """The apiserver just answered 304 to the ETag of ``key``'s copy, ``document``."""
        copy = self._copies.get(key)
        if copy is not None:
            if copy.digest is None:
                copy.digest = _digest(document.body)
            self._confirm(copy, document, self.clock())

    def _confirm(self, copy: _Copy, document: CachedDocument, now: float) -> None:
        copy.document = document if self.settings.answering else None
        copy.confirmed_at = now

    def forget(self, key: str) -> bool:
        """The apiserver no longer serves ``key`` (or it grew too large): no longer kept.
        Whether it was (then the caller deletes it from the store)."""
        if key not in self._copies:
            return False
        self._remove(key)
        self._account()
        return True

    def unconfirmed(self, key: str) -> None:
        """The apiserver answered ``key`` with an error: the next request is passed through
        and sees it (the stored copy still serves offline)."""
        copy = self._copies.get(key)
        if copy is not None:
            copy.confirmed_at = -math.inf

    def _remove(self, key: str) -> None:
        copy = self._copies.pop(key)
        self._bytes -= copy.size

    def _account(self) -> None:
        self.metrics.discovery_copies.set(len(self._copies))
        self.metrics.discovery_copy_bytes.set(self._bytes)

    def remember(self, stored: Iterable[tuple[str, int]]) -> list[str]:
        """Copies stored by an earlier run, ``(key, bytes)`` oldest first: kept confirmed from
        now on (their documents are read from the store by the first revalidation). Returns
        the keys to delete from the store: those this build would not store (a query it
        leaves out) and, oldest first, those past the bounds."""
        now = self.clock()
        # Counted as asked just before the in-use window: kept confirmed for ``keep_for``,
        # evictable at once.
        asked_at = now - self.settings.in_use_for - 1.0
        dropped: list[str] = []
        for key, size in stored:
            if not is_canonical_key(key):
                dropped.append(key)
                continue
            self._copies[key] = _Copy(size=size, digest=None, document=None, asked_at=asked_at)
            self._bytes += size
        settings = self.settings
        while len(self._copies) > settings.max_copies or self._bytes > settings.max_bytes:
            oldest = next(iter(self._copies))
            self._remove(oldest)
            dropped.append(oldest)
        self._account()
        return dropped

    def api_changed(self) -> None:
        """A write changed which APIs are served (:func:`changes_discovery`)."""
        self._quiet_until = self.clock() + self.settings.quiet_after_change

    def due(self, *, limit: int) -> list[tuple[str, CachedDocument | None]]:
        """At most ``limit`` copies to revalidate now, the most recently asked first: asked
        within ``keep_for``, confirmed more than half of ``max_age`` ago (an immutable one:
        never yet), not too large without an ETag, not being revalidated already."""
        now = self.clock()
        settings = self.settings
        due: list[tuple[str, CachedDocument | None]] = []
        for key in reversed(self._copies):
            copy = self._copies[key]
            if len(due) >= limit or now - copy.asked_at > settings.keep_for:
                break  # the rest were asked even longer ago
            if copy.revalidating or now - copy.confirmed_at <= settings.max_age / 2:
                continue
            if copy.immutable and copy.confirmed_at > -math.inf:
                continue
            if copy.size > settings.keep_max_bytes and not _has_etag(copy):
                continue
            due.append((key, copy.document))
        return due

    def revalidating(self, key: str, *, busy: bool) -> None:
        copy = self._copies.get(key)
        if copy is not None:
            copy.revalidating = busy


def _has_etag(copy: _Copy) -> bool:
    """Unknown (not read from the store yet) counts as having one: the first revalidation
    reads it."""
    return copy.document is None or copy.document.etag is not None


def document_of(headers: Iterable[tuple[str, str]], body: bytes) -> CachedDocument:
    kept = tuple((k, v) for k, v in headers if k.lower() not in _NOT_CACHED)
    etag = next((v for k, v in kept if k.lower() == "etag"), None)
    return CachedDocument(status=200, headers=kept, body=body, etag=etag)


async def keep(
    copies: DiscoveryCopies,
    cache: DiscoveryCache,
    key: str,
    document: CachedDocument,
    *,
    asked: bool = True,
) -> Kept:
    """Account for a 200 answer (``DiscoveryCopies.keep``) and store what it says."""
    kept = copies.keep(key, document, asked=asked)
    if kept.write:
        try:
            await cache.put(key, document, evict=kept.evict)
        except Exception:  # the client has its answer; a cache failure must not matter
            logger.exception("Cannot store discovery document %s", key)
    return kept


# ------------------------------------------------------------------------- keeping copies


async def keep_confirmed(
    copies: DiscoveryCopies,
    *,
    upstream: Upstream,
    cache: DiscoveryCache,
    breaker: CircuitBreaker | None,
    settings: PassthroughSettings,
) -> None:
    """Revalidate due copies (``DiscoveryCopies.due``) with warmwatch's own credentials until
    cancelled, at most ``revalidation_rate`` a second: each pass starts at most that many
    times its period, and the next pass begins a period after the last one ended. Does
    nothing while answering from copies is off or the breaker is open: copies then go
    unconfirmed and requests are passed through (or answered from the store)."""
    period = max(copies.settings.max_age / 4, 0.25)
    per_pass = max(1, math.floor(copies.settings.revalidation_rate * period))
    gate = asyncio.Semaphore(copies.settings.concurrency)

    async def one(key: str, document: CachedDocument | None) -> None:
        async with gate:
            copies.revalidating(key, busy=True)
            try:
                await revalidate(
                    copies, key, document, upstream=upstream, cache=cache, settings=settings
                )
            except UpstreamError as error:  # unreachable, or its connections all in use
                logger.debug("Revalidating discovery %s: %s", key, error)
                upstream.metrics.discovery_revalidations.labels(result="error").inc()
            finally:
                copies.revalidating(key, busy=False)

    while True:
        await asyncio.sleep(period)
        if not copies.settings.answering:
            continue
        if breaker is not None and breaker.state is BreakerState.OPEN:
            continue
        due = copies.due(limit=per_pass)
        if due:
            await asyncio.gather(*(one(key, document) for key, document in due))


async def revalidate(
    copies: DiscoveryCopies,
    key: str,
    document: CachedDocument | None,
    *,
    upstream: Upstream,
    cache: DiscoveryCache,
    settings: PassthroughSettings,
) -> None:
    """Ask the apiserver for ``key`` again (conditionally when the copy has an ETag): the
    same answer confirms the copy, a new one replaces it (in the store too), a 404 or 410
    (the API is gone) or a document grown too large deletes it, and any other answer leaves
    it unconfirmed, so the next client request is passed through and gets that answer."""
    if document is None:
        document = await stored_document(cache, key)
    target, accept = parse_discovery_key(key)
    headers = {"Accept": accept} if accept else {}
    if document is not None and document.etag:
        headers["If-None-Match"] = document.etag
    metric = upstream.metrics.discovery_revalidations
    async with upstream.request(
        "GET",
        target,
        headers=headers,
        timeout=settings.idle_timeout,
        stream=True,
        purpose="discovery",
    ) as response:
        if response.status == 304 and document is not None:
            copies.confirmed(key, document)
            metric.labels(result="unchanged").inc()
            return
        if response.status != 200:
            if response.status in (404, 410):
                await _forget(copies, cache, key)
            else:
                copies.unconfirmed(key)
            metric.labels(result="gone").inc()
            return
        body = bytearray()
        async for chunk in response.content.iter_any():
            body += chunk
            if len(body) > settings.discovery_max_bytes:
                await _forget(copies, cache, key)
                metric.labels(result="too large").inc()
                return
        fresh = document_of(forwarded_response_headers(response.headers), bytes(body))
    if document is not None and fresh.body == document.body:
        copies.confirmed(key, document)
        metric.labels(result="unchanged").inc()
        return
    kept = await keep(copies, cache, key, fresh, asked=False)
    metric.labels(result="unchanged" if kept.same else "changed").inc()


async def _forget(copies: DiscoveryCopies, cache: DiscoveryCache, key: str) -> None:
    if copies.forget(key):
        try:
            await cache.drop([key])
        except Exception:
            logger.exception("Cannot delete discovery document %s", key)


async def stored_document(cache: DiscoveryCache, key: str) -> CachedDocument | None:
    try:
        return await cache.get(key)
    except Exception:
        logger.exception("Cannot read discovery document %s", key)
        return None
