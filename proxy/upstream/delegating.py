"""``--client-auth delegated``: the apiserver decides who a client is and what it may read
from the cache (docs/design.md §6).

A client's bearer token is authenticated with a TokenReview, and each cached read is
authorized with a SubjectAccessReview for the identity the review returned, both through
:class:`~proxy.upstream.remembering.Decisions` (TTLs, hashed keys, single flight, the
offline window). Answers, as the apiserver's:

- token not accepted: 401 ``Unauthorized``;
- not allowed: 403 with the apiserver's message (``User "u" cannot list resource ...``);
- the apiserver cannot be reached (or answers reviews with 429 / 5xx) and nothing was
  decided within the offline window: 503 with ``Retry-After: 1`` (client-go retries,
  informers back off and relist);
- a review refused or malformed (warmwatch lacks ``tokenreviews/create`` or
  ``subjectaccessreviews/create``, say): 500, as the apiserver answers when its authorizer
  fails;
- a client (a remote address) that wants more TokenReviews than its budget allows:
  :class:`TooManyReviews`, which the serving layer answers with the apiserver's 429.

TokenReviews are sent with warmwatch's own identity, so a flood of random bearer tokens
would spend warmwatch's share of the apiserver (its priority and fairness) and fill the
decision cache. Two things keep it harmless: refused tokens are remembered apart from
accepted ones (``remembering``), and each client address has a token bucket of reviews
(``review_rate``, ``review_burst``). A review is charged only when one is sent for an
unknown token: a decision still fresh, a review in flight that the request joins, and the
renewal of a token the cache holds as accepted (at most one per TTL and token, whoever
sends it) cost nothing, so a client whose token was accepted is never limited by a flood
from its own address.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from proxy.kube.status import StatusError
from proxy.metrics import Metrics
from proxy.upstream.connecting import Upstream
from proxy.upstream.errors import (
    UpstreamBusy,
    UpstreamError,
    UpstreamStatusError,
    UpstreamUnavailable,
)
from proxy.upstream.remembering import Decisions, digest
from proxy.upstream.resilience import CircuitBreaker, RateBuckets
from proxy.upstream.reviewing import (
    AccessAttributes,
    AccessVerdict,
    UserInfo,
    review_access,
    review_token,
)

__all__ = ["Delegation", "DelegationSettings", "TooManyReviews"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class DelegationSettings:
    token_ttl: float = 10.0
    """How long a TokenReview's answer (accepted or not) is reused: 10 s, the apiserver's
    delegating authenticator's ``CacheTTL`` for both (kube-rbac-proxy keeps 2 min). A
    deleted service account or revoked token stops working within this."""
    allow_ttl: float = 10.0
    """How long an allowed SubjectAccessReview is reused, and how often an open cached watch
    is authorized again: 10 s, the apiserver's delegating authorizer's ``AllowCacheTTL``
    (kube-rbac-proxy: 5 min). Revoked access ends within this."""
    deny_ttl: float = 10.0
    """How long a denial is reused: 10 s, the apiserver's ``DenyCacheTTL`` (kube-rbac-proxy:
    30 s). A new grant takes effect within this."""
    offline_window: float = 300.0
    """While the apiserver cannot be reached, a decision made within this long still holds;
    anything older or never decided is refused (503). Five minutes lets a controller that
    restarts during a short outage read from the cache; the price is that a revocation
    made during the outage goes unnoticed for at most this long (nothing new reaches the
    cache meanwhile: it only serves what the identity could read when last asked)."""
    max_entries: int = 10_000
    """Positive decisions (accepted tokens, allowed requests) kept per kind at most: far
    more identities and requests than the clients of one warmwatch use, and bounded so that
    memory is (a few hundred bytes each)."""
    max_per_identity: int = 1_000
    """Allowed requests kept per identity at most (its own oldest go first). A controller
    asks for a few per informer — kube-controller-manager about 150 (list and watch of every
    resource type) — but a client can make any number, each with new attributes (a random
    label selector is a new SubjectAccessReview): bounded per identity, one client's cannot
    push out the decisions others rely on while the apiserver is away."""
    max_refused: int = 1_000
    """Negative decisions (refused tokens, denied requests) kept per kind at most, apart
    from the positive ones. They only spare the apiserver the same review again within the
    TTL (a client retrying with a bad token); anyone can make them in any number, so they
    get the smaller bound and can never push out a positive decision."""
    review_rate: float = 10.0
    """TokenReviews per second each client address may cause, for tokens warmwatch does not
    know (see the module docstring). Far above what real clients need — a token is reviewed
    when first seen, service-account tokens rotate about hourly — and it holds a flood of
    random tokens to a few per second instead of the ~1,000/s one address could send."""
    review_burst: int = 100
    """TokenReviews an address may cause at once before ``review_rate`` applies: a
    kube-controller-manager with ``--use-service-account-credentials`` starts about 40
    controllers, each with its own token, from one address at once."""

    def __post_init__(self) -> None:
        if not self.review_rate > 0 or self.review_burst < 1:
            raise ValueError("--auth-review-rate and --auth-review-burst must be positive")


class TooManyReviews(Exception):
    """The client's TokenReview budget is spent (``DelegationSettings.review_rate``)."""


class Delegation:
    """Authenticates tokens and authorizes cached reads through the apiserver."""

    def __init__(
        self,
        *,
        upstream: Upstream,
        settings: DelegationSettings,
        metrics: Metrics,
        breaker: CircuitBreaker | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.upstream = upstream
        self.settings = settings
        self.metrics = metrics
        self.breaker = breaker
        self.tokens: Decisions[UserInfo | None] = Decisions(
            name="TokenReview",
            positive_ttl=settings.token_ttl,
            negative_ttl=settings.token_ttl,
            offline_window=settings.offline_window,
            max_entries=settings.max_entries,
            max_negative=settings.max_refused,
            positive=lambda user: user is not None,
            outage=is_outage,
            clock=clock,
        )
        self.access: Decisions[AccessVerdict] = Decisions(
            name="SubjectAccessReview",
            positive_ttl=settings.allow_ttl,
            negative_ttl=settings.deny_ttl,
            offline_window=settings.offline_window,
            max_entries=settings.max_entries,
            max_negative=settings.max_refused,
            max_per_owner=settings.max_per_identity,
            positive=lambda verdict: verdict.allowed,
            outage=is_outage,
            clock=clock,
        )
        self.review_budget = RateBuckets(
            rate=settings.review_rate, burst=settings.review_burst, clock=clock
        )

    async def authenticate(self, token: str, *, client: str | None) -> UserInfo:
        """The token's identity; a StatusError (401, 503, 500) otherwise, or
        :class:`TooManyReviews` when a review is needed and ``client``'s budget is spent
        (None: charged to nobody, for a token accepted before)."""
        key = digest(token)

        async def review() -> UserInfo | None:
            self.metrics.client_auth_reviews.labels(kind="token").inc()
            return await review_token(self.upstream, token, breaker=self.breaker)

        def admit() -> None:
            if client is None or self.tokens.known_positive(key):
                return
            if not self.review_budget.take(client):
                raise TooManyReviews(client)

        try:
            user = await self.tokens.decide(key, review, admit=admit)
        except UpstreamError as error:
            raise _failed("authenticate the client", error) from error
        if user is None:
            raise StatusError.unauthorized()
        return user

    async def authorize(
        self,
        user: UserInfo,
        attributes: AccessAttributes,
        *,
        implied_by: Sequence[AccessAttributes] = (),
    ) -> None:
        """Return when ``user`` may do ``attributes``; a StatusError (403, 503, 500)
        otherwise. ``implied_by``: requests whose permission includes this one's (the caller
        says why); while the apiserver cannot be asked and nothing is held for
        ``attributes``, an allowed decision held for one of them within the offline window
        allows it."""

        async def review() -> AccessVerdict:
            self.metrics.client_auth_reviews.labels(kind="access").inc()
            return await review_access(self.upstream, user, attributes, breaker=self.breaker)

        try:
            verdict = await self.access.decide(
                _access_key(user, attributes), review, owner=digest(*user.key_parts())
            )
        except UpstreamError as error:
            if is_outage(error) and self._held_allowed(user, implied_by):
                return
            raise _failed("authorize the request", error) from error
        if not verdict.allowed:
            raise StatusError.forbidden_request(
                user=user.username,
                verb=attributes.verb,
                group=attributes.group,
                resource=attributes.resource,
                namespace=attributes.namespace,
                name=attributes.name,
                reason=verdict.reason,
            )

    def _held_allowed(self, user: UserInfo, requests: Sequence[AccessAttributes]) -> bool:
        """``user`` was allowed one of ``requests`` within the offline window."""
        for attributes in requests:
            held = self.access.held(_access_key(user, attributes))
            if held is not None and held.value.allowed:
                return True
        return False

    async def close(self) -> None:
        await self.tokens.close()
        await self.access.close()


def _access_key(user: UserInfo, attributes: AccessAttributes) -> bytes:
    return digest(*user.key_parts(), "\x00", *attributes.key_parts())


def is_outage(error: BaseException) -> bool:
    """The apiserver cannot review now: unreachable (or the breaker open), or answering
    429 / 5xx. Then decisions within the offline window hold; a refusal of the review itself
    (403: warmwatch lacks the RBAC for reviews) is no outage."""
    if isinstance(error, UpstreamUnavailable):
        return True
    return isinstance(error, UpstreamStatusError) and (error.code == 429 or error.code >= 500)


def _failed(what: str, error: UpstreamError) -> StatusError:
    if isinstance(error, UpstreamBusy):
        return StatusError.too_many_requests(
            f"warmwatch cannot {what} now: {error}", retry_after_seconds=1
        )
    if is_outage(error):
        return StatusError.service_unavailable(
            f"warmwatch cannot {what}: {error}", retry_after_seconds=1
        )
    logger.error("Cannot %s: %s", what, error)
    return StatusError.internal_error(f"warmwatch cannot {what}: {error}")
