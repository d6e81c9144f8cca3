"""Protobuf clients through warmwatch get what they get from the apiserver, object for object
and byte for byte.

client-go's typed informers (kube-controller-manager's ContentType/AcceptContentTypes) and its
metadata informers (``as=PartialObjectMetadata[List]`` in protobuf) run through warmwatch and
directly, WatchList off and on; their caches are compared whole (every object's JSON hashed,
not only namespace/name/resourceVersion) after the initial sync, after changes, and across a
warm restart. The fidelity checker (tests/goclient ``--mode fidelity``) decodes the same
protobuf LIST, WatchList and metadata LIST from both servers with client-go's codecs and
compares the items decoded and as raw bytes. And warmwatch really answered in protobuf from its
cache: protobuf shapes in its log, and its cache's list bytes are the protobuf answers' sizes.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from loadtest import goclient, kubeapi
from loadtest.cluster import ControlPlane
from loadtest.goclient import GoClient
from loadtest.sidecar import Sidecar
from tests.e2e.conftest import CreateMany, Keys, Kubectl, listed_keys

pytestmark = pytest.mark.e2e

CONFIGMAPS = 30
DEPLOYMENTS = 4
PODS = 4

KUBECTL_KINDS = {"configmaps": "configmaps", "deployments": "deployments.apps", "pods": "pods"}


def resources_in(namespace: str, *names: str) -> list[str]:
    gvr = {"configmaps": "v1/configmaps", "deployments": "apps/v1/deployments", "pods": "v1/pods"}
    return [f"{gvr[name]}@{namespace}" for name in names]


def protobuf_informer(
    start_goclient: Callable[..., GoClient],
    resources: list[str],
    watch_list: bool,
    kubeconfig: Path,
) -> GoClient:
    """client-go typed informers in protobuf (kube-controller-manager's kind), with
    whole-object digests."""
    return start_goclient(
        kubeconfig=kubeconfig,
        resources=resources,
        watch_list=watch_list,
        mode="typed",
        protobuf=True,
        object_digest=True,
    )


def kubectl_kind(resource: str) -> str:
    return KUBECTL_KINDS[resource.split("@")[0].rsplit("/", 1)[1]]


def deployment(name: str, *, replicas: int = 1) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "main", "image": "registry.invalid/none:1"}]},
            },
        },
    }


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/none:1"}]},
    }


async def wait_for_service_account(api: kubeapi.RawClient, namespace: str) -> None:
    """Pods need the namespace's default ServiceAccount (made by the controller-manager)."""
    for _ in range(100):
        try:
            await api.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
            return
        except kubeapi.ApiError:
            await asyncio.sleep(0.1)
    raise TimeoutError("no default service account")


async def populate(
    api: kubeapi.RawClient, namespace: str, create_many: CreateMany, *, pods: bool = True
) -> None:
    await create_many(namespace=namespace, count=CONFIGMAPS)
    apps = f"/apis/apps/v1/namespaces/{namespace}/deployments"
    await api.gather(api.create(apps, deployment(f"d-{i}", replicas=i)) for i in range(DEPLOYMENTS))
    if pods:
        await wait_for_service_account(api, namespace)
        await api.gather(
            api.create(f"/api/v1/namespaces/{namespace}/pods", pod(f"p-{i}")) for i in range(PODS)
        )


Change = tuple[str, str, str, str]
"""(resource, type, name, rv); a delete's RV is not in its answer: ""."""


async def churn(
    api: kubeapi.RawClient, namespace: str, resources: Sequence[str], *, pods: bool = True
) -> list[Change]:
    """Creates, updates and deletes of each kind, one at a time, in order."""
    cms, deploys = resources[0], resources[1]
    core = f"/api/v1/namespaces/{namespace}"
    apps = f"/apis/apps/v1/namespaces/{namespace}/deployments"
    changes: list[Change] = []

    def rv(obj: dict[str, Any]) -> str:
        return str(obj["metadata"]["resourceVersion"])

    for i in range(3):
        made = await api.create(
            f"{core}/configmaps", kubeapi.configmap(name=f"new-{i}", namespace=namespace)
        )
        changes.append((cms, "ADDED", f"new-{i}", rv(made)))
        name = f"cm-{i:06d}"
        made = await api.merge_patch(f"{core}/configmaps/{name}", {"data": {"changed": str(i)}})
        changes.append((cms, "MODIFIED", name, rv(made)))
        name = f"cm-{i + 20:06d}"
        await api.delete(f"{core}/configmaps/{name}")
        changes.append((cms, "DELETED", name, ""))
    for i in range(2):
        made = await api.create(apps, deployment(f"new-d-{i}", replicas=2))
        changes.append((deploys, "ADDED", f"new-d-{i}", rv(made)))
        made = await api.merge_patch(
            f"{apps}/d-{i}", {"metadata": {"labels": {"v": str(i)}}, "spec": {"replicas": 5 + i}}
        )
        changes.append((deploys, "MODIFIED", f"d-{i}", rv(made)))
    await api.delete(f"{apps}/d-{DEPLOYMENTS - 1}")
    changes.append((deploys, "DELETED", f"d-{DEPLOYMENTS - 1}", ""))
    if pods:
        podres = resources[2]
        made = await api.create(f"{core}/pods", pod("new-p-0"))
        changes.append((podres, "ADDED", "new-p-0", rv(made)))
        made = await api.merge_patch(f"{core}/pods/p-0", {"metadata": {"labels": {"v": "1"}}})
        changes.append((podres, "MODIFIED", "p-0", rv(made)))
        await api.request(
            "DELETE", f"{core}/pods/p-{PODS - 1}", body={"gracePeriodSeconds": 0}, ok=(200, 202)
        )
        changes.append((podres, "DELETED", f"p-{PODS - 1}", ""))
    return changes


def expected_keys(kubectl: Kubectl, namespace: str, resources: Sequence[str]) -> dict[str, Keys]:
    return {r: listed_keys(kubectl, kubectl_kind(r), namespace) for r in resources}


def keys_of_digest(digest: dict[str, Any]) -> Keys:
    return {tuple(i) for i in digest["items"]}  # type: ignore[misc]


def differing_objects(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Names whose whole-object hashes differ between two digests of one resource."""
    hashes_a = dict(zip((tuple(i) for i in a["items"]), a["objectHashes"], strict=True))
    hashes_b = dict(zip((tuple(i) for i in b["items"]), b["objectHashes"], strict=True))
    return sorted(
        "/".join(k) for k in hashes_a.keys() | hashes_b.keys() if hashes_a.get(k) != hashes_b.get(k)
    )


async def converge(
    reference: GoClient,
    others: Sequence[GoClient],
    expected: dict[str, Keys],
    *,
    timeout: float = 60,
) -> dict[str, dict[str, Any]]:
    """Wait until ``reference`` holds exactly ``expected`` and every other client's digest
    (items and whole objects) equals the reference's; fail with the difference."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        ref = reference.digest()
        got = [client.digest() for client in others]
        if {r: keys_of_digest(d) for r, d in ref.items()} == expected and all(
            g == ref for g in got
        ):
            return ref
        if loop.time() > deadline:
            break
        await asyncio.sleep(0.5)
    assert {r: keys_of_digest(d) for r, d in ref.items()} == expected
    for client, digests in zip(others, got, strict=True):
        for resource, digest in digests.items():
            assert keys_of_digest(digest) == keys_of_digest(ref[resource]), resource
            assert digest["objects"] == ref[resource]["objects"], object_difference(
                reference, client, resource, differing_objects(ref[resource], digest)
            )
            assert digest == ref[resource]
    raise AssertionError("not converged")


def object_difference(
    reference: GoClient, client: GoClient, resource: str, names: list[str]
) -> str:
    """The first differing object of ``resource`` in both clients, whole."""
    if not names:
        return f"{resource}: no single object differs"
    namespace, name, _ = names[0].split("/")
    key = (resource, namespace, name)
    return (
        f"{resource}: {len(names)} objects differ ({', '.join(names[:5])}...), "
        f"{client.process.args[1:3]}; the first:\n"
        f"  reference: {json.dumps(reference.dump().get(key), sort_keys=True)}\n"
        f"  client:    {json.dumps(client.dump().get(key), sort_keys=True)}"
    )


def changes_seen(client: GoClient) -> list[Change]:
    """The non-initial events: (resource, type, name, rv)."""
    return [
        (e["resource"], e["type"], e["name"], e["rv"]) for e in client.events() if not e["initial"]
    ]


def without_delete_rvs(seen: Sequence[Change]) -> list[Change]:
    """Events as churn() records changes. (A pod deleted with grace 0 also has a MODIFIED
    event, setting its deletionTimestamp, which churn() does not record.)"""
    return [(res, t, n, "" if t == "DELETED" else rv) for res, t, n, rv in seen]


def learned_shapes(sidecar: Sidecar) -> set[str]:
    """The shapes the sidecar learned (without selectors), in ``--resource`` form, from the
    line the store logs for each new one."""
    found = re.findall(
        r"shape \d+ \(new, learned\): (\S+)(?: namespace=(\S+))? (json|protobuf)$",
        sidecar.log.read_text(),
        flags=re.MULTILINE,
    )
    return {
        f"{gvr}{f'@{namespace}' if namespace else ''}{';protobuf' if encoding == 'protobuf' else ''}"
        for gvr, namespace, encoding in found
    }


async def run_fidelity(
    binary: Path,
    direct: Path,
    through: Path,
    resources: Sequence[str],
    checks: Sequence[str],
    *,
    rv: str = "",
) -> list[dict[str, Any]]:
    """The fidelity lines (``rv``: the reads' resourceVersion, "" = unset)."""
    return await asyncio.to_thread(
        goclient.fidelity,
        binary,
        kubeconfig=direct,
        other_kubeconfig=through,
        resources=resources,
        checks=checks,
        extra=[f"--rv={rv}"],
    )


def describe(lines: list[dict[str, Any]]) -> str:
    """The fidelity lines, short: what failed and why."""
    out = []
    for line in lines:
        flags = {
            k: line[k]
            for k in ("ok", "sameKeys", "decodedEqual", "rawEqual", "envelopeEqual", "sameOrder")
        }
        out.append(
            f"{line['resource']} {line['check']} {flags} "
            f"rv apiserver={line['a']['rv']} warmwatch={line['b']['rv']} "
            f"count {line['a']['count']}/{line['b']['count']}\n  "
            + "\n  ".join(line.get("differences", []))
        )
    return "\n".join(out)


# --------------------------------------------------------------------------- (a) typed informers


@pytest.mark.parametrize("watch_list", [False, True], ids=["list-watch", "watch-list"])
async def test_typed_protobuf_informers_through_warmwatch_equal_direct(
    watch_list: bool,
    plane: ControlPlane,
    namespace: str,
    kubectl: Kubectl,
    admin_api: kubeapi.RawClient,
    create_many: CreateMany,
    start_sidecar: Callable[..., Sidecar],
    start_goclient: Callable[..., GoClient],
) -> None:
    await populate(admin_api, namespace, create_many)
    resources = resources_in(namespace, "configmaps", "deployments", "pods")
    sidecar = start_sidecar()  # learns the shapes from the clients' requests

    typed = functools.partial(protobuf_informer, start_goclient, resources, watch_list)

    direct = typed(plane.admin_kubeconfig)
    through = typed(sidecar.kubeconfig)
    for client in (direct, through):
        client.wait_synced(len(resources))
    start = through.start_line()
    assert (start["mode"], start["watchList"], start.get("protobuf")) == ("typed", watch_list, True)

    expected = expected_keys(kubectl, namespace, resources)
    assert [len(expected[r]) for r in resources] == [CONFIGMAPS, DEPLOYMENTS, PODS]
    synced = {x["resource"]: x["count"] for x in through.wait_synced(len(resources))}
    assert synced == {r: len(expected[r]) for r in resources}
    # Right after the sync: the same objects, whole, as the direct informer's.
    await converge(direct, [through], expected, timeout=5)
    assert {e["initial"] for e in through.events() if e["type"] == "ADDED"} == {True}

    changes = await churn(admin_api, namespace, resources)
    await converge(direct, [through], expected_keys(kubectl, namespace, resources))
    # Every change reached the informer through warmwatch as it reached the direct one.
    seen_direct = sorted(changes_seen(direct))
    assert set(changes) <= set(without_delete_rvs(seen_direct))
    assert sorted(changes_seen(through)) == seen_direct
    # Served by protobuf shapes, learned from the client's requests.
    assert learned_shapes(sidecar) == {f"{r};protobuf" for r in resources}


# ------------------------------------------------------------------------ (b) metadata informers


@pytest.mark.parametrize("watch_list", [False, True], ids=["list-watch", "watch-list"])
async def test_metadata_informers_in_protobuf_through_warmwatch_equal_direct(
    watch_list: bool,
    plane: ControlPlane,
    namespace: str,
    kubectl: Kubectl,
    admin_api: kubeapi.RawClient,
    create_many: CreateMany,
    start_sidecar: Callable[..., Sidecar],
    start_goclient: Callable[..., GoClient],
) -> None:
    await populate(admin_api, namespace, create_many)
    resources = resources_in(namespace, "configmaps", "deployments", "pods")
    sidecar = start_sidecar()
    clients = [
        start_goclient(
            kubeconfig=kubeconfig,
            resources=resources,
            watch_list=watch_list,
            mode="metadata",
            protobuf=True,
            object_digest=True,
        )
        for kubeconfig in (plane.admin_kubeconfig, sidecar.kubeconfig)
    ]
    direct, through = clients
    for client in clients:
        client.wait_synced(len(resources))
    assert through.start_line()["watchList"] is watch_list
    await converge(direct, [through], expected_keys(kubectl, namespace, resources), timeout=5)

    changes = await churn(admin_api, namespace, resources)
    await converge(direct, [through], expected_keys(kubectl, namespace, resources))
    assert set(changes) <= set(without_delete_rvs(changes_seen(direct)))
    assert sorted(changes_seen(through)) == sorted(changes_seen(direct))
    # client-go's metadata client asks protobuf first: only protobuf shapes were made.
    assert learned_shapes(sidecar) == {f"{r};protobuf" for r in resources}


# ------------------------------------------------------------------------- (c) fidelity checker


async def test_protobuf_list_watchlist_and_metadata_list_are_byte_identical(
    plane: ControlPlane,
    namespace: str,
    kubectl: Kubectl,
    admin_api: kubeapi.RawClient,
    create_many: CreateMany,
    start_sidecar: Callable[..., Sidecar],
    goclient_binary: Path,
) -> None:
    """The same three protobuf reads from the apiserver and from warmwatch, decoded with
    client-go's codecs: the same items, decoded and as raw bytes, in the same envelopes (the
    list's own resourceVersion aside), at resourceVersion unset and "0". Again after changes,
    which reach warmwatch's cache by its upstream watch rather than its list."""
    await populate(admin_api, namespace, create_many)
    resources = resources_in(namespace, "configmaps", "deployments", "pods")
    sidecar = start_sidecar()
    checks = ("list", "watchlist", "metadata-list")

    async def compare(rv: str) -> list[dict[str, Any]]:
        expected = expected_keys(kubectl, namespace, resources)
        for _ in range(20):  # either cache may trail the other for a moment
            lines = await run_fidelity(
                goclient_binary,
                plane.admin_kubeconfig,
                sidecar.kubeconfig,
                resources,
                checks,
                rv=rv,
            )
            if all(line["sameKeys"] for line in lines):
                break
            await asyncio.sleep(0.5)
        assert [(x["resource"], x["check"]) for x in lines] == [
            (r, c) for r in resources for c in checks
        ]
        for line in lines:
            assert line["b"]["count"] == len(expected[line["resource"]]), describe([line])
            assert line["b"]["contentType"].startswith("application/vnd.kubernetes.protobuf")
            assert int(line["a"]["rv"]) > 0 and int(line["b"]["rv"]) > 0
        failed = [line for line in lines if not line["ok"]]
        assert not failed, describe(failed)
        return lines

    first = await compare("")
    await compare("0")
    await churn(admin_api, namespace, resources)
    after = await compare("")
    await compare("0")
    for before, now in zip(first, after, strict=True):
        assert now["b"]["rv"] != before["b"]["rv"]  # the changes are in


# ---------------------------------------------------------------------------- (d) warm restart


@pytest.mark.parametrize("watch_list", [False, True], ids=["list-watch", "watch-list"])
async def test_protobuf_informer_restarts_warm_without_relisting(
    watch_list: bool,
    plane: ControlPlane,
    namespace: str,
    kubectl: Kubectl,
    admin_api: kubeapi.RawClient,
    create_many: CreateMany,
    start_sidecar: Callable[..., Sidecar],
    start_goclient: Callable[..., GoClient],
) -> None:
    """A typed protobuf informer synced through warmwatch; both stopped; changes upstream;
    both started again: the client syncs from the cache and converges, warmwatch resumes its
    protobuf watches from the persisted RV with no upstream list. An informer that stayed up
    meanwhile resumes its own watch and receives exactly the changes it missed."""
    await populate(admin_api, namespace, create_many, pods=False)
    resources = resources_in(namespace, "configmaps", "deployments")
    sidecar = start_sidecar(resources=[f"{r};protobuf" for r in resources])

    typed = functools.partial(protobuf_informer, start_goclient, resources, watch_list)

    first = typed(sidecar.kubeconfig)
    # A second informer stays up across warmwatch's restart: client-go resumes its watch from
    # the last resourceVersion it saw, and must get every change it missed, in order.
    staying = typed(sidecar.kubeconfig)
    for informer in (first, staying):
        counts = {x["resource"]: x["count"] for x in informer.wait_synced(len(resources))}
        assert counts == {resources[0]: CONFIGMAPS, resources[1]: DEPLOYMENTS}
    assert sidecar.metric("warmwatch_upstream_relists_total") >= len(resources)  # the fills
    first.stop()
    assert sidecar.stop() == 0  # graceful
    changes = await churn(admin_api, namespace, resources, pods=False)
    expected = expected_keys(kubectl, namespace, resources)

    sidecar.restart()
    client = typed(sidecar.kubeconfig)
    client.wait_synced(len(resources))
    direct = typed(plane.admin_kubeconfig)
    direct.wait_synced(len(resources))
    await converge(direct, [client, staying], expected, timeout=90)  # client-go's backoff
    await asyncio.sleep(1)  # nothing more may arrive
    for resource in resources:
        made = [(t, n, r) for res, t, n, r in changes if res == resource]

        def seen(informer: GoClient, resource: str = resource) -> list[tuple[str, str, str]]:
            return [
                (t, n, r if t != "DELETED" else "")
                for res, t, n, r in changes_seen(informer)
                if res == resource
            ]

        # The restarted client: the changes its initial list lacked (none if warmwatch had
        # caught up already). The one that stayed: all of them, and nothing else (a relist
        # would repeat every object as MODIFIED).
        assert seen(client) == made[len(made) - len(seen(client)) :]
        assert seen(staying) == made
    # The restart cost no upstream list: the reflectors resumed their watches from the cache.
    assert sidecar.metric("warmwatch_upstream_relists_total") == 0
    assert sidecar.metric("warmwatch_upstream_requests_total", {"verb": "LIST"}) == 0
    assert learned_shapes(sidecar) == set()  # configured shapes served everything


async def test_protobuf_informers_start_offline_from_json_collections(
    plane: ControlPlane,
    namespace: str,
    kubectl: Kubectl,
    admin_api: kubeapi.RawClient,
    create_many: CreateMany,
    start_sidecar: Callable[..., Sidecar],
    start_goclient: Callable[..., GoClient],
) -> None:
    """warmwatch configured with JSON collections only (the simplest configuration), warm,
    then the apiserver stops: a typed protobuf informer and a metadata informer (which ask for
    protobuf first and accept JSON) start from the JSON collections and the JSON discovery
    documents instead of a 503, and once the apiserver is back they receive what changed
    meanwhile."""
    await populate(admin_api, namespace, create_many, pods=False)
    resources = resources_in(namespace, "configmaps", "deployments")
    sidecar = start_sidecar(resources=resources)  # JSON
    expected = expected_keys(kubectl, namespace, resources)
    # The pod ran before with a JSON client (client-go's dynamic informers, which read
    # unstructured objects in JSON only): warmwatch holds the JSON collections, and the
    # discovery documents in the JSON that client asked for.
    earlier = start_goclient(kubeconfig=sidecar.kubeconfig, resources=resources)
    earlier.wait_synced(len(resources))
    earlier.stop()
    assert not learned_shapes(sidecar)
    plane.stop_apiserver()
    try:
        informers = [
            start_goclient(
                kubeconfig=sidecar.kubeconfig,
                resources=resources,
                mode=mode,
                protobuf=True,
                object_digest=True,
            )
            for mode in ("typed", "metadata")
        ]
        for informer in informers:
            counts = {x["resource"]: x["count"] for x in informer.wait_synced(len(resources))}
            assert counts == {resources[0]: CONFIGMAPS, resources[1]: DEPLOYMENTS}
            for resource in resources:
                assert keys_of_digest(informer.digest()[resource]) == expected[resource]
        assert not plane.status().get("kube-apiserver")  # really offline
    finally:
        plane.start_apiserver()
    changes = await churn(admin_api, namespace, resources, pods=False)
    assert changes
    expected = expected_keys(kubectl, namespace, resources)
    for mode, informer in zip(("typed", "metadata"), informers, strict=True):
        direct = start_goclient(
            kubeconfig=plane.admin_kubeconfig,
            resources=resources,
            mode=mode,
            protobuf=True,
            object_digest=True,
        )
        direct.wait_synced(len(resources))
        await converge(direct, [informer], expected, timeout=90)
    # The protobuf collections of this namespace were learned offline and filled behind.
    assert {f"{r};protobuf" for r in resources} <= learned_shapes(sidecar)


# --------------------------------------------------------------- (e) served in protobuf, cached


async def test_protobuf_reads_are_answered_from_the_cache(
    plane: ControlPlane,
    namespace: str,
    admin_api: kubeapi.RawClient,
    create_many: CreateMany,
    start_sidecar: Callable[..., Sidecar],
    goclient_binary: Path,
) -> None:
    """warmwatch learned protobuf shapes for protobuf requests and answered the LISTs from its
    cache: its cache's list bytes are exactly the protobuf answers' sizes; nothing passed
    through."""
    await populate(admin_api, namespace, create_many, pods=False)
    resources = resources_in(namespace, "configmaps", "deployments")
    sidecar = start_sidecar()
    lines = await run_fidelity(
        goclient_binary,
        plane.admin_kubeconfig,
        sidecar.kubeconfig,
        resources,
        ("list", "metadata-list"),
    )
    assert all(line["ok"] for line in lines), describe(lines)
    assert learned_shapes(sidecar) == {f"{r};protobuf" for r in resources}
    for resource in resources:
        label = resource.split("@")[0]
        served = sum(x["b"]["bytes"] for x in lines if x["resource"] == resource)
        assert served > 0
        assert (
            sidecar.metric("warmwatch_list_bytes_total", {"resource": label, "source": "cache"})
            == served
        )
        assert sidecar.metric("warmwatch_list_bytes_total", {"resource": label}) == served
    assert sidecar.metric("warmwatch_passthrough_requests_total") == 0


# ------------------------------------------------- typed JSON clients: the same objects too


@pytest.mark.parametrize("watch_list", [False, True], ids=["list-watch", "watch-list"])
async def test_typed_json_informer_through_warmwatch_holds_the_same_objects(
    watch_list: bool,
    plane: ControlPlane,
    namespace: str,
    kubectl: Kubectl,
    admin_api: kubeapi.RawClient,
    create_many: CreateMany,
    start_sidecar: Callable[..., Sidecar],
    start_goclient: Callable[..., GoClient],
) -> None:
    """A typed client that asks for JSON (``--json``) through warmwatch is served by JSON
    shapes; its informer holds the very objects (whole, as client-go decoded them) that a
    typed protobuf client holds directly. client-go's typed decoding clears the kind and
    apiVersion of a watch event's object and of a list, not of a list's items: it keeps what
    the items carry, and the apiserver's JSON list items carry none."""
    await populate(admin_api, namespace, create_many, pods=False)
    resources = resources_in(namespace, "configmaps", "deployments")
    sidecar = start_sidecar()
    direct, through_json = (
        start_goclient(
            kubeconfig=kubeconfig,
            resources=resources,
            watch_list=watch_list,
            mode="typed",
            protobuf=not json,
            object_digest=True,
            extra=("--json",) if json else (),
        )
        for kubeconfig, json in ((plane.admin_kubeconfig, False), (sidecar.kubeconfig, True))
    )
    for client in (direct, through_json):
        client.wait_synced(len(resources))
    assert through_json.start_line().get("json") is True
    await converge(direct, [through_json], expected_keys(kubectl, namespace, resources), timeout=5)
    await churn(admin_api, namespace, resources, pods=False)
    await converge(direct, [through_json], expected_keys(kubectl, namespace, resources))
    assert learned_shapes(sidecar) == set(resources)  # JSON shapes


# ---------------------------------------------------------- the initial-events-end bookmark


async def test_watchlist_bookmarks_end_the_initial_events_as_the_apiservers_do(
    plane: ControlPlane,
    namespace: str,
    admin_api: kubeapi.RawClient,
    create_many: CreateMany,
    start_sidecar: Callable[..., Sidecar],
    goclient_binary: Path,
) -> None:
    """The initial-events-end BOOKMARK: an object of the watched kind with the annotation and
    the resourceVersion, which is all client-go reads. Its object is warmwatch's own: only
    ObjectMeta, where the apiserver's conversion of an empty object adds its defaults (a
    Deployment's spec.replicas=0). For a kind without defaults (ConfigMap) the bookmark
    decodes as the apiserver's, resourceVersions aside."""
    await populate(admin_api, namespace, create_many, pods=False)
    resources = resources_in(namespace, "configmaps", "deployments")
    sidecar = start_sidecar()
    lines = await run_fidelity(
        goclient_binary, plane.admin_kubeconfig, sidecar.kubeconfig, resources, ("watchlist",)
    )
    assert all(line["ok"] for line in lines), describe(lines)
    for line in lines:
        assert line["b"]["bookmarkAnnotations"] == {"k8s.io/initial-events-end": "true"}
        assert line["a"]["bookmarkAnnotations"] == line["b"]["bookmarkAnnotations"]
    configmaps = next(line for line in lines if line["resource"].startswith("v1/configmaps"))
    assert configmaps["bookmarkEqual"], describe([configmaps])
