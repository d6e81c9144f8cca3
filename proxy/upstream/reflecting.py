"""The reflector: keeps one shape in step with the apiserver (docs/design.md §4).

- Objects are listed and watched in the shape's encoding (JSON, or protobuf: see
  ``decoding``).
- No RV yet: fill by WatchList (``sendInitialEvents=true``) where the apiserver supports it,
  else by paginated LIST, staging page by page (bounded memory) and making the result visible
  in one transaction.
- Then watch from the shape's RV with bookmarks, committing each arriving chunk of events as
  one transaction before anyone sees it. A normal end of the stream re-watches from the RV.
- 410 (at request time or as an ERROR event): relist and append the difference to the log.
- Other failures: capped jittered backoff, Retry-After honoured, the circuit breaker told.

Only the list phase holds a :class:`ListLimiter` slot: a WatchList fill gives its slot back
as soon as its initial events are committed and goes on as the shape's watch. Clients waiting
for a first fill follow it through :class:`FillProgress`.

How :meth:`Reflector.run` ends (the syncer's supervisor decides what follows, see
``syncing``): ``REFUSED`` when the first list is refused (401, 403, 404, ...: never cache
what warmwatch may not read), ``REVOKED`` when a filled shape's list or watch is answered
403 or 404 several times in a row (access revoked, CRD deleted: the cache must stop
answering for it). Anything else is retried here, forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from proxy.cache.records import Change, ChangeType
from proxy.cache.shapes import Shape
from proxy.cache.store import StorageError, Store
from proxy.kube import versions
from proxy.metrics import Metrics
from proxy.upstream.connecting import Upstream
from proxy.upstream.decoding import Event, check_content_type, codec_for, error_event
from proxy.upstream.errors import (
    UpstreamBusy,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamSilent,
    UpstreamStatusError,
)
from proxy.upstream.resilience import (
    Backoff,
    CircuitBreaker,
    Clock,
    ListLimiter,
    ListSlot,
    choose_delay,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class ReflectorSettings:
    page_size: int = 500
    """LIST page size when WatchList is not available (client-go's default)."""
    watch_timeout_min: float = 300.0
    """Upstream watches end after a random 5-10 minutes, as client-go's do, so a connection
    that went silently bad is replaced and load balancers see fresh connections."""
    watch_timeout_max: float = 600.0
    idle_timeout: float = 120.0
    """An upstream watch that delivers nothing for this long is replaced by a new one from
    the same resourceVersion, at once and without counting as a failure. Silence alone does
    not tell a dead connection (the apiserver's node gone without a reset, a dropped NAT
    entry) from a quiet collection: bookmarks are requested, but the apiserver's carry its
    watch cache's resourceVersion, which for a resource nobody writes stays put until etcd's
    next progress notification (minutes; measured: kube-controller-manager's idle
    collections went silent for over two minutes on a local apiserver). The new watch tells
    them apart: over a dead path it fails to connect, which is a failure (backoff, circuit
    breaker). TCP keepalive (``ConnectionSettings``) catches a dead peer at the socket
    level."""
    stage_batch: int = 1000
    """Objects committed per staging transaction during a fill."""
    watch_list: bool = True
    """Try WatchList first; falls back to LIST when the apiserver refuses it."""
    healthy_after: float = 120.0
    """A watch that lived this long resets the backoff (client-go: 2 minutes)."""
    revoke_after: int = 3
    """Consecutive 403/404 answers to a filled shape's list or watch that mean "access
    revoked" or "resource gone" (a deleted CRD). More than one, because a restarting apiserver
    can answer 404 for a custom resource for a moment before its CRD informer has synced;
    with the backoff in between, three answers span a few seconds."""


class Ending(enum.Enum):
    """Why :meth:`Reflector.run` returned (it runs until cancelled otherwise)."""

    REFUSED = "refused"
    """The first list was refused: nothing was cached."""
    REVOKED = "revoked"
    """A filled shape became unreadable upstream: its cache must no longer be served."""


class FillState(enum.Enum):
    QUEUED = "queued"
    """Waiting for a list slot (other shapes are listing)."""
    LISTING = "listing"
    BACKING_OFF = "backing-off"
    """The last attempt failed, or the circuit breaker is open: no fill is under way."""
    REFUSED = "refused"
    FILLED = "filled"


class FillProgress:
    """A shape's first fill as a waiting client sees it: its state, when it last made
    progress (objects arrived, a slot was granted), and a signal on every change."""

    def __init__(self, *, filled: bool, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self.state = FillState.FILLED if filled else FillState.QUEUED
        self.progressed_at = clock()
        self.refusal: UpstreamStatusError | None = None
        self._changed = asyncio.Event()

    def set(self, state: FillState, *, refusal: UpstreamStatusError | None = None) -> None:
        if self.state is FillState.FILLED or (state is self.state and refusal is None):
            return
        self.state, self.refusal = state, refusal
        self.progress()

    def progress(self) -> None:
        self.progressed_at = self._clock()
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self, *, timeout: float) -> None:
        """Wait for the next change (or ``timeout``)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)


class FillLog:
    """Progress lines of a long list (a cold fill or a relist): objects so far, objects/s and,
    when the total is known, the estimated time left; at most one line per ``interval``.

    The total is known from a paginated LIST's ``remainingItemCount``, or expected from the
    objects the shape held before (a relist). A WatchList announces no total: a cold one long
    enough for a first line asks for it (``Reflector._count_ahead``), so from its second line
    on the time left is estimated too.
    """

    def __init__(
        self,
        *,
        resource: str,
        expected: int | None,
        interval: float = 5.0,
        clock: Clock = time.monotonic,
    ) -> None:
        self.resource = resource
        self.expected = expected
        self.interval = interval
        self._clock = clock
        self.started = self._last = clock()
        self.objects = 0

    def add(self, count: int, *, remaining: int | None = None) -> dict[str, Any] | None:
        """``count`` more objects arrived (``remaining``: the apiserver says this many
        follow). Logs and returns the line's fields when one is due."""
        self.objects += count
        if remaining is not None:
            self.expected = self.objects + remaining
        now = self._clock()
        if now - self._last < self.interval:
            return None
        self._last = now
        rate = self.objects / max(now - self.started, 1e-9)
        fields: dict[str, Any] = {
            "resource": self.resource,
            "objects": self.objects,
            "objectsPerSecond": round(rate, 1),
        }
        left = ""
        if self.expected is not None and self.expected > self.objects and rate > 0:
            fields["expectedObjects"] = self.expected
            fields["secondsLeft"] = round((self.expected - self.objects) / rate, 1)
            left = f" of about {self.expected}, {fields['secondsLeft']:.0f}s left"
        logger.info(
            "%s: listing: %d objects%s (%.0f objects/s)",
            self.resource,
            self.objects,
            left,
            rate,
            extra=fields,
        )
        return fields


class Expired(Exception):
    """The watch's RV is gone upstream (410): relist."""


def _refuses(code: int) -> bool:
    """A first list answered with a client error other than 410/429 will not succeed by
    retrying (401, 403, 404, 405 for a collection that cannot be listed...)."""
    return 400 <= code < 500 and code not in (410, 429)


def _params(shape: Shape, **extra: str) -> dict[str, str]:
    params = dict(extra)
    if shape.key.label_selector:
        params["labelSelector"] = shape.key.label_selector
    if shape.key.field_selector:
        params["fieldSelector"] = shape.key.field_selector
    return params


class Reflector:
    def __init__(
        self,
        *,
        shape: Shape,
        store: Store,
        upstream: Upstream,
        settings: ReflectorSettings,
        limiter: ListLimiter,
        breaker: CircuitBreaker,
        backoff: Backoff,
        metrics: Metrics,
    ) -> None:
        self.shape = shape
        self.store = store
        self.upstream = upstream
        self.settings = settings
        self.limiter = limiter
        self.breaker = breaker
        self.backoff = backoff
        self.metrics = metrics
        self.watch_list = settings.watch_list
        self.path = shape.key.gvr.collection_path(namespace=shape.key.namespace or None)
        self.codec = codec_for(shape.key.encoding)
        self.fill = FillProgress(filled=shape.rv is not None)
        if shape.configured or shape.rv is not None:  # listed: the resource exists
            metrics.resources.hold(self.resource)
        self._denied = 0
        """Consecutive 403/404 answers while the shape is filled (see ``revoke_after``)."""
        self._relist = False
        """A 410 asked for a relist; cleared when a list is committed (:meth:`_finish`), not
        when ``_list`` returns: a WatchList goes on as the watch inside it, and a failure of
        that watch must resume from the relisted RV, not list the collection again."""
        self._fill_log = FillLog(resource=self.resource, expected=None)
        self._large = False
        """A list of this collection needed a slot of the limiter (``_hold_if_large``)."""
        self._counting: asyncio.Task[None] | None = None
        """The fill's ``_count_ahead`` while it runs (owned: cancelled when the list ends)."""

    @property
    def resource(self) -> str:
        return self.shape.resource

    async def run(self) -> Ending:
        """Keep the shape in step until cancelled, or until it must not be cached (Ending)."""
        while True:
            try:
                await self._admitted()
                if self.shape.rv is None or self._relist:
                    await self._list()
                started = time.monotonic()
                await self._watch()
                if time.monotonic() - started > self.settings.healthy_after:
                    self.backoff.reset()
            except Expired as expired:
                logger.info(
                    "%s: %s; relisting from RV %s",
                    self.resource,
                    expired.__cause__ or expired,
                    self.shape.rv,
                )
                self._relist = True
            except UpstreamStatusError as error:
                if self.shape.rv is None and _refuses(error.code):
                    self.fill.set(FillState.REFUSED, refusal=error)
                    logger.warning("%s: upstream refused the list: %s", self.resource, error)
                    return Ending.REFUSED
                if error.code in (403, 404):
                    self._denied += 1
                    if self._denied >= self.settings.revoke_after:
                        logger.warning(
                            "%s: upstream answers %d %s; no longer serving it from the cache",
                            self.resource,
                            error.code,
                            error.reason,
                        )
                        return Ending.REVOKED
                unhealthy = error.code >= 500 or error.code == 429
                await self._pause(error, retry_after=error.retry_after, unhealthy=unhealthy)
            except UpstreamBusy as error:  # our own budget, not the apiserver's health
                await self._pause(error, retry_after=None, unhealthy=False)
            except UpstreamError as error:
                await self._pause(error, retry_after=None, unhealthy=True)
            except (OSError, ValueError) as error:  # a broken stream (framing, JSON)
                await self._pause(error, retry_after=None, unhealthy=False)
            except StorageError as error:
                # Nothing of the batch was committed; the watch resumes from the last
                # committed RV once writes succeed again (e.g. disk space was freed).
                await self._pause(error, retry_after=None, unhealthy=False)

    async def _admitted(self) -> None:
        """Wait while the circuit breaker is open: one probe at a time finds out whether the
        apiserver is back, instead of every reflector hammering it."""
        while not self.breaker.allow():
            self.fill.set(FillState.BACKING_OFF)
            # Look again at least every second: while another reflector's probe is in
            # flight, retry_in() is its timeout (a minute), but a successful probe closes the
            # breaker at once and every waiting shape should resume then, not a minute later.
            await asyncio.sleep(min(max(self.breaker.retry_in(), 0.2), 1.0))

    async def _pause(self, error: Exception, *, retry_after: float | None, unhealthy: bool) -> None:
        if unhealthy:
            self.breaker.record_failure()
            self.metrics.watch_restarts.labels(resource=self.resource, reason="error").inc()
        self.fill.set(FillState.BACKING_OFF)
        delay = choose_delay(backoff=self.backoff.next_delay(), retry_after=retry_after)
        logger.info("%s: %s; retrying in %.1fs", self.resource, error, delay)
        await asyncio.sleep(delay)

    # -- listing -----------------------------------------------------------------------------

    async def _list(self) -> None:
        """Fill (first time) or relist (after 410); a relist appends the diff to the log."""
        async with self.limiter.slot() as slot:
            self.fill.set(FillState.LISTING)
            started = time.monotonic()
            self.metrics.upstream_relists.labels(resource=self.resource).inc()
            await self.store.begin_list(self.shape)
            held = self.metrics.value(
                "warmwatch_shape_objects",
                {"resource": self.resource, "shape": str(self.shape.id)},
            )
            self._fill_log = FillLog(resource=self.resource, expected=int(held) if held else None)
            if self.watch_list:
                try:
                    await self._watch_list(slot, started=started)
                    return
                except UpstreamStatusError as error:
                    if slot.released or error.code not in (400, 422):
                        raise  # (a released slot: the fill was done, this is the watch)
                    logger.info("%s: WatchList refused (%s); using LIST", self.resource, error)
                    self.watch_list = False
                finally:
                    if self._counting is not None:
                        self._counting.cancel()
                        await asyncio.gather(self._counting, return_exceptions=True)
                        self._counting = None
            await self._paginated_list(slot)
            self._observe_list(started, "list")

    async def _count_ahead(self) -> None:
        """A cold WatchList announces no total: once it has run long enough for a progress
        line, one ``limit=1`` LIST beside it (answered by etcd with ``remainingItemCount``:
        one object and a count) tells the fill log how many to expect, so its later lines
        estimate the time left. Best effort: any failure only leaves the estimate out."""
        params = _params(self.shape, limit="1")
        try:
            async with self.upstream.request(
                "GET",
                (self.path, params),
                headers={"Accept": self.codec.accept},
                purpose="reflector",
                verb="LIST",
            ) as response:
                if response.status != 200:
                    return
                body = await response.read()
            page = self.codec.page(body)
        except (UpstreamError, ValueError) as error:
            logger.debug("%s: no total for the fill log: %s", self.resource, error)
            return
        if page.remaining is not None and self._fill_log.expected is None:
            self._fill_log.expected = len(page.changes) + page.remaining

    def _progressed(self, slot: ListSlot) -> None:
        slot.progress()
        self.fill.progress()

    async def _hold_if_large(self, slot: ListSlot, received: int) -> None:
        """A list that has received ``free_bytes`` of objects (or any list, with 0) goes on
        only in a slot of the limiter (``ListLimiterSettings.free_bytes``). While it waits it
        reads nothing more: a paused WatchList is held back by TCP, a paginated list asks for
        no next page. Its clients see the fill queued. A collection found large once takes
        its slot from the start of every later list (a retry, a relist): a WatchList paused
        long behind other large lists may be closed by the apiserver, and should not be
        paused again."""
        if slot.held or (received < self.limiter.settings.free_bytes and not self._large):
            return
        self._large = True
        self.fill.set(FillState.QUEUED)
        await slot.hold()
        self.fill.set(FillState.LISTING)

    def _observe_list(self, started: float, how: str) -> None:
        self.metrics.list_duration.labels(resource=self.resource, source=f"upstream-{how}").observe(
            time.monotonic() - started
        )

    async def _paginated_list(self, slot: ListSlot) -> None:
        """LIST page by page. A ``continue`` token that expired (410: the list took longer
        than etcd keeps its revision) falls back to one unpaginated list, as client-go's
        pager does, instead of starting the pages over (which would expire again)."""
        continue_token = ""
        rv = kind = api_version = ""
        paginate = True
        received = 0
        while True:
            await self._hold_if_large(slot, received)
            params = _params(
                self.shape, **({"limit": str(self.settings.page_size)} if paginate else {})
            )
            if continue_token:
                params["continue"] = continue_token
            async with self.upstream.request(
                "GET",
                (self.path, params),
                headers={"Accept": self.codec.accept},
                purpose="reflector",
                verb="LIST",
            ) as response:
                body = await response.read()
                expired = response.status == 410 and continue_token
                received += len(body)
                if expired:
                    logger.info(
                        "%s: the list's continue token expired; listing whole instead",
                        self.resource,
                    )
                elif response.status >= 400:
                    raise UpstreamStatusError.from_response(
                        code=response.status, body=body, headers=response.headers
                    )
                else:
                    check_content_type(self.codec, response.content_type)
            if expired:
                await self.store.begin_list(self.shape)
                continue_token, paginate = "", False
                continue
            self.breaker.record_success()
            self._denied = 0
            page = self.codec.page(body)
            if not continue_token:
                rv, kind, api_version = page.rv, page.kind, page.api_version
            self._progressed(slot)
            await self.store.stage(self.shape, page.changes)
            self._fill_log.add(len(page.changes), remaining=page.remaining)
            continue_token = page.continue_token
            if not continue_token:
                break
        if not rv or not kind:
            raise UpstreamProtocolError(f"LIST of {self.path} without resourceVersion or kind")
        await self._finish(rv=rv, kind=kind, api_version=api_version)

    async def _finish(self, *, rv: str, kind: str, api_version: str) -> None:
        if self.shape.rv is not None and versions.compare(rv, self.shape.rv) == -1:
            # A relist must not take the cache back in time (clients hold newer RVs).
            raise UpstreamProtocolError(
                f"relist at RV {rv} is older than the cache's {self.shape.rv}"
            )
        appended = await self.store.finish_list(
            self.shape, rv=rv, kind=kind, api_version=api_version
        )
        self._relist = False
        self.metrics.resources.hold(self.resource)
        logger.info(
            "%s: listed at RV %s (%d events appended)",
            self.resource,
            rv,
            appended,
            extra={
                "resource": self.resource,
                "shape": self.shape.id,
                "resourceVersion": rv,
                "objects": self._fill_log.objects,
                "appended": appended,
            },
        )
        self.fill.set(FillState.FILLED)
        self._observe_rv(rv)

    async def _watch_list(self, slot: ListSlot, *, started: float) -> None:
        """Fill by WatchList, give the list slot back, then keep consuming the same stream as
        the watch."""
        params = _params(
            self.shape,
            watch="1",
            sendInitialEvents="true",
            resourceVersionMatch="NotOlderThan",
            allowWatchBookmarks="true",
            timeoutSeconds=str(self._watch_timeout()),
        )
        staged: list[Change] = []
        kind = api_version = ""
        filling = True
        received = 0
        await self._hold_if_large(slot, received)
        try:
            async with self._stream(params) as chunks:
                self.breaker.record_success()
                async for events in self.codec.batches(chunks):
                    if not filling:
                        await self._apply(events)
                        continue
                    self._progressed(slot)
                    added = sum(1 for event in events if event.type == "ADDED")
                    line = self._fill_log.add(added)
                    if line is not None and self._fill_log.expected is None and not self._counting:
                        # A fill long enough for a progress line: learn its total for the next.
                        self._counting = asyncio.create_task(
                            self._count_ahead(), name=f"counting {self.resource}"
                        )
                    for index, event in enumerate(events):
                        if event.type == "ADDED" and event.change is not None:
                            kind = event.kind or kind
                            api_version = event.api_version or api_version
                            staged.append(event.change)
                            received += len(event.change.raw)
                            if len(staged) >= self.settings.stage_batch:
                                await self.store.stage(self.shape, staged)
                                staged = []
                        elif event.type == "BOOKMARK" and event.initial_events_end:
                            await self.store.stage(self.shape, staged)
                            await self._finish(
                                rv=event.rv,
                                kind=kind or event.kind,
                                api_version=api_version or event.api_version,
                            )
                            self._observe_list(started, "watchlist")
                            slot.release()
                            filling = False
                            if rest := events[index + 1 :]:
                                await self._apply(rest)
                            break
                        elif event.type == "ERROR":
                            _raise_error(event.status)
                    if filling:
                        await self._hold_if_large(slot, received)
        except UpstreamSilent:
            if filling:
                raise  # silence while the initial events come is a failure
            self._silent()  # after them, the watch of a quiet collection
            return
        if filling:
            raise UpstreamProtocolError("WatchList ended before its initial-events-end bookmark")

    # -- watching ----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _stream(self, params: dict[str, str]) -> AsyncIterator[AsyncIterator[bytes]]:
        """An upstream watch: its body as chunks; a refusal raises UpstreamStatusError."""
        async with self.upstream.request(
            "GET",
            (self.path, params),
            stream=True,
            timeout=self.settings.idle_timeout,
            headers={"Accept": self.codec.accept},
            purpose="reflector",
            verb="WATCH",
        ) as response:
            if response.status >= 400:
                raise UpstreamStatusError.from_response(
                    code=response.status, body=await response.read(), headers=response.headers
                )
            check_content_type(self.codec, response.content_type)
            self._denied = 0
            yield response.content.iter_any()

    def _watch_timeout(self) -> int:
        return int(random.uniform(self.settings.watch_timeout_min, self.settings.watch_timeout_max))

    async def _watch(self) -> None:
        assert self.shape.rv is not None
        params = _params(
            self.shape,
            watch="1",
            resourceVersion=self.shape.rv,
            allowWatchBookmarks="true",
            timeoutSeconds=str(self._watch_timeout()),
        )
        try:
            async with self._stream(params) as chunks:
                self.breaker.record_success()
                async for events in self.codec.batches(chunks):
                    await self._apply(events)
        except UpstreamSilent:
            self._silent()
            return
        except UpstreamStatusError as error:
            if error.code == 410:
                raise Expired from error
            raise
        self.metrics.watch_restarts.labels(resource=self.resource, reason="ended").inc()

    def _silent(self) -> None:
        """The watch said nothing for ``idle_timeout``: the caller watches again at once
        (``ReflectorSettings.idle_timeout``)."""
        self.metrics.watch_restarts.labels(resource=self.resource, reason="idle").inc()
        logger.debug(
            "%s: upstream watch silent for %gs; watching again from RV %s",
            self.resource,
            self.settings.idle_timeout,
            self.shape.rv,
        )

    async def _apply(self, events: list[Event]) -> None:
        """Commit one chunk's events as one transaction (then they are published)."""
        changes: list[Change] = []
        for event in events:
            if event.type == "ERROR":
                await self.store.apply(self.shape, changes)
                _raise_error(event.status)
            if event.type == "BOOKMARK":
                if event.rv and event.rv != self.shape.rv:
                    changes.append(Change(type=ChangeType.BOOKMARK, rv=event.rv))
                continue
            assert event.change is not None
            changes.append(event.change)
            self.metrics.events_in.labels(resource=self.resource, type=event.type).inc()
        await self.store.apply(self.shape, changes)
        if changes:
            self._observe_rv(changes[-1].rv)

    def _observe_rv(self, rv: str) -> None:
        self.metrics.set_shape_resource_version(resource=self.resource, shape=self.shape.id, rv=rv)


def _raise_error(status: Mapping[str, Any]) -> None:
    error = error_event(status)
    if error.code == 410:
        raise Expired from error
    raise error
