"""Asking the apiserver who a client is and what it may do (docs/design.md §6).

- :func:`review_token`: a ``TokenReview`` (authentication.k8s.io/v1) of a client's bearer
  token, with the apiserver's own audiences (none given), as the apiserver's delegating
  authenticator sends it, or for audiences of warmwatch's own (a peer's seeding token);
- :func:`review_access`: a ``SubjectAccessReview`` (authorization.k8s.io/v1) of a user,
  groups, uid and extra for one request's resource attributes — the attributes the
  apiserver's authorization filter gives its authorizers, selectors included
  (``AuthorizeWithSelectors``: RBAC ignores them, a webhook authorizer may not);
- :func:`who_am_i`: a ``SelfSubjectReview`` (authentication.k8s.io/v1) with warmwatch's own
  credentials or with a given token.

All of them are sent with warmwatch's own credentials except ``who_am_i(token=...)``, which
sends only that token. Failures are the upstream layer's errors (``UpstreamUnavailable``,
``UpstreamStatusError``, ``UpstreamProtocolError``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

from proxy.upstream.connecting import Upstream
from proxy.upstream.errors import UpstreamError, UpstreamProtocolError, UpstreamStatusError
from proxy.upstream.resilience import CircuitBreaker, check_reachable

__all__ = [
    "AccessAttributes",
    "AccessVerdict",
    "IdentityMismatch",
    "UserInfo",
    "check_same_identity",
    "review_access",
    "review_token",
    "who_am_i",
]

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
SELF_SUBJECT_REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
SUBJECT_ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


class UserInfoPayload(TypedDict, total=False):
    username: str
    uid: str
    groups: list[str]
    extra: dict[str, list[str]]


class SelectorPayload(TypedDict):
    rawSelector: str


class ResourceAttributesPayload(TypedDict):
    namespace: str
    verb: str
    group: str
    version: str
    resource: str
    name: NotRequired[str]
    labelSelector: NotRequired[SelectorPayload]
    fieldSelector: NotRequired[SelectorPayload]


class IdentityMismatch(UpstreamError):
    """Two credentials that must belong to one identity do not (``token-file`` mode)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class UserInfo:
    """An authenticated identity, as a TokenReview or SelfSubjectReview reports it."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Sorted by key; values in the order given."""

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> UserInfo:
        extra = payload.get("extra") or {}
        return cls(
            username=str(payload.get("username") or ""),
            uid=str(payload.get("uid") or ""),
            groups=tuple(str(g) for g in payload.get("groups") or ()),
            extra=tuple(
                sorted((str(k), tuple(str(v) for v in vs or ())) for k, vs in extra.items())
            ),
        )

    def to_payload(self) -> UserInfoPayload:
        out: UserInfoPayload = {"username": self.username}
        if self.uid:
            out["uid"] = self.uid
        if self.groups:
            out["groups"] = list(self.groups)
        if self.extra:
            out["extra"] = {key: list(values) for key, values in self.extra}
        return out

    def key_parts(self) -> tuple[str, ...]:
        """Every field, for a decision key."""
        parts = [self.username, self.uid, str(len(self.groups)), *self.groups]
        for key, values in self.extra:
            parts += [key, str(len(values)), *values]
        return tuple(parts)


@dataclass(frozen=True, kw_only=True, slots=True)
class AccessAttributes:
    """A resource request's authorization attributes (the apiserver's ``RequestInfo``)."""

    verb: str
    group: str
    version: str
    resource: str
    namespace: str = ""
    name: str = ""
    label_selector: str = ""
    field_selector: str = ""

    def to_payload(self) -> ResourceAttributesPayload:
        out: ResourceAttributesPayload = {
            "namespace": self.namespace,
            "verb": self.verb,
            "group": self.group,
            "version": self.version,
            "resource": self.resource,
        }
        if self.name:
            out["name"] = self.name
        if self.label_selector:
            out["labelSelector"] = {"rawSelector": self.label_selector}
        if self.field_selector:
            out["fieldSelector"] = {"rawSelector": self.field_selector}
        return out

    def key_parts(self) -> tuple[str, ...]:
        return (
            self.verb,
            self.group,
            self.version,
            self.resource,
            self.namespace,
            self.name,
            self.label_selector,
            self.field_selector,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class AccessVerdict:
    allowed: bool
    reason: str = ""
    """The authorizers' reason, as the apiserver appends it to its 403 message."""


def _status(answer: Mapping[str, Any], what: str) -> Mapping[str, Any]:
    status = answer.get("status")
    if not isinstance(status, Mapping):
        raise UpstreamProtocolError(f"{what} answer has no status")
    return status


async def review_token(
    upstream: Upstream,
    token: str,
    *,
    breaker: CircuitBreaker | None = None,
    audiences: Sequence[str] = (),
) -> UserInfo | None:
    """The identity ``token`` authenticates as, or None when the apiserver does not accept
    it. With ``audiences``, the token must be valid for one of them (the apiserver checks it
    and answers the ones it is valid for in ``status.audiences``)."""
    check_reachable(breaker)
    spec: dict[str, Any] = {"token": token}
    if audiences:
        spec["audiences"] = list(audiences)
    answer = await upstream.json_request(
        "POST",
        TOKEN_REVIEWS,
        json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec},
        purpose="review",
        verb="TOKENREVIEW",
    )
    status = _status(answer, "TokenReview")
    if not status.get("authenticated"):
        return None
    if audiences and not set(audiences) & set(status.get("audiences") or ()):
        return None  # (an authenticator that ignores audiences must not pass for one that checks)
    user = status.get("user")
    if not isinstance(user, Mapping) or not user.get("username"):
        raise UpstreamProtocolError("TokenReview authenticated a token without a user")
    return UserInfo.from_payload(user)


async def review_access(
    upstream: Upstream,
    user: UserInfo,
    attributes: AccessAttributes,
    *,
    breaker: CircuitBreaker | None = None,
) -> AccessVerdict:
    """May ``user`` do ``attributes``? Denied and no-opinion are both not allowed, as for the
    apiserver."""
    check_reachable(breaker)
    spec: dict[str, Any] = dict(user.to_payload())
    spec.pop("username")
    spec["user"] = user.username
    spec["resourceAttributes"] = attributes.to_payload()
    answer = await upstream.json_request(
        "POST",
        SUBJECT_ACCESS_REVIEWS,
        json={
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": spec,
        },
        purpose="review",
        verb="SUBJECTACCESSREVIEW",
    )
    status = _status(answer, "SubjectAccessReview")
    return AccessVerdict(
        allowed=bool(status.get("allowed")) and not status.get("denied"),
        reason=str(status.get("reason") or ""),
    )


async def who_am_i(upstream: Upstream, *, token: str | None = None) -> UserInfo:
    """The identity of warmwatch's own credentials, or of ``token`` (sent alone)."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else None
    answer = await upstream.json_request(
        "POST",
        SELF_SUBJECT_REVIEWS,
        json={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        headers=headers,
        credentials="client" if token is not None else "sidecar",
        purpose="review",
        verb="SELFSUBJECTREVIEW",
    )
    user = _status(answer, "SelfSubjectReview").get("userInfo")
    if not isinstance(user, Mapping):
        raise UpstreamProtocolError("SelfSubjectReview answer has no userInfo")
    return UserInfo.from_payload(user)


async def check_same_identity(upstream: Upstream, token: str) -> UserInfo:
    """Raise :class:`IdentityMismatch` unless ``token`` authenticates as the same user (name
    and uid) as warmwatch's own credentials; return that identity. Other failures (the
    apiserver unreachable) are raised as they are: the check could not be made."""
    mine = await who_am_i(upstream)
    try:
        theirs = await who_am_i(upstream, token=token)
    except UpstreamStatusError as error:
        if error.code == 401:
            raise IdentityMismatch("the apiserver does not accept the token") from error
        raise
    if (theirs.username, theirs.uid) != (mine.username, mine.uid):
        raise IdentityMismatch(
            f"the token is {theirs.username!r}, warmwatch's upstream identity is "
            f"{mine.username!r}; with --client-auth token-file clients act as warmwatch, "
            "so both must be one identity (use --client-auth delegated for clients of "
            "their own)"
        )
    return mine
