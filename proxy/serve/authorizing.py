"""Authorizing reads served from the cache in ``--client-auth delegated`` (docs/design.md §6).

Only reads the cache answers need warmwatch's decision; everything passed through carries the
client's own credentials and the apiserver decides it. A cached read is decided as the
apiserver's filters would decide the same request:

- the bearer token is read as the apiserver's bearer-token authenticator reads it; a request
  without one (anonymous, or other credentials) or with ``Impersonate-*`` headers is passed
  through whole, so the apiserver applies its own anonymous, impersonation and
  authentication rules to it — exactly its answer, at no cost for the cache;
- the attributes are the apiserver's ``RequestInfo``: verb ``list`` or ``watch`` (decided
  before the query is validated, so a bad query of a client that may not read gets 403, not
  400, as from the apiserver), ``name`` when the field selector pins ``metadata.name``, the
  label and field selectors as given (``AuthorizeWithSelectors``);
- an open watch is authorized again every allow-TTL; when the answer turns to no, its stream
  ends and the client's relist gets the 403;
- a client (its remote address: a flood of junk brings a new token each time, so the token
  cannot tell clients apart) that needs more TokenReviews than its budget gets the
  apiserver's 429 (``limiting.too_many_requests``), counted as
  ``warmwatch_rejected_total{limit="token_reviews"}``; see ``upstream.delegating``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aiohttp import web

from proxy.kube.gocompat import parse_query
from proxy.kube.options import ListOptions, decode_list_options, first_values, parse_bool
from proxy.kube.resources import RequestPath
from proxy.kube.status import StatusError
from proxy.serve.limiting import LimitReached
from proxy.upstream.delegating import Delegation, TooManyReviews
from proxy.upstream.reviewing import AccessAttributes, UserInfo

__all__ = [
    "Grant",
    "access_attributes",
    "authenticate",
    "bearer_token",
    "grant",
    "impersonates",
]


def bearer_token(request: web.BaseRequest) -> str | None:
    """The bearer token as the apiserver's authenticator takes it (``Authorization`` trimmed,
    split on single spaces, the second field), or None when there is none."""
    header = request.headers.get("Authorization", "").strip()
    parts = header.split(" ", 2)
    if len(parts) < 2 or parts[0].lower() != "bearer" or not parts[1]:
        return None
    return parts[1]


def impersonates(request: web.BaseRequest) -> bool:
    return any(name.lower().startswith("impersonate-") for name in request.headers)


def _valid_path_segment_name(name: str) -> bool:
    """apimachinery's ``IsValidPathSegmentName``."""
    return name not in (".", "..") and "/" not in name and "%" not in name


def access_attributes(path: RequestPath, raw_query: str) -> AccessAttributes:
    """The attributes the apiserver authorizes a collection GET at ``path`` with."""
    query = parse_query(raw_query)
    values = first_values(query)
    try:
        options: ListOptions | None = decode_list_options(query, watch_path=path.is_watch_path)
    except StatusError:
        # As the apiserver: an undecodable query is a list, or a watch when "watch" is
        # anything but false/0, and has no selectors.
        options = None
    name = ""
    if path.is_watch_path:
        verb = "watch"  # the /watch/ prefix decides alone
    elif options is None:
        verb = "watch" if "watch" in values and parse_bool(values["watch"]) else "list"
    else:
        verb = "watch" if options.watch else "list"
        pinned = options.field_selector.requires_exact_match("metadata.name")
        if pinned is not None and _valid_path_segment_name(pinned):
            name = pinned
    return AccessAttributes(
        verb=verb,
        group=path.gvr.group,
        version=path.gvr.version,
        resource=path.gvr.resource,
        namespace=path.namespace or "",
        name=name,
        label_selector=values.get("labelSelector", "") if options else "",
        field_selector=values.get("fieldSelector", "") if options else "",
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Grant:
    """A cached read a client was allowed; an open watch asks :meth:`holds` again."""

    delegation: Delegation
    token: str
    user: UserInfo
    attributes: AccessAttributes

    async def holds(self) -> bool:
        """Still authenticated and allowed (cached decisions count, see ``remembering``)."""
        try:
            # Charged to nobody: the token was accepted when the watch began.
            user = await self.delegation.authenticate(self.token, client=None)
            await self.delegation.authorize(user, self.attributes)
        except StatusError:
            return False
        return True


async def authenticate(request: web.BaseRequest, delegation: Delegation, token: str) -> UserInfo:
    """``token``'s identity, any TokenReview charged to the request's remote address; a
    StatusError when refused, :class:`LimitReached` (``token_reviews``) over the budget."""
    try:
        return await delegation.authenticate(token, client=request.remote or "")
    except TooManyReviews:
        raise LimitReached("token_reviews") from None


async def grant(
    request: web.BaseRequest,
    delegation: Delegation,
    attributes: AccessAttributes,
    *,
    implied_by: Sequence[AccessAttributes] = (),
) -> Grant | None:
    """Authenticate and authorize a read the cache would answer. None: pass it through (no
    bearer token, or impersonation); a StatusError when it is refused, LimitReached over the
    TokenReview budget. ``implied_by``: see ``Delegation.authorize``."""
    token = bearer_token(request)
    if token is None or impersonates(request):
        return None
    user = await authenticate(request, delegation, token)
    await delegation.authorize(user, attributes, implied_by=implied_by)
    return Grant(delegation=delegation, token=token, user=user, attributes=attributes)
