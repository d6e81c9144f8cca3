"""Discovery documents stored or read back name the resources of the ``resource`` metric
label (proxy/app.py StoredDiscovery)."""

from __future__ import annotations

from pathlib import Path

import orjson

from proxy.app import StoredDiscovery
from proxy.cache.store import Store, StoreSettings
from proxy.metrics import OTHER, ResourceNames
from proxy.upstream.discovering import CachedDocument, discovery_key

AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


def document(body: object) -> CachedDocument:
    return CachedDocument(
        status=200,
        headers=(("Content-Type", "application/json"),),
        body=orjson.dumps(body),
        etag=None,
    )


def key(path: str, *, query: str = "", accept: str = "") -> str:
    made = discovery_key(path=path, query=query, accept=accept, user_agent="")
    assert made is not None
    return made


def aggregated(*resources: str) -> CachedDocument:
    return document(
        {
            "kind": "APIGroupDiscoveryList",
            "items": [
                {
                    "metadata": {"name": "apps"},
                    "versions": [
                        {"version": "v1", "resources": [{"resource": r} for r in resources]}
                    ],
                }
            ],
        }
    )


async def test_documents_stored_or_read_back_name_resources(tmp_path: Path) -> None:
    store = await Store.open(StoreSettings(path=tmp_path / "c.db"))
    try:
        names = ResourceNames()
        stored = StoredDiscovery(store, resources=names)
        apis = key("/apis", query="timeout=32s", accept=AGGREGATED)
        await stored.put(apis, aggregated("deployments", "statefulsets"))
        assert names.label("apps/v1/deployments") == "apps/v1/deployments"
        assert names.label("x1.example/v1/r1q") == OTHER

        # The same path in another representation (APIGroupList) names nothing: kept.
        groups = document({"kind": "APIGroupList", "groups": [{"name": "apps"}]})
        await stored.put(key("/apis"), groups)
        assert names.label("apps/v1/statefulsets") == "apps/v1/statefulsets"

        # A new answer replaces what the path named.
        await stored.put(apis, aggregated("deployments"))
        assert names.label("apps/v1/statefulsets") == OTHER

        # A path that names no resources is not read (an OpenAPI document is MiBs).
        fake = aggregated("made-up")
        await stored.put(key("/openapi/v2"), fake)
        assert names.label("apps/v1/made-up") == OTHER

        # Read back from the file (a revalidation, or an offline start after a restart).
        later = ResourceNames()
        assert await StoredDiscovery(store, resources=later).get(apis) is not None
        assert later.label("apps/v1/deployments") == "apps/v1/deployments"
    finally:
        await store.close()
