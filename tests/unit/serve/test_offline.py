"""GETs while the apiserver is unreachable: a cached object is answered from the cache in the
negotiated form; an object the cache does not hold stays 503 (never a 404 from a cache that
may be behind); in delegated mode, a ``get`` is allowed by the list or watch decisions held
for the resource."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import orjson
import pytest
from aiohttp.test_utils import make_mocked_request

from proxy.cache.freshness import RecentWrites
from proxy.cache.records import ChangeType, change_from_object, change_from_protobuf
from proxy.cache.shapes import Encoding, Request, ShapeKey, choose
from proxy.cache.store import Store, StoreSettings
from proxy.kube import protobuf
from proxy.kube.resources import GroupVersionResource, RequestPath
from proxy.kube.status import StatusError
from proxy.metrics import Metrics
from proxy.serve.context import Context, ServeSettings
from proxy.serve.offline import offline_get
from proxy.upstream.delegating import Delegation, DelegationSettings
from proxy.upstream.errors import UpstreamUnavailable
from proxy.upstream.reviewing import AccessAttributes
from tests.unit.kube.test_protobuf import configmap

CM = GroupVersionResource.parse("v1/configmaps")
PB = "application/vnd.kubernetes.protobuf"


@pytest.fixture
async def ctx(tmp_path: Path) -> Any:
    store = await Store.open(StoreSettings(path=tmp_path / "c.db"))
    json_shape = await store.ensure_shape(ShapeKey.of(CM), configured=True)
    obj = {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": "x", "namespace": "a"}}
    await store.stage(json_shape, [change_from_object(ChangeType.ADDED, obj)])
    await store.finish_list(json_shape, rv="10", kind="ConfigMap", api_version="v1")
    pb_shape = await store.ensure_shape(
        ShapeKey.of(CM, encoding=Encoding.PROTOBUF), configured=True
    )
    await store.stage(pb_shape, [change_from_protobuf(ChangeType.ADDED, configmap("x", "a", "9"))])
    await store.finish_list(pb_shape, rv="10", kind="ConfigMap", api_version="v1")

    def find(request: Request, *, namespaced: bool | None) -> Any:
        key = choose(request, store.shapes.keys(), namespaced=namespaced)
        return store.shapes.get(key) if key else None

    syncer = SimpleNamespace(find=find, has_protobuf=lambda gvr: gvr.may_have_protobuf)
    yield Context(
        store=store,
        syncer=cast(Any, syncer),
        upstream=cast(Any, None),
        discovery=cast(Any, None),
        metrics=cast(Any, None),
        settings=ServeSettings(),
        credentials="sidecar",
        learn=True,
        breaker=cast(Any, None),
        ready=lambda: (True, "ok"),
        writes=RecentWrites(),
    )
    await store.close()


async def get(
    ctx: Context, path: str, accept: str, *, token: str | None = None
) -> tuple[int, str, bytes]:
    parsed = RequestPath.parse(path)
    assert parsed is not None
    headers = {"Accept": accept}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = make_mocked_request("GET", path, headers=headers)
    response = await offline_get(ctx, parsed)(request, UpstreamUnavailable("connection refused"))
    body = getattr(response, "body", b"")
    return response.status, response.headers.get("Content-Type", ""), bytes(body)


async def test_json_and_metadata_json(ctx: Context) -> None:
    status, content_type, body = await get(
        ctx, "/api/v1/namespaces/a/configmaps/x", "application/json"
    )
    assert status == 200 and content_type == "application/json"
    assert orjson.loads(body)["metadata"]["name"] == "x"
    accept = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
    status, _, body = await get(ctx, "/api/v1/namespaces/a/configmaps/x", accept)
    assert status == 200 and orjson.loads(body)["kind"] == "PartialObjectMetadata"


async def test_protobuf_and_metadata_protobuf(ctx: Context) -> None:
    status, content_type, body = await get(
        ctx, "/api/v1/namespaces/a/configmaps/x", f"{PB},application/json"
    )
    assert status == 200 and content_type == PB
    envelope = protobuf.unwrap(body)
    assert envelope.kind == "ConfigMap" and bytes(envelope.raw) == configmap("x", "a", "9")
    accept = f"{PB};as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
    status, _, body = await get(ctx, "/api/v1/namespaces/a/configmaps/x", accept)
    envelope = protobuf.unwrap(body)
    assert (envelope.kind, envelope.api_version) == ("PartialObjectMetadata", "meta.k8s.io/v1")
    assert protobuf.object_meta(envelope.raw).resource_version == "9"


async def test_what_the_cache_does_not_hold_stays_unavailable(ctx: Context) -> None:
    for path in ("/api/v1/namespaces/a/configmaps/missing", "/api/v1/namespaces/a/secrets/x"):
        status, _, body = await get(ctx, path, "application/json")
        assert status == 503
        assert orjson.loads(body)["reason"] == "ServiceUnavailable"


class Apiserver:
    """TokenReviews and SubjectAccessReviews, answered in process; ``down`` refuses them."""

    def __init__(self) -> None:
        self.down = False
        self.allowed: set[tuple[str, str, str]] = set()
        """(user, verb, namespace) allowed."""

    async def json_request(self, method: str, target: str, **options: Any) -> dict[str, Any]:
        if self.down:
            raise UpstreamUnavailable("connection refused")
        spec = options["json"]["spec"]
        if target.endswith("/tokenreviews"):
            return {"status": {"authenticated": True, "user": {"username": spec["token"]}}}
        attrs = spec["resourceAttributes"]
        return {
            "status": {"allowed": (spec["user"], attrs["verb"], attrs["namespace"]) in self.allowed}
        }


def configmaps(verb: str, namespace: str, **selectors: str) -> AccessAttributes:
    return AccessAttributes(
        verb=verb, group="", version="v1", resource="configmaps", namespace=namespace, **selectors
    )


async def test_delegated_a_held_list_or_watch_allows_the_get(ctx: Context) -> None:
    apiserver = Apiserver()
    delegation = Delegation(
        upstream=cast(Any, apiserver), settings=DelegationSettings(), metrics=Metrics()
    )
    ctx = dataclasses.replace(ctx, delegation=delegation)
    reads = {
        "lister": configmaps("list", "a"),
        "watcher": configmaps("watch", "a"),
        "cluster-lister": configmaps("list", ""),
        "other-namespace": configmaps("list", "b"),
        "labelled": configmaps("list", "a", label_selector="app=x"),
        "one-name": configmaps("list", "a", name="x", field_selector="metadata.name=x"),
        "denied": configmaps("list", "a"),
        "never": configmaps("list", "a"),
    }
    for user, read in reads.items():
        if user not in ("denied", "never"):
            apiserver.allowed.add((user, read.verb, read.namespace))
        if user != "never":
            identity = await delegation.authenticate(user, client="127.0.0.1")
            try:
                await delegation.authorize(identity, read)
            except StatusError:
                assert user == "denied"
    apiserver.down = True
    path = "/api/v1/namespaces/a/configmaps/x"
    for user in ("lister", "watcher", "cluster-lister"):
        status, _, body = await get(ctx, path, "application/json", token=user)
        assert status == 200, user
        assert orjson.loads(body)["metadata"]["name"] == "x"
    for user in ("other-namespace", "labelled", "one-name", "denied", "never"):
        with pytest.raises(StatusError) as refused:
            await get(ctx, path, "application/json", token=user)
        assert refused.value.code == 503, user  # nothing that decides the get is held
    status, _, _ = await get(ctx, path, "application/json")  # no token: cannot be decided
    assert status == 503
    await delegation.close()
