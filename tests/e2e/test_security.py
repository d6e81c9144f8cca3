"""Security, against the real apiserver (docs/design.md §6).

- ``--client-auth delegated``: an RBAC matrix of service-account identities (no grants,
  list/watch in one namespace, get only, cluster-wide list/watch), anonymous and a wrong
  token, times requests (list/watch in the own namespace, another one, cluster-wide, with a
  label selector, get, secrets, a write): every answer through warmwatch has the status code
  the apiserver gives directly, from a cold cache and from a warm one (the shapes filled by
  another identity). Revocation: a deleted RoleBinding denies the next list within the
  TTL and ends the identity's open cached watch.
- Floods of random bearer tokens: 10,100 from 101 addresses, each reviewed, do not push out
  the decision of a client accepted before (the apiserver stopped after the flood, it is
  still served from the cache); 10,000 from one address get the TokenReview budget and then
  429s, while a client of that address is not limited; other clients are answered within
  1 s meanwhile.
- While the apiserver is stopped: a GET of a cached object is allowed by a held list or
  watch decision of its collection, and refused otherwise (503; a refused token 401).
- ``--client-auth none``: a cross-origin WebSocket read is refused; exec is refused, and so
  are the node, pod and service proxies.
- ``--client-auth token-file``: a token of another identity than warmwatch's refuses the
  start; a second token of warmwatch's own identity is accepted.
- Beyond loopback: delegated over TLS, any Host name (and any host of an absolute-form
  target).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from loadtest import kubeapi
from loadtest.cluster import ControlPlane
from loadtest.ports import free_port
from loadtest.sidecar import Sidecar
from proxy.upstream.delegating import DelegationSettings
from tests.e2e.test_bad_input import exchange, parse_response

pytestmark = pytest.mark.e2e

TTL = 2.0
"""The decision cache TTL the delegated sidecars run with (the default is 10 s)."""


def _ssl(plane: ControlPlane) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(plane.pki.ca_cert))


async def _token(admin: kubeapi.RawClient, namespace: str, account: str) -> str:
    return await kubeapi.service_account_token(admin, namespace=namespace, account=account)


def _rule(*verbs: str, resource: str = "configmaps") -> dict[str, Any]:
    return {"apiGroups": [""], "resources": [resource], "verbs": list(verbs)}


@dataclass
class Stage:
    own: str
    other: str
    tokens: dict[str, str | None]
    """Identity name -> bearer token (None: anonymous)."""
    cleanup: list[str]
    """Cluster-scoped paths to delete at the end."""


@pytest.fixture
async def stage(admin_api: kubeapi.RawClient, namespace: str) -> AsyncIterator[Stage]:
    own, other = namespace, f"{namespace}-other"
    await kubeapi.ensure_namespace(admin_api, other)
    suffix = uuid.uuid4().hex[:8]
    for ns in (own, other):
        for i in range(3):
            await admin_api.create(
                f"/api/v1/namespaces/{ns}/configmaps",
                kubeapi.configmap(name=f"cm-{i}", namespace=ns, labels={"app": "x" if i else "y"}),
            )
    await admin_api.create(
        f"/api/v1/namespaces/{own}/secrets",
        {"metadata": {"name": "s"}, "stringData": {"password": "hunter2"}},
    )
    accounts = ["nothing", "reader", "getter", "cluster-reader", "filler"]
    for account in accounts:
        await admin_api.create(
            f"/api/v1/namespaces/{own}/serviceaccounts", {"metadata": {"name": account}}
        )
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    roles = {"reader": [_rule("list", "watch")], "getter": [_rule("get")]}
    for account, rules in roles.items():
        await admin_api.create(
            f"{rbac}/namespaces/{own}/roles", {"metadata": {"name": account}, "rules": rules}
        )
        await admin_api.create(
            f"{rbac}/namespaces/{own}/rolebindings",
            {
                "metadata": {"name": account},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": account,
                },
                "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": own}],
            },
        )
    cluster_role = f"warmwatch-e2e-read-{suffix}"
    await admin_api.create(
        f"{rbac}/clusterroles",
        {"metadata": {"name": cluster_role}, "rules": [_rule("list", "watch")]},
    )
    cleanup = [f"{rbac}/clusterroles/{cluster_role}"]
    for account, role in (("cluster-reader", cluster_role), ("filler", "cluster-admin")):
        binding = f"warmwatch-e2e-{account}-{suffix}"
        await admin_api.create(
            f"{rbac}/clusterrolebindings",
            {
                "metadata": {"name": binding},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role,
                },
                "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": own}],
            },
        )
        cleanup.append(f"{rbac}/clusterrolebindings/{binding}")
    tokens: dict[str, str | None] = {
        account: await _token(admin_api, own, account) for account in accounts
    }
    tokens["anonymous"] = None
    tokens["wrong"] = "not-a-token"
    yield Stage(own=own, other=other, tokens=tokens, cleanup=cleanup)
    for path in cleanup:
        await admin_api.delete(path)


def requests_for(stage: Stage) -> dict[str, tuple[str, str]]:
    own, other = stage.own, stage.other
    return {
        "list own": ("GET", f"/api/v1/namespaces/{own}/configmaps"),
        "list other": ("GET", f"/api/v1/namespaces/{other}/configmaps"),
        "list cluster": ("GET", "/api/v1/configmaps"),
        "list labels": ("GET", f"/api/v1/namespaces/{own}/configmaps?labelSelector=app%3Dx"),
        "list labels cluster": ("GET", "/api/v1/configmaps?labelSelector=app%3Dx"),
        "watch own": ("GET", f"/api/v1/namespaces/{own}/configmaps?watch=1&timeoutSeconds=1"),
        "watch other": (
            "GET",
            f"/api/v1/namespaces/{other}/configmaps?watch=1&timeoutSeconds=1",
        ),
        "watch cluster": ("GET", "/api/v1/configmaps?watch=1&timeoutSeconds=1"),
        "get": ("GET", f"/api/v1/namespaces/{own}/configmaps/cm-1"),
        "secrets": ("GET", f"/api/v1/namespaces/{own}/secrets"),
        "write": ("POST", f"/api/v1/namespaces/{own}/configmaps?dryRun=All"),
    }


async def _status(
    session: aiohttp.ClientSession, base: str, method: str, path: str, token: str | None
) -> int:
    headers = {"Accept": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    body = None
    if method == "POST":
        body = b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"written"}}'
        headers["Content-Type"] = "application/json"
    async with session.request(method, base + path, headers=headers, data=body) as answer:
        if "watch=1" not in path:
            await answer.read()
        return answer.status


Table = dict[tuple[str, str], int]


async def _matrix(session: aiohttp.ClientSession, base: str, stage: Stage) -> Table:
    table: Table = {}
    # Refused identities first: a cold shape is then first asked for by one that may not read.
    for identity in ("nothing", "anonymous", "wrong", "getter", "reader", "cluster-reader"):
        for name, (method, path) in requests_for(stage).items():
            table[identity, name] = await _status(
                session, base, method, path, stage.tokens[identity]
            )
    return table


def _differences(direct: Table, through: Table) -> tuple[list[str], list[str], list[str]]:
    escalations, false_denials, other = [], [], []
    for key, code in direct.items():
        got = through[key]
        if got == code:
            continue
        text = f"{key}: apiserver {code}, warmwatch {got}"
        if code >= 400 and got < 400:
            escalations.append(text)
        elif code < 400 and got >= 400:
            false_denials.append(text)
        else:
            other.append(text)
    return escalations, false_denials, other


def _delegated(start_sidecar: Callable[..., Sidecar]) -> Sidecar:
    return start_sidecar(extra=["--client-auth=delegated", f"--auth-cache-ttl={TTL}"])


async def test_delegated_answers_match_the_apiserver_cold_and_warm(
    plane: ControlPlane, stage: Stage, start_sidecar: Callable[..., Sidecar]
) -> None:
    sidecar = _delegated(start_sidecar)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=_ssl(plane))) as session:
        direct = await _matrix(session, plane.server, stage)
        # The matrix means something: each kind of answer occurs.
        assert direct["reader", "list own"] == 200
        assert direct["reader", "list other"] == 403
        assert direct["cluster-reader", "list cluster"] == 200
        assert direct["getter", "get"] == 200 and direct["getter", "list own"] == 403
        assert direct["anonymous", "list own"] == 403
        assert direct["wrong", "list own"] == 401
        assert direct["reader", "write"] == 403

        cold = await _matrix(session, sidecar.url, stage)
        assert _differences(direct, cold) == ([], [], []), "cold cache"

        # Warm: every shape filled by another identity, which may read everything.
        for method, path in requests_for(stage).values():
            if method == "GET":
                await _status(session, sidecar.url, method, path, stage.tokens["filler"])
        served_from_cache = sidecar.metric(
            "warmwatch_list_bytes_total", {"resource": "v1/configmaps", "source": "cache"}
        )
        warm = await _matrix(session, sidecar.url, stage)
        assert _differences(direct, warm) == ([], [], []), "warm cache"
        assert (
            sidecar.metric(
                "warmwatch_list_bytes_total", {"resource": "v1/configmaps", "source": "cache"}
            )
            > served_from_cache
        ), "the warm pass was not answered from the cache"
        assert sidecar.metric("warmwatch_client_auth_reviews_total", {"kind": "access"}) > 0


async def test_revoked_access_denies_lists_and_ends_watches_within_the_ttl(
    plane: ControlPlane,
    stage: Stage,
    admin_api: kubeapi.RawClient,
    start_sidecar: Callable[..., Sidecar],
) -> None:
    sidecar = _delegated(start_sidecar)
    token = stage.tokens["reader"]
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    collection = f"{sidecar.url}/api/v1/namespaces/{stage.own}/configmaps"
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.get(collection) as listed:
            assert listed.status == 200
            rv = (await listed.json())["metadata"]["resourceVersion"]
        async with session.get(collection, params={"watch": "1", "resourceVersion": rv}) as watch:
            assert watch.status == 200
            await admin_api.delete(
                f"/apis/rbac.authorization.k8s.io/v1/namespaces/{stage.own}/rolebindings/reader"
            )
            revoked = time.monotonic()
            # The next list is refused within the TTL (plus the apiserver's own RBAC update).
            while True:
                async with session.get(collection) as again:
                    if again.status == 403:
                        body = await again.json()
                        break
                    assert again.status == 200
                assert time.monotonic() - revoked < TTL + 3, "list still allowed"
                await asyncio.sleep(0.1)
            assert body["reason"] == "Forbidden"
            assert "cannot list resource" in body["message"]
            # The open watch ends: at the next re-check, at most two TTLs on.
            await asyncio.wait_for(watch.content.read(), timeout=2 * TTL + 5)
            assert watch.content.at_eof()
            ended = time.monotonic() - revoked
        # The watch's resume is refused too, as directly.
        async with session.get(collection, params={"watch": "1", "resourceVersion": rv}) as retry:
            assert retry.status == 403
    assert ended < 2 * TTL + 5


# ------------------------------------------------------------------- TokenReview floods

FLOOD_ADDRESSES = 101
"""Loopback source addresses of the spread flood (127.0.0.2 on): each sends as many random
tokens as its TokenReview burst allows, so every one of them is reviewed."""
FLOOD_CONCURRENCY = 16
"""Flood requests in flight at once."""
FLOOD_DEADLINE = 240.0
"""The flood must be over within this long (well inside the 300 s offline window)."""
ANSWERED_WITHIN = 1.0
"""Every request of another client during a flood is answered within this long."""


def _bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Accept": "application/json"}


async def _get_json(url: str, token: str | None) -> tuple[int, Any]:
    """GET ``url`` as ``token``: the status and the decoded body (text when not JSON)."""
    async with aiohttp.ClientSession() as session, session.get(url, headers=_bearer(token)) as got:
        body = await got.read()
        return got.status, (json.loads(body) if body.startswith(b"{") else body.decode())


@dataclass
class Probe:
    """Another client's requests during a flood: status codes and times to answer."""

    statuses: list[int]
    seconds: list[float]


async def _probe(
    session: aiohttp.ClientSession, url: str, token: str | None, stop: asyncio.Event
) -> Probe:
    """GET ``url`` as ``token`` four times a second until ``stop``."""
    probe = Probe(statuses=[], seconds=[])
    while not stop.is_set():
        started = time.monotonic()
        async with session.get(url, headers=_bearer(token)) as answer:
            await answer.read()
        probe.seconds.append(time.monotonic() - started)
        probe.statuses.append(answer.status)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.25)
    return probe


@dataclass
class Flooded:
    codes: Counter[int]
    """How many answers had each status code."""
    samples: dict[int, tuple[dict[str, str], bytes]]
    """An answer of each status code: its headers and body."""


async def _flood(url: str, *, addresses: list[str], per_address: int) -> Flooded:
    """GET ``url`` with a new random bearer token each time, ``per_address`` times from each
    source address, ``FLOOD_CONCURRENCY`` at once."""
    flooded = Flooded(codes=Counter(), samples={})
    in_flight = asyncio.Semaphore(FLOOD_CONCURRENCY)
    sessions = [
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(address, 0)))
        for address in addresses
    ]

    async def one(session: aiohttp.ClientSession) -> None:
        async with in_flight:
            token = f"junk-{uuid.uuid4().hex}"
            async with session.get(url, headers=_bearer(token)) as answer:
                body = await answer.read()
                flooded.codes[answer.status] += 1
                flooded.samples.setdefault(answer.status, (dict(answer.headers), body))

    try:
        await asyncio.wait_for(
            asyncio.gather(*(one(s) for _ in range(per_address) for s in sessions)),
            FLOOD_DEADLINE,
        )
    finally:
        for session in sessions:
            await session.close()
    return flooded


async def _flood_with_probes(
    url: str,
    probes: dict[str, tuple[str, str | None]],
    *,
    addresses: list[str],
    per_address: int,
) -> tuple[Flooded, dict[str, Probe], float]:
    """The flood, while each of ``probes`` (name: url, token) is asked for; the flood's
    answers, the probes and the flood's duration."""
    stop = asyncio.Event()
    async with aiohttp.ClientSession() as session:
        probing = {
            name: asyncio.create_task(_probe(session, probe_url, token, stop))
            for name, (probe_url, token) in probes.items()
        }
        started = time.monotonic()
        try:
            flooded = await _flood(url, addresses=addresses, per_address=per_address)
        finally:
            took = time.monotonic() - started
            stop.set()
        done = {name: await task for name, task in probing.items()}
    return flooded, done, took


def _answered_in_time(probes: dict[str, Probe]) -> None:
    for name, probe in probes.items():
        assert probe.statuses and set(probe.statuses) == {200}, (name, probe.statuses)
        slowest = max(probe.seconds)
        assert slowest < ANSWERED_WITHIN, f"{name}: {slowest:.2f} s"


async def test_a_token_flood_cannot_evict_an_accepted_decision(
    plane: ControlPlane, stage: Stage, start_sidecar: Callable[..., Sidecar]
) -> None:
    """10,100 random tokens, each reviewed (from 101 addresses, within each one's burst):
    more than the 10,000 decisions kept. The refused ones are kept apart, so a client that
    was accepted before the flood, and idle during it, is still served from the cache when
    the apiserver then goes away; other clients are answered meanwhile."""
    sidecar = _delegated(start_sidecar)
    own = f"{sidecar.url}/api/v1/namespaces/{stage.own}/configmaps"
    status, listed = await _get_json(own, stage.tokens["reader"])
    assert status == 200
    expected = [item["metadata"]["name"] for item in listed["items"]]
    addresses = [f"127.0.0.{2 + n}" for n in range(FLOOD_ADDRESSES)]
    per_address = DelegationSettings().review_burst
    flooded, probes, took = await _flood_with_probes(
        own,
        {
            "filler": (own, stage.tokens["filler"]),
            # Cluster-wide, as its grant is; one namespace's objects, so that the probe times
            # the answer, not the transfer of every ConfigMap the suite made before.
            "cluster-reader": (
                f"{sidecar.url}/api/v1/configmaps?fieldSelector=metadata.namespace%3D{stage.own}",
                stage.tokens["cluster-reader"],
            ),
        },
        addresses=addresses,
        per_address=per_address,
    )
    flood = FLOOD_ADDRESSES * per_address
    print(
        f"\n{flood} random tokens in {took:.1f} s ({flood / took:.0f}/s); other clients "
        + ", ".join(f"{n} max {max(p.seconds) * 1000:.0f} ms" for n, p in probes.items())
    )
    assert flooded.codes == {401: flood}  # every one reviewed and refused, none over a budget
    assert sidecar.metric("warmwatch_client_auth_reviews_total", {"kind": "token"}) >= flood
    _answered_in_time(probes)

    plane.stop_apiserver()
    try:
        status, listed = await _get_json(own, stage.tokens["reader"])
        assert status == 200, listed
        assert [item["metadata"]["name"] for item in listed["items"]] == expected
    finally:
        plane.start_apiserver()


async def test_token_reviews_of_one_address_are_rate_limited(
    stage: Stage, start_sidecar: Callable[..., Sidecar]
) -> None:
    """A flood from one address gets its burst of TokenReviews and then the rate; the rest is
    the apiserver's 429. A client of the same address whose token was accepted is never
    limited, also when its decision is renewed during the flood (the TTL is 2 s)."""
    sidecar = _delegated(start_sidecar)
    own = f"{sidecar.url}/api/v1/namespaces/{stage.own}/configmaps"
    assert (await _get_json(own, stage.tokens["reader"]))[0] == 200
    settings = DelegationSettings()
    sent = 10_000
    flooded, probes, took = await _flood_with_probes(
        own, {"reader": (own, stage.tokens["reader"])}, addresses=["127.0.0.1"], per_address=sent
    )
    codes = flooded.codes
    allowed = settings.review_burst + settings.review_rate * took
    print(
        f"\n{sent} random tokens from one address in {took:.1f} s: {codes[401]} reviewed "
        f"(budget {allowed:.0f}), {codes[429]} answered 429; reader max "
        f"{max(probes['reader'].seconds) * 1000:.0f} ms"
    )
    assert set(codes) == {401, 429} and codes.total() == sent
    assert settings.review_burst <= codes[401] <= allowed + 2
    assert sidecar.metric("warmwatch_rejected_total", {"limit": "token_reviews"}) == codes[429]
    # The apiserver's max-in-flight answer, as for warmwatch's other limits.
    headers, body = flooded.samples[429]
    assert headers["Retry-After"] == "1"
    assert body == b"Too many requests, please try again later.\n"
    _answered_in_time(probes)


async def test_offline_get_is_authorized_by_held_list_decisions(
    plane: ControlPlane, stage: Stage, start_sidecar: Callable[..., Sidecar]
) -> None:
    """While the apiserver is down, a GET of a cached object is answered to a client that was
    allowed to list (or watch) the collection within the offline window, in the namespace or
    across all; anyone else gets 503 (nothing decides it), a refused token 401."""
    sidecar = _delegated(start_sidecar)
    own = f"/api/v1/namespaces/{stage.own}/configmaps"
    other = f"/api/v1/namespaces/{stage.other}/configmaps"
    async with aiohttp.ClientSession() as session:
        async with session.get(
            f"{sidecar.url}{own}/cm-1", headers=_bearer(stage.tokens["getter"])
        ) as direct:  # passed through while the apiserver answers
            assert direct.status == 200
            object_json = await direct.json()
        before = {
            "reader": (own, 200),
            "cluster-reader": ("/api/v1/configmaps", 200),
            "getter": (own, 403),
            "nothing": (own, 403),
            "wrong": (own, 401),
        }
        for identity, (path, code) in before.items():
            async with session.get(
                sidecar.url + path, headers=_bearer(stage.tokens[identity])
            ) as listed:
                assert listed.status == code, identity

        plane.stop_apiserver()
        try:
            offline = {
                ("reader", own): 200,  # its list in the namespace
                ("cluster-reader", own): 200,  # its list across all namespaces
                ("cluster-reader", other): 200,
                ("reader", other): 503,  # never allowed to list there
                ("getter", own): 503,  # allowed to get, but only the apiserver decided that
                ("nothing", own): 503,
                ("anonymous", own): 503,
                ("wrong", own): 401,  # refused within the window
            }
            for (identity, collection), code in offline.items():
                async with session.get(
                    f"{sidecar.url}{collection}/cm-1", headers=_bearer(stage.tokens[identity])
                ) as answer:
                    assert answer.status == code, (identity, collection, await answer.text())
                    if code == 200 and collection == own:
                        assert await answer.json() == object_json
        finally:
            plane.start_apiserver()


async def test_cross_origin_websocket_read_is_refused_in_none_mode(
    admin_api: kubeapi.RawClient, namespace: str, start_sidecar: Callable[..., Sidecar]
) -> None:
    await admin_api.create(
        f"/api/v1/namespaces/{namespace}/secrets",
        {"metadata": {"name": "s"}, "stringData": {"password": "hunter2"}},
    )
    sidecar = start_sidecar()  # --client-auth none
    path = f"/api/v1/watch/namespaces/{namespace}/secrets/s"
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(
                sidecar.url.replace("http", "ws") + path,
                headers={"Origin": "http://evil.example"},
            )
        assert refused.value.status == 403
        # The same handshake from a loopback origin reaches the apiserver and reads (the
        # apiserver's WebSocket watch wants some Origin: golang.org/x/net/websocket).
        ws = await session.ws_connect(
            sidecar.url.replace("http", "ws") + path, headers={"Origin": sidecar.url}
        )
        try:
            message = await asyncio.wait_for(ws.receive(), timeout=30)
            assert b"ADDED" in (
                message.data if isinstance(message.data, bytes) else message.data.encode()
            )
        finally:
            await ws.close()
        # exec is refused by default, as kubectl proxy does.
        async with session.post(
            f"{sidecar.url}/api/v1/namespaces/{namespace}/pods/p/exec?command=id"
        ) as exec_answer:
            assert exec_answer.status == 403
            assert "--reject-paths" in (await exec_answer.json())["message"]


async def test_node_pod_and_service_proxies_are_refused_in_none_mode(
    admin_api: kubeapi.RawClient, namespace: str, start_sidecar: Callable[..., Sidecar]
) -> None:
    """The kubelet's API (its /run and /exec run commands in containers) and any in-cluster
    endpoint are not reached with warmwatch's identity by default."""
    await admin_api.create(
        f"/api/v1/namespaces/{namespace}/services",
        {"metadata": {"name": "s"}, "spec": {"ports": [{"port": 80}]}},
    )
    sidecar = start_sidecar()  # --client-auth none
    refused = [
        ("POST", "/api/v1/nodes/n/proxy/run/ns/pod/container?cmd=id"),
        ("GET", "/api/v1/nodes/n:10250/proxy/exec/ns/pod/container"),
        ("GET", f"/api/v1/namespaces/{namespace}/pods/p/proxy/metrics"),
        ("GET", f"/api/v1/namespaces/{namespace}/pods/http:p:8080/proxy/"),
        ("GET", f"/api/v1/namespaces/{namespace}/services/s/proxy/"),
        ("GET", f"/api/v1/namespaces/{namespace}/services/https:s:443/proxy"),
    ]
    async with aiohttp.ClientSession() as session:
        for method, path in refused:
            async with session.request(method, sidecar.url + path) as answer:
                assert answer.status == 403, path
                body = await answer.json()
                assert body["reason"] == "Forbidden" and "--reject-paths" in body["message"]
        # None of them reached the apiserver; the objects themselves still do.
        assert sidecar.metric("warmwatch_passthrough_requests_total") == 0
        async with session.get(f"{sidecar.url}/api/v1/namespaces/{namespace}/services/s") as ok:
            assert ok.status == 200
        async with session.get(f"{sidecar.url}/api/v1/nodes/n") as missing:
            assert missing.status == 404  # the apiserver's answer: there is no such node


async def test_token_file_of_another_identity_refuses_the_start(
    plane: ControlPlane,
    admin_api: kubeapi.RawClient,
    namespace: str,
    tmp_path: Path,
    start_sidecar: Callable[..., Sidecar],
) -> None:
    for account in ("someone", "warmwatch"):
        await admin_api.create(
            f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": account}}
        )
    other = tmp_path / "someone.token"
    other.write_text(await _token(admin_api, namespace, "someone"))
    # Upstream: the admin certificate. The token file: a service account. Refused.
    with pytest.raises(RuntimeError, match="refusing to start") as refused:
        start_sidecar(extra=[f"--client-auth=token-file:{other}"])
    assert "someone" in str(refused.value)

    # Upstream and token file: two tokens of one service account. Accepted.
    own = tmp_path / "own.token"
    own.write_text(await _token(admin_api, namespace, "warmwatch"))
    kubeconfig = _token_kubeconfig(
        tmp_path / "upstream.kubeconfig",
        plane=plane,
        token=await _token(admin_api, namespace, "warmwatch"),
    )
    sidecar = Sidecar.start(
        upstream_kubeconfig=kubeconfig,
        db=tmp_path / "own.db",
        extra=[f"--client-auth=token-file:{own}"],
    )
    try:
        async with aiohttp.ClientSession() as session:
            bearer = {"Authorization": f"Bearer {own.read_text()}"}
            async with session.get(f"{sidecar.url}/version", headers=bearer) as version:
                assert version.status == 200
            async with session.get(f"{sidecar.url}/version") as anonymous:
                assert anonymous.status == 401
    finally:
        sidecar.stop()


async def test_client_go_sends_its_token_file_over_the_cert_dir_tls(
    plane: ControlPlane, admin_api: kubeapi.RawClient, namespace: str, tmp_path: Path
) -> None:
    """What deploy/component does: ``--cert-dir`` and ``token-file``. kubectl (client-go)
    trusts the self-signed certificate, sends the token file's token and is answered; a
    token that is not the file's gets 401; after a rotation the previous token is still
    accepted (client-go re-reads the file once a minute); a restart keeps the certificate
    the running clients trust."""
    await admin_api.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "warmwatch"}}
    )
    own = tmp_path / "token"
    own.write_text(await _token(admin_api, namespace, "warmwatch"))
    upstream = _token_kubeconfig(
        tmp_path / "upstream.kubeconfig",
        plane=plane,
        token=await _token(admin_api, namespace, "warmwatch"),
    )
    port = free_port()
    sidecar = Sidecar.start(
        upstream_kubeconfig=upstream,
        db=tmp_path / "cache.db",
        port=port,
        extra=[f"--client-auth=token-file:{own}", f"--cert-dir={tmp_path / 'tls'}"],
    )
    ca = tmp_path / "tls" / "warmwatch.crt"
    wrong = tmp_path / "wrong.token"
    wrong.write_text(await _token(admin_api, namespace, "default"))

    def kubectl(token_file: Path) -> subprocess.CompletedProcess[str]:
        kubeconfig = kubeapi.kubeconfig_for(  # deploy/component's, for this listener
            f"https://127.0.0.1:{port}",
            path=tmp_path / "client.kubeconfig",
            token_file=token_file,
            ca=ca,
        )
        return subprocess.run(
            [str(plane.kubectl()), f"--kubeconfig={kubeconfig}", "get", "--raw", "/version"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    try:
        answered = kubectl(own)
        assert answered.returncode == 0, answered.stderr
        assert json.loads(answered.stdout)["major"] == "1"
        refused = kubectl(wrong)
        assert refused.returncode != 0 and "Unauthorized" in refused.stderr, refused.stderr
        assert sidecar.metric("warmwatch_client_errors_total", {"reason": "unauthorized"}) == 1

        previous = own.read_text()
        own.write_text(await _token(admin_api, namespace, "warmwatch"))
        assert kubectl(own).returncode == 0
        tls = ssl.create_default_context(cafile=str(ca))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls)) as session:
            bearer = {"Authorization": f"Bearer {previous}"}
            async with session.get(f"https://127.0.0.1:{port}/version", headers=bearer) as old:
                assert old.status == 200  # within the rotation grace

        certificate = ca.read_bytes()
        sidecar.stop()
        sidecar.restart()
        assert ca.read_bytes() == certificate
        assert kubectl(own).returncode == 0
    finally:
        sidecar.stop()


async def test_delegated_over_tls_beyond_loopback(
    plane: ControlPlane, stage: Stage, start_sidecar: Callable[..., Sidecar]
) -> None:
    """Listening on every address takes delegated and TLS; clients reach it by any host name
    (no loopback Host check there, also for the host of an absolute-form target) and get the
    apiserver's decisions."""
    port = free_port()
    start_sidecar(
        extra=[
            "--client-auth=delegated",
            f"--listen=0.0.0.0:{port}",
            f"--tls-cert-file={plane.pki.serving_cert}",
            f"--tls-private-key-file={plane.pki.serving_key}",
        ]
    )
    own = f"/api/v1/namespaces/{stage.own}/configmaps"
    # An absolute-form target of any host is routed by its path, as by the apiserver.
    target = f"http://evil.example{own}/cm-1"
    request = (
        f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/json\r\n"
        f"Authorization: Bearer {stage.tokens['getter']}\r\nConnection: close\r\n\r\n"
    ).encode()
    api_port = int(plane.server.rsplit(":", 1)[1])
    direct = parse_response(await exchange(api_port, request, tls=_ssl(plane)))
    through = parse_response(await exchange(port, request, tls=_ssl(plane)))
    assert direct[0] == through[0] == b"HTTP/1.1 200 OK"
    assert direct[2] == through[2]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=_ssl(plane))) as session:
        for identity, expected in (("reader", 200), ("nothing", 403), ("wrong", 401)):
            async with session.get(
                f"https://127.0.0.1:{port}{own}",
                headers={
                    "Authorization": f"Bearer {stage.tokens[identity]}",
                    "Host": f"kubernetes.default.svc:{port}",
                },
            ) as answer:
                assert answer.status == expected, identity
    # No plain HTTP on that listener.
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientError):
            async with session.get(f"http://127.0.0.1:{port}{own}") as plain:
                await plain.read()


def _token_kubeconfig(path: Path, *, plane: ControlPlane, token: str) -> Path:
    """The apiserver, as a service account's token."""
    return kubeapi.kubeconfig_for(plane.server, path=path, token=token, ca=plane.pki.ca_cert)
