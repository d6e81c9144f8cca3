"""WATCH from the cache (docs/design.md §5).

A watcher is a cursor into the shape's committed log: it starts from the state snapshot (RV
unset/"0", WatchList) or from the log position of RV N, then reads whatever was committed after
its cursor — from memory, or from the database when it has fallen behind. Once it has sent
everything it parks as the log's follower (``cache/tailing.py``): the next commits are written
to its client from the publishing writer itself as long as the client's socket takes them at
once, and otherwise it is woken to write them in its own loop, with the write deadline. It
never holds up the writer or other watchers; if its own client stops reading it is closed, and
the client resumes from its last RV out of the log.

Failures after the stream started are ERROR events (a Status), then the stream ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web

from proxy.cache.filtering import Filter
from proxy.cache.pooling import Snapshot
from proxy.cache.reading import LogTrimmed, TooNew
from proxy.cache.records import ChangeType, EventRecord
from proxy.cache.shapes import Shape
from proxy.kube import versions
from proxy.kube.options import ListOptions, WatchStart, WatchStartKind
from proxy.kube.status import StatusError
from proxy.serve.authorizing import Grant
from proxy.serve.context import Context
from proxy.serve.listing import wait_for_rv
from proxy.serve.rendering import Renderer
from proxy.serve.streaming import Pieces, SlowClient, cut, write_now, write_within

logger = logging.getLogger(__name__)


class Watch:
    """One client watch: its cursor, filter and deadline."""

    def __init__(
        self,
        *,
        ctx: Context,
        shape: Shape,
        view: Filter,
        options: ListOptions,
        start: WatchStart,
        renderer: Renderer,
        request: web.Request,
        grant: Grant | None = None,
        initial_sent: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.ctx = ctx
        self.shape = shape
        self.view = view
        self.options = options
        self.start = start
        self.renderer = renderer
        self.request = request
        self.grant = grant
        """``--client-auth delegated``: authorized again every allow-TTL; the stream ends
        once it no longer holds (the client's relist then gets the 403)."""
        self.revoked = False
        self.initial_sent = initial_sent
        """Called once the initial state has been sent (at once for a watch without one), or
        when the watch ends before that."""
        self.response = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": renderer.watch_content_type,
                "Cache-Control": "no-cache, private",
            },
        )
        timeout: float
        if options.timeout_seconds is not None and options.timeout_seconds > 0:
            timeout = options.timeout_seconds
        else:
            timeout = ctx.settings.min_request_timeout * random.uniform(1.0, 2.0)
        self.deadline = time.monotonic() + timeout
        self.cursor = 0
        self.position_rv = ""
        """RV of the newest log entry this watcher has passed (sent or filtered out)."""
        self._snapshot: Snapshot | None = None
        """The initial state, from :meth:`_begin` until :meth:`_send_initial` sent it."""
        self._frames = ctx.frames.of(shape, renderer)
        self._events_out = ctx.metrics.events_out.labels(resource=shape.resource)
        self._delivery_lag = ctx.metrics.event_delivery_lag.labels(resource=shape.resource)
        self._woken: asyncio.Future[None] | None = None
        """While parked (:meth:`_park`): resolved by :meth:`wake`."""

    # -- writing -----------------------------------------------------------------------------

    async def _write(self, data: bytes) -> None:
        await write_within(
            self.response,
            data,
            timeout=self.ctx.settings.slow_write_timeout,
            transport=self.request.transport,
        )

    async def _bookmark(self, *, initial_events_end: bool = False) -> None:
        await self._write(
            self.renderer.bookmark(rv=self.position_rv, initial_events_end=initial_events_end)
        )

    async def _error(self, error: StatusError) -> None:
        with contextlib.suppress(SlowClient, ConnectionError):
            await self._write(self.renderer.error(error))

    # -- the stream --------------------------------------------------------------------------

    async def serve(self) -> web.StreamResponse:
        """Fix where the watch starts, then stream.

        The start (a log position, or the snapshot of the initial state) is fixed *before*
        the answer begins, as the apiserver establishes its watcher before it writes the
        headers: a write that lands after a client saw the headers is an event of its watch,
        never part of its initial state. Failing to start is an ordinary Status answer; a
        failure after the answer began is an ERROR event, then the end.
        """
        async with contextlib.AsyncExitStack() as initial:
            if self.initial_sent is not None:
                initial.push_async_callback(self.initial_sent)
            # The initial state's slot (``--max-list-streams``) is taken before the answer
            # begins, so that over the limit the answer is still a 429.
            if self.start.kind is WatchStartKind.INITIAL_STATE:
                await initial.enter_async_context(self.ctx.admission.list_stream())
            failed: StatusError | None = None
            try:
                started = await self._begin(initial, wait=False)
            except StatusError as error:
                # As the apiserver's watch cache: a watch that cannot start (a resourceVersion
                # too old for the log) is established anyway and ends with the ERROR event.
                started, failed = False, error
            await self.response.prepare(self.request)
            resource = self.shape.resource
            self.ctx.metrics.watchers.labels(resource=resource).inc()
            try:
                if failed is not None:
                    raise failed
                if started is None:  # the cache has not reached the RV: wait, answer begun
                    started = await self._begin(initial, wait=True)
                if started and await self._send_initial(initial):
                    await self._follow()
                if self.options.allow_watch_bookmarks and self.position_rv and not self.revoked:
                    await self._bookmark()  # at the deadline: the client resumes from a fresh RV
                await self.response.write_eof()
            except StatusError as error:
                await self._error(error)
            except LogTrimmed:
                await self._error(
                    StatusError.expired("the watch fell behind the retained event log; relist")
                )
            except (SlowClient, ConnectionError) as error:
                reason = "slow" if isinstance(error, SlowClient) else "disconnected"
                self.ctx.metrics.client_errors.labels(reason=reason).inc()
                logger.debug("watch of %s: the client left or stopped reading", resource)
                cut(self.request)  # the client resumes from its last RV
            except Exception as error:
                # The stream has begun: a failure (a reader error) can only end it, with an
                # ERROR event as the apiserver's watch does, never with a second response.
                logger.exception("watch of %s failed", resource)
                await self._error(StatusError.internal_error(error))
            finally:
                self.ctx.metrics.watchers.labels(resource=resource).dec()
        return self.response

    async def _begin(self, initial: contextlib.AsyncExitStack, *, wait: bool) -> bool | None:
        """Position the cursor; for an initial state, open its snapshot (held by ``initial``
        until :meth:`_send_initial` has sent it).

        Without ``wait`` (before the answer begins) None when the cache has not reached the
        requested RV yet: the apiserver too answers such a watch at once and waits inside it.
        False when the watch ended before it could start (its deadline passed while it waited
        for the cache to reach its RV)."""
        start = self.start
        if start.kind is WatchStartKind.FROM_RESOURCE_VERSION:
            assert start.resource_version is not None
            while True:
                seen = self.shape.log.last_seq  # before looking: no commit slips in between
                try:
                    self.cursor = await self.ctx.store.position(self.shape, start.resource_version)
                    break
                except TooNew:
                    # As the apiserver's watch cache: no error, the watch waits for the RV and
                    # then sends what follows it.
                    if not wait:
                        return None
                    if not await self._wait_idle(seen):
                        return False
            self.position_rv = start.resource_version
            return True
        if start.resource_version is not None:
            reached = versions.compare(self.shape.rv or "", start.resource_version) in (0, 1)
            if not wait and not reached:
                return None
            await wait_for_rv(self.ctx, self.shape, start.resource_version)
        if start.kind is WatchStartKind.FROM_NOW:
            self.cursor, self.position_rv = self.shape.log.last_seq, self.shape.rv or ""
            return True
        self._snapshot = await initial.enter_async_context(
            self.ctx.store.snapshot(self.shape, namespace=self.view.namespace)
        )
        self.cursor, self.position_rv = self._snapshot.last_seq, self._snapshot.rv
        return True

    async def _send_initial(self, initial: contextlib.AsyncExitStack) -> bool:
        """The initial state (when the watch has one) as ADDED events, then its snapshot and
        slot are given back; then the initial-events-end bookmark where it is asked for.

        False when the watch's deadline came first: the apiserver's watch timeout covers its
        initial events too, and here it also bounds how long the snapshot — a read
        transaction, which keeps the WAL from being checkpointed past it — is held. The
        stream then ends without a bookmark: the client has not reached any RV."""
        snapshot, self._snapshot = self._snapshot, None
        if snapshot is not None:
            pieces = Pieces(self._write)
            events_out = self.ctx.metrics.events_out.labels(resource=self.shape.resource)
            try:
                async with asyncio.timeout(max(self.deadline - time.monotonic(), 0.0)):
                    async for rows in snapshot.rows:
                        sent = 0
                        for namespace, name, labels, raw in rows:
                            if self.view.is_everything or self.view.admits(
                                namespace=namespace, name=name, labels=labels
                            ):
                                await pieces.add(self.renderer.event(ChangeType.ADDED, raw))
                                sent += 1
                        events_out.inc(sent)
                    await pieces.flush()
            except TimeoutError:
                self.position_rv = ""
                return False
        await initial.aclose()
        if self.start.initial_events_end_bookmark:
            await self._bookmark(initial_events_end=True)
        return True

    async def _wait_idle(self, seq: int) -> bool:
        """Wait for log entries after ``seq`` (at most ``idle_check``); False when the watch
        should end: deadline passed, shape closed, client gone."""
        now = time.monotonic()
        if now >= self.deadline or self.shape.log.closed:
            return False
        if self.request.transport is None or self.request.transport.is_closing():
            return False
        wait = min(self.deadline - now, self.ctx.settings.idle_check)
        await self.shape.log.wait_beyond(seq, timeout=wait)
        return True

    async def _still_allowed(self) -> bool:
        """False (and the watch is marked revoked) once the client's grant no longer holds."""
        if self.grant is not None and not await self.grant.holds():
            logger.info(
                "watch of %s by %s ended: access revoked",
                self.shape.resource,
                self.grant.user.username,
            )
            self.revoked = True
        return not self.revoked

    def _sent(self, count: int, newest: EventRecord) -> None:
        if count:
            self._events_out.inc(count)
            # Commit to written, for the newest of the batch (the oldest lag more).
            self._delivery_lag.observe(max(time.time() - newest.at, 0.0))

    async def _follow(self) -> None:
        settings = self.ctx.settings
        next_bookmark = time.monotonic() + settings.bookmark_interval
        view, frames = self.view, self._frames
        recheck = self.grant.delegation.settings.allow_ttl if self.grant is not None else math.inf
        next_recheck = time.monotonic() + recheck
        while True:
            now = time.monotonic()
            if now >= self.deadline:
                return
            if now >= next_recheck:
                if not await self._still_allowed():
                    return
                next_recheck = time.monotonic() + recheck
            records = await self.ctx.store.read_events(
                self.shape,
                after=self.cursor,
                limit=settings.event_batch,
                max_bytes=settings.event_batch_bytes,
            )
            if records:
                pieces = Pieces(self._write)
                sent = 0
                for record in records:
                    event_type = view.event_type(record)
                    if event_type is not None:
                        await pieces.add(frames.event(record, event_type))
                        sent += 1
                    self.cursor, self.position_rv = record.seq, record.rv
                await pieces.flush()
                self._sent(sent, records[-1])
                continue
            now = time.monotonic()
            if now >= self.deadline or self.shape.log.closed:
                return
            if self.options.allow_watch_bookmarks and now >= next_bookmark:
                await self._bookmark()
                next_bookmark = now + settings.bookmark_interval
            if self.request.transport is None or self.request.transport.is_closing():
                return
            wait = min(self.deadline, next_bookmark, next_recheck, now + settings.idle_check) - now
            await self._park(max(wait, 0.0))

    async def _park(self, timeout: float) -> None:
        """Wait at most ``timeout`` as the log's follower: what is committed meanwhile is
        written by :meth:`offer` where it can be, and otherwise :meth:`wake` ends the wait."""
        log = self.shape.log
        self._woken = woken = asyncio.get_running_loop().create_future()
        if not log.park(self, cursor=self.cursor):
            return  # something is already committed after the cursor: read it
        try:
            async with asyncio.timeout(timeout):
                await woken
        except TimeoutError:
            pass
        finally:
            log.unpark(self)
            self._woken = None

    def wake(self) -> None:
        if self._woken is not None and not self._woken.done():
            self._woken.set_result(None)

    def offer(self, records: Sequence[EventRecord]) -> bool:
        """``tailing.Follower.offer``: while parked, the records that follow the cursor are
        written at once when the client's socket takes them without waiting (it is keeping
        up); otherwise False, and the watch writes them itself, with its write deadline."""
        if records[0].seq != self.cursor + 1:
            return False
        data, count = self._frames.batch(records, self.view)
        if count and not write_now(self.response, data, transport=self.request.transport):
            return False
        self.cursor, self.position_rv = records[-1].seq, records[-1].rv
        self._sent(count, records[-1])
        return True
