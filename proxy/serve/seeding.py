"""``GET /seed`` on the seeding listener (``--seed-listen``, TLS): the cache's snapshot, for
a peer of warmwatch's own service account (docs/design.md §3, peer seeding; the fetching
side is ``upstream.seeding``, the binding of both tokens to the connection
``upstream.binding``).

The snapshot holds everything warmwatch's account can read, Secrets included, so it is
answered only:

- over TLS, with a self-signed certificate (nobody verifies it by name; the tokens are
  bound to it);
- to a bearer token that a TokenReview for ``binding.peer_audience`` of this listener's own
  certificate authenticates as the user (name and uid) of warmwatch's own upstream
  credentials (a SelfSubjectReview, asked once): a token made for another listener (one a
  man in the middle captured) is not accepted. No token, or one the apiserver does not
  accept for that audience: 401; any other identity: 403; the apiserver unreachable: 503;
- within :data:`REVIEW_RATE` requests a second per client address (:data:`REVIEW_BURST` at
  once; else 429 before any review): the listener is on the pod network, and each request
  with a token costs the apiserver a TokenReview;
- one at a time (a second request meanwhile: 429), from a database whose cluster identity
  is recorded (``snapshotting.CLUSTER_KEY``; else 503: a peer could not tell it from another
  cluster's).

The answer: a token of warmwatch's own service account for ``binding.reply_audience`` of the
requester's token (``binding.REPLY_HEADER``: the requester checks it before reading on, so
an impostor cannot pass its snapshot for ours); ``VACUUM INTO`` a private file beside the
database, its SHA-256 in ``upstream.seeding.DIGEST_HEADER`` and its length, its bytes, then
the file is deleted. The send is bounded like the peer's whole seeding
(``SeedSettings.bound``).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web

from proxy.cache.store import Store
from proxy.kube.gocompat import go_quote
from proxy.kube.status import StatusError
from proxy.serve.answers import status_response
from proxy.serve.authorizing import bearer_token
from proxy.serve.streaming import cut
from proxy.upstream.binding import (
    REPLY_HEADER,
    ServiceAccount,
    peer_audience,
    reply_audience,
    request_token,
)
from proxy.upstream.connecting import Upstream
from proxy.upstream.errors import UpstreamError
from proxy.upstream.resilience import CircuitBreaker, RateBuckets
from proxy.upstream.reviewing import UserInfo, review_token, who_am_i
from proxy.upstream.seeding import CHUNK, DIGEST_HEADER, SeedSettings

logger = logging.getLogger(__name__)

REVIEW_RATE: Final = 1.0
REVIEW_BURST: Final = 10
"""Requests with a token per second, and at once, from one address. A peer asks once per
start (a few times when it retries), so this never limits a real one; anyone else on the pod
network can spend at most this much of warmwatch's share of the apiserver on TokenReviews."""

Reviewer = Callable[[str], Awaitable[UserInfo | None]]
"""A token's identity for ``binding.peer_audience`` of this listener's certificate (a
TokenReview), None when not accepted."""

Identity = Callable[[], Awaitable[UserInfo]]
"""warmwatch's own upstream identity (a SelfSubjectReview)."""


async def check_requester(token: str | None, *, review: Reviewer, own: Identity) -> UserInfo:
    """The requester's identity when it is warmwatch's own; else the apiserver's Status
    (401 without an accepted token, 403 for another identity, 503 when it cannot be asked)."""
    if token is None:
        raise StatusError.unauthorized()
    try:
        theirs = await review(token)
        if theirs is None:
            raise StatusError.unauthorized()
        mine = await own()
    except UpstreamError as error:
        raise StatusError.service_unavailable(
            f"cannot review the token: {error}", retry_after_seconds=1
        ) from error
    if (theirs.username, theirs.uid) != (mine.username, mine.uid):
        raise StatusError.forbidden(
            group="",
            resource="",
            reason=f"User {go_quote(theirs.username)} is not warmwatch's own identity, the "
            "only one its cache's snapshot is served to",
        )
    return theirs


class SnapshotServer:
    """The ``/seed`` handler; answers 503 until :meth:`bind` gives it the cache."""

    def __init__(self, *, settings: SeedSettings, certificate: bytes) -> None:
        self.settings = settings
        self.audience = peer_audience(hashlib.sha256(certificate).hexdigest())
        """What a requester's token must be for: this listener's own certificate (DER)."""
        self._serving = asyncio.Lock()
        self._reviews = RateBuckets(rate=REVIEW_RATE, burst=REVIEW_BURST)
        self._store: Store | None = None
        self._review: Reviewer | None = None
        self._own: UserInfo | None = None
        self._upstream: Upstream | None = None

    def bind(self, *, store: Store, upstream: Upstream, breaker: CircuitBreaker) -> None:
        self._store = store
        self._upstream = upstream

        async def review(token: str) -> UserInfo | None:
            return await review_token(upstream, token, breaker=breaker, audiences=(self.audience,))

        self._review = review

    async def _own_identity(self) -> UserInfo:
        """warmwatch's own identity, asked once (it does not change while it runs)."""
        if self._own is None:
            assert self._upstream is not None
            self._own = await who_am_i(self._upstream)
        return self._own

    async def _reply(self, token: str) -> str:
        """A token of warmwatch's own service account for the request that carried
        ``token`` (``binding.reply_audience``); 503 when none can be had."""
        assert self._upstream is not None
        account = ServiceAccount.of(await self._own_identity())
        if account is None:
            raise StatusError.service_unavailable(
                "warmwatch's identity is not a service account: it cannot prove itself to a peer"
            )
        try:
            return await request_token(
                self._upstream, account=account, audience=reply_audience(token)
            )
        except UpstreamError as error:
            raise StatusError.service_unavailable(
                f"cannot request a token to prove this warmwatch to the peer: {error}",
                retry_after_seconds=1,
            ) from error

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._answer(request)
        except StatusError as error:
            return status_response(error)

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        store, review = self._store, self._review
        if store is None or review is None:
            raise StatusError.service_unavailable("warmwatch is starting", retry_after_seconds=1)
        token = bearer_token(request)
        if token is not None and not self._reviews.take(request.remote or ""):
            raise StatusError.too_many_requests(
                "too many seeding requests from this address", retry_after_seconds=1
            )
        await check_requester(token, review=review, own=self._own_identity)
        assert token is not None
        if self._serving.locked():
            raise StatusError.too_many_requests(
                "a snapshot is being sent; one at a time", retry_after_seconds=5
            )
        async with self._serving:
            if await store.cluster_identity() is None:
                raise StatusError.service_unavailable(
                    "the cluster's identity (the kube-system namespace uid) is not recorded; "
                    "a snapshot is not offered without it"
                )
            reply = await self._reply(token)
            target = store.settings.path.with_name(f"{store.settings.path.name}.seed-out")
            try:
                await store.copy_into(target)
                snapshot = await asyncio.to_thread(target.open, "rb")
            finally:
                # Gone before the answer starts: the open file stays readable, and a crash
                # while sending leaves nothing behind.
                target.unlink(missing_ok=True)
            with snapshot:
                return await self._send(request, snapshot, reply=reply)

    async def _send(
        self, request: web.Request, snapshot: io.BufferedReader, *, reply: str
    ) -> web.StreamResponse:
        size, digest = await asyncio.to_thread(_measure, snapshot)
        response = web.StreamResponse(
            headers={
                "Content-Type": "application/vnd.sqlite3",
                DIGEST_HEADER: digest,
                REPLY_HEADER: reply,
            }
        )
        response.content_length = size
        try:
            async with asyncio.timeout(self.settings.bound(size)):
                await response.prepare(request)
                while chunk := await asyncio.to_thread(snapshot.read, CHUNK):
                    await response.write(chunk)
                await response.write_eof()
        except TimeoutError:
            logger.warning("a snapshot to %s was not taken within its bound; cut", request.remote)
            cut(request)
            return response
        logger.info("sent a snapshot of %d bytes to %s", size, request.remote)
        return response


def _measure(source: io.BufferedReader) -> tuple[int, str]:
    """The open file's size and SHA-256 (hex); read from its start again after."""
    digest = hashlib.file_digest(source, "sha256").hexdigest()
    source.seek(0)
    return os.fstat(source.fileno()).st_size, digest
