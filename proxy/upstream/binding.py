"""Seeding tokens bound to their channel, both ways (docs/design.md §3, peer seeding).

A peer's seeding listener serves TLS with a self-signed certificate, which nobody can verify
by name. Instead each side proves, through the apiserver, that it is warmwatch's own service
account *on this very connection*:

- the requester, having seen the peer's certificate in the TLS handshake, asks the apiserver
  (TokenRequest) for a token of its own service account for :func:`peer_audience` of that
  certificate's SHA-256, and sends it only over a connection pinned to that certificate. The
  peer accepts it only when a TokenReview for :func:`peer_audience` of *its own* certificate
  authenticates it as its own identity: a token a man in the middle captured is bound to the
  middle's certificate, so the real peer refuses it;
- the peer answers with a token of its own service account for :func:`reply_audience` of the
  requester's token, which the requester checks the same way before it reads a byte of the
  snapshot: only the same service account can mint it, and only for this request's token
  (which was itself bound to the certificate seen), so an impostor cannot pass a snapshot of
  its own — forged objects, Secrets included — for the peer's.

Tokens come from the TokenRequest API (``create serviceaccounts/token`` on warmwatch's own
service account): a projected token file cannot be bound, its audience being fixed before
the peer's certificate is known. They are asked for the shortest life the apiserver grants.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Final
from urllib.parse import quote

from proxy.upstream.connecting import Upstream
from proxy.upstream.errors import UpstreamProtocolError
from proxy.upstream.reviewing import UserInfo

__all__ = [
    "AUDIENCE",
    "REPLY_HEADER",
    "ServiceAccount",
    "fingerprint",
    "peer_audience",
    "reply_audience",
    "request_token",
]

AUDIENCE: Final = "warmwatch.io/seed"
"""The prefix of every seeding audience: a token made for the apiserver (or anything else) is
not accepted, and a seeding token is no use to the apiserver."""

REPLY_HEADER: Final = "Warmwatch-Seed-Reply-Token"
"""The peer's token for :func:`reply_audience`, sent before the snapshot's bytes."""

TOKEN_SECONDS: Final = 600
"""The life asked for a seeding token: the apiserver's minimum (10 minutes). It is used once,
within the seeding's bound."""

_ACCOUNT_PREFIX: Final = "system:serviceaccount:"


def fingerprint(certificate: bytes) -> str:
    """The hex SHA-256 of a DER certificate."""
    return hashlib.sha256(certificate).hexdigest()


def peer_audience(certificate_fingerprint: str) -> str:
    """The audience of a requester's token for the peer whose certificate has this
    fingerprint."""
    return f"{AUDIENCE}/sha256:{certificate_fingerprint}"


def reply_audience(requester_token: str) -> str:
    """The audience of a peer's answer to the request that carried ``requester_token``."""
    digest = hashlib.sha256(requester_token.encode()).hexdigest()
    return f"{AUDIENCE}/reply/sha256:{digest}"


@dataclass(frozen=True, kw_only=True, slots=True)
class ServiceAccount:
    namespace: str
    name: str

    @classmethod
    def of(cls, user: UserInfo) -> ServiceAccount | None:
        """The service account ``user`` is, None for any other identity."""
        namespace, _, name = user.username.removeprefix(_ACCOUNT_PREFIX).partition(":")
        if not user.username.startswith(_ACCOUNT_PREFIX) or not namespace or not name:
            return None
        return cls(namespace=namespace, name=name)


async def request_token(upstream: Upstream, *, account: ServiceAccount, audience: str) -> str:
    """A new token of ``account`` (warmwatch's own) for ``audience`` (TokenRequest). Failures
    are the upstream layer's errors (403: no ``create serviceaccounts/token``)."""
    path = (
        f"/api/v1/namespaces/{quote(account.namespace, safe='')}"
        f"/serviceaccounts/{quote(account.name, safe='')}/token"
    )
    answer = await upstream.json_request(
        "POST",
        path,
        json={
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"audiences": [audience], "expirationSeconds": TOKEN_SECONDS},
        },
        purpose="review",
        verb="TOKENREQUEST",
    )
    token = (answer.get("status") or {}).get("token")
    if not isinstance(token, str) or not token:
        raise UpstreamProtocolError("TokenRequest answer has no token")
    return token
