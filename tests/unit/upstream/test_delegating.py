"""Delegated authentication and authorization against an in-process fake of the review APIs:
what is sent, the answers' Status, caching per identity, the offline window (and the list
decisions that imply a get), the TokenReview budget per client, and the token-file identity
check."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from proxy.kube.status import StatusError
from proxy.metrics import Metrics
from proxy.upstream.connecting import ConnectionSettings, Upstream, connect
from proxy.upstream.delegating import Delegation, DelegationSettings, TooManyReviews
from proxy.upstream.reviewing import (
    AccessAttributes,
    IdentityMismatch,
    UserInfo,
    check_same_identity,
)
from tests.unit.upstream.conftest import Served, token_kubeconfig

USERS = {
    "alice-token": {
        "username": "system:serviceaccount:a:alice",
        "uid": "u-1",
        "groups": ["system:serviceaccounts", "system:authenticated"],
        "extra": {"authentication.kubernetes.io/credential-id": ["JTI=1"]},
    },
    "sidecar-token": {"username": "system:serviceaccount:a:warmwatch", "uid": "u-2"},
    "twin-token": {"username": "system:serviceaccount:a:warmwatch", "uid": "u-2"},
}


class Reviews:
    """TokenReview, SubjectAccessReview and SelfSubjectReview endpoints."""

    def __init__(self) -> None:
        self.bodies: list[tuple[str, dict[str, Any]]] = []
        self.allowed: set[tuple[str, str, str]] = set()  # (user, verb, namespace)
        self.fail_with = 0
        """Answer every review with this code (429, 500, 403) when set."""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/apis/authentication.k8s.io/v1/tokenreviews", self.token)
        app.router.add_post("/apis/authorization.k8s.io/v1/subjectaccessreviews", self.access)
        app.router.add_post("/apis/authentication.k8s.io/v1/selfsubjectreviews", self.whoami)
        return app

    async def token(self, request: web.Request) -> web.Response:
        if self.fail_with:
            return web.json_response(
                {"kind": "Status", "code": self.fail_with}, status=self.fail_with
            )
        body = await request.json()
        self.bodies.append(("token", body))
        user = USERS.get(body["spec"]["token"])
        status: dict[str, Any] = {"authenticated": user is not None}
        if user:
            status["user"] = user
        return web.json_response({**body, "status": status}, status=201)

    async def access(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(("access", body))
        spec = body["spec"]
        attrs = spec["resourceAttributes"]
        allowed = (spec["user"], attrs["verb"], attrs["namespace"]) in self.allowed
        status = {"allowed": allowed} if allowed else {"allowed": False, "reason": ""}
        return web.json_response({**body, "status": status}, status=201)

    async def whoami(self, request: web.Request) -> web.Response:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        user = USERS.get(token)
        if user is None:
            return web.json_response(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "code": 401,
                    "reason": "Unauthorized",
                    "message": "Unauthorized",
                    "metadata": {},
                },
                status=401,
            )
        return web.json_response({"status": {"userInfo": user}}, status=201)


@pytest.fixture
def reviews() -> Reviews:
    return Reviews()


@pytest.fixture
async def review_server(reviews: Reviews) -> AsyncIterator[Served]:
    served = Served(reviews.app())
    await served.start()
    yield served
    await served.stop()


@pytest.fixture
async def reviewing_upstream(review_server: Served, tmp_path: Path) -> AsyncIterator[Upstream]:
    kubeconfig = token_kubeconfig(tmp_path / "kc", server=review_server.url, token="sidecar-token")
    connected = await connect(
        ConnectionSettings(kubeconfig=str(kubeconfig), connect_timeout=2.0, request_timeout=5.0),
        metrics=Metrics(),
    )
    yield connected
    await connected.close()


CLIENT = "127.0.0.1"
"""The remote address reviews are charged to."""

LIST_CONFIGMAPS = AccessAttributes(
    verb="list",
    group="",
    version="v1",
    resource="configmaps",
    namespace="a",
    label_selector="app=x",
)


async def test_token_and_access_reviews_as_the_apiserver_sends_them(
    reviews: Reviews, reviewing_upstream: Upstream
) -> None:
    delegation = Delegation(
        upstream=reviewing_upstream, settings=DelegationSettings(), metrics=Metrics()
    )
    reviews.allowed.add(("system:serviceaccount:a:alice", "list", "a"))
    user = await delegation.authenticate("alice-token", client=CLIENT)
    assert user.username == "system:serviceaccount:a:alice"
    await delegation.authorize(user, LIST_CONFIGMAPS)

    kinds = [kind for kind, _ in reviews.bodies]
    assert kinds == ["token", "access"]
    token_body, access_body = reviews.bodies[0][1], reviews.bodies[1][1]
    assert token_body["spec"] == {"token": "alice-token"}  # the apiserver's own audiences
    spec = access_body["spec"]
    assert spec["user"] == "system:serviceaccount:a:alice"
    assert spec["uid"] == "u-1"
    assert spec["groups"] == ["system:serviceaccounts", "system:authenticated"]
    assert spec["extra"] == {"authentication.kubernetes.io/credential-id": ["JTI=1"]}
    assert spec["resourceAttributes"] == {
        "namespace": "a",
        "verb": "list",
        "group": "",
        "version": "v1",
        "resource": "configmaps",
        "labelSelector": {"rawSelector": "app=x"},
    }

    # Reused within the TTL: no more reviews.
    await delegation.authorize(
        await delegation.authenticate("alice-token", client=CLIENT), LIST_CONFIGMAPS
    )
    assert len(reviews.bodies) == 2
    await delegation.close()


async def test_refusals_are_the_apiservers_statuses(reviewing_upstream: Upstream) -> None:
    delegation = Delegation(
        upstream=reviewing_upstream, settings=DelegationSettings(), metrics=Metrics()
    )
    with pytest.raises(StatusError) as unauthorized:
        await delegation.authenticate("wrong", client=CLIENT)
    assert (unauthorized.value.code, unauthorized.value.message) == (401, "Unauthorized")

    user = await delegation.authenticate("alice-token", client=CLIENT)
    with pytest.raises(StatusError) as forbidden:
        await delegation.authorize(user, LIST_CONFIGMAPS)
    assert forbidden.value.code == 403
    assert forbidden.value.message == (
        'configmaps is forbidden: User "system:serviceaccount:a:alice" cannot list resource '
        '"configmaps" in API group "" in the namespace "a"'
    )
    await delegation.close()


async def test_unreachable_apiserver_holds_recent_decisions_only(
    reviews: Reviews, review_server: Served, reviewing_upstream: Upstream
) -> None:
    now = [0.0]
    delegation = Delegation(
        upstream=reviewing_upstream,
        settings=DelegationSettings(offline_window=60.0),
        metrics=Metrics(),
        clock=lambda: now[0],
    )
    reviews.allowed.add(("system:serviceaccount:a:alice", "list", "a"))
    user = await delegation.authenticate("alice-token", client=CLIENT)
    await delegation.authorize(user, LIST_CONFIGMAPS)
    await review_server.stop()
    now[0] = 30.0  # past the TTLs, inside the window
    assert await delegation.authenticate("alice-token", client=CLIENT) == user
    await delegation.authorize(user, LIST_CONFIGMAPS)
    other = AccessAttributes(verb="watch", group="", version="v1", resource="configmaps")
    with pytest.raises(StatusError) as never_decided:
        await delegation.authorize(user, other)
    assert never_decided.value.code == 503 and never_decided.value.retry_after == 1
    now[0] = 61.0
    with pytest.raises(StatusError) as expired:
        await delegation.authenticate("alice-token", client=CLIENT)
    assert expired.value.code == 503
    await delegation.close()


async def test_token_file_identity_check(reviewing_upstream: Upstream) -> None:
    mine = await check_same_identity(reviewing_upstream, "twin-token")
    assert mine == UserInfo(username="system:serviceaccount:a:warmwatch", uid="u-2")
    with pytest.raises(IdentityMismatch, match="alice"):
        await check_same_identity(reviewing_upstream, "alice-token")
    with pytest.raises(IdentityMismatch, match="does not accept"):
        await check_same_identity(reviewing_upstream, "nobody")


@pytest.mark.parametrize(("code", "held"), [(429, True), (500, True), (503, True), (403, False)])
async def test_review_failures_are_outages_unless_refused(
    reviews: Reviews, reviewing_upstream: Upstream, code: int, held: bool
) -> None:
    now = [0.0]
    delegation = Delegation(
        upstream=reviewing_upstream,
        settings=DelegationSettings(),
        metrics=Metrics(),
        clock=lambda: now[0],
    )
    user = await delegation.authenticate("alice-token", client=CLIENT)
    reviews.fail_with = code
    now[0] = 20.0  # past the TTL, inside the offline window
    if held:
        assert await delegation.authenticate("alice-token", client=CLIENT) == user
    else:  # warmwatch may not review (its RBAC): 500, as the apiserver's failing authorizer
        with pytest.raises(StatusError) as failed:
            await delegation.authenticate("alice-token", client=CLIENT)
        assert failed.value.code == 500
    with pytest.raises(StatusError) as never:
        await delegation.authenticate("twin-token", client=CLIENT)
    assert never.value.code == (503 if held else 500)
    await delegation.close()


async def test_token_reviews_are_budgeted_per_client_for_unknown_tokens_only(
    reviews: Reviews, reviewing_upstream: Upstream
) -> None:
    now = [0.0]
    delegation = Delegation(
        upstream=reviewing_upstream,
        settings=DelegationSettings(review_rate=0.05, review_burst=3),
        metrics=Metrics(),
        clock=lambda: now[0],
    )
    user = await delegation.authenticate("alice-token", client=CLIENT)  # 1 of 3
    for n in range(2):
        with pytest.raises(StatusError):
            await delegation.authenticate(f"junk-{n}", client=CLIENT)
    with pytest.raises(TooManyReviews):
        await delegation.authenticate("junk-2", client=CLIENT)
    sent = len(reviews.bodies)
    # Cached: no review, no budget.
    assert await delegation.authenticate("alice-token", client=CLIENT) == user
    # Past the TTL, an accepted token is reviewed again, whatever the budget.
    now[0] = 10.5
    for _ in range(10):
        with pytest.raises(TooManyReviews):
            await delegation.authenticate("junk-3", client=CLIENT)
    assert await delegation.authenticate("alice-token", client=CLIENT) == user
    assert len(reviews.bodies) == sent + 1
    # Another address has a budget of its own; an open watch's re-check is charged to nobody.
    await delegation.authenticate("twin-token", client="10.0.0.7")
    assert await delegation.authenticate("twin-token", client=None)
    now[0] = 21.0  # 20 s at 0.05/s: one more review for the flooding address
    with pytest.raises(StatusError) as refused:
        await delegation.authenticate("junk-4", client=CLIENT)
    assert refused.value.code == 401
    with pytest.raises(TooManyReviews):
        await delegation.authenticate("junk-5", client=CLIENT)
    await delegation.close()


async def test_refused_tokens_cannot_evict_an_accepted_one(
    reviews: Reviews, review_server: Served, reviewing_upstream: Upstream
) -> None:
    now = [0.0]
    delegation = Delegation(
        upstream=reviewing_upstream,
        settings=DelegationSettings(max_entries=10, max_refused=5, review_burst=1_000),
        metrics=Metrics(),
        clock=lambda: now[0],
    )
    user = await delegation.authenticate("alice-token", client=CLIENT)
    for n in range(50):  # five times as many as both bounds together
        with pytest.raises(StatusError):
            await delegation.authenticate(f"junk-{n}", client=f"10.0.0.{n}")
    assert len(delegation.tokens) == 1 + 5
    await review_server.stop()
    now[0] = 100.0  # the apiserver gone, inside the offline window
    assert await delegation.authenticate("alice-token", client=CLIENT) == user
    await delegation.close()


async def test_offline_a_held_list_implies_a_get(
    reviews: Reviews, review_server: Served, reviewing_upstream: Upstream
) -> None:
    now = [0.0]
    delegation = Delegation(
        upstream=reviewing_upstream,
        settings=DelegationSettings(),
        metrics=Metrics(),
        clock=lambda: now[0],
    )

    def attributes(verb: str, namespace: str, name: str = "") -> AccessAttributes:
        return AccessAttributes(
            verb=verb, group="", version="v1", resource="configmaps", namespace=namespace, name=name
        )

    listing, denied = attributes("list", ""), attributes("list", "b")
    reviews.allowed.add(("system:serviceaccount:a:alice", "list", ""))
    user = await delegation.authenticate("alice-token", client=CLIENT)
    await delegation.authorize(user, listing)
    with pytest.raises(StatusError):
        await delegation.authorize(user, denied)
    # While the apiserver answers, it decides a get itself.
    with pytest.raises(StatusError) as decided:
        await delegation.authorize(user, attributes("get", "b", "y"), implied_by=[listing])
    assert decided.value.code == 403

    await review_server.stop()
    now[0] = 100.0  # past the TTLs, inside the offline window
    get = attributes("get", "a", "x")
    await delegation.authorize(user, get, implied_by=[listing])
    for implying in ([], [denied]):  # nothing held, or held but denied: cannot decide
        with pytest.raises(StatusError) as unknown:
            await delegation.authorize(user, get, implied_by=implying)
        assert unknown.value.code == 503
    # A get decided within the window is that decision.
    with pytest.raises(StatusError) as held:
        await delegation.authorize(user, attributes("get", "b", "y"), implied_by=[listing])
    assert held.value.code == 403
    now[0] = 400.0  # the list decision is older than the offline window
    with pytest.raises(StatusError) as expired:
        await delegation.authorize(user, get, implied_by=[listing])
    assert expired.value.code == 503
    await delegation.close()
