"""verify_shape against an in-process fake apiserver: at the cache's RV, or (compacted)
against the latest list."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from proxy.cache import schema
from proxy.cache.inspecting import open_read_only, stored_shapes
from proxy.cache.verifying import Difference
from proxy.metrics import Metrics
from proxy.upstream.comparing import VerifySettings, verify_shape
from proxy.upstream.connecting import ConnectionSettings, Upstream, connect
from tests.unit.upstream.conftest import Served, token_kubeconfig

CACHED = {"a": "5", "b": "6", "c": "7"}
"""The cache, at RV 10."""
LATEST = {"a": "5", "b": "15", "d": "12"}
"""The apiserver at RV 20: b modified and d created after 10, c deleted."""


def database(path: Path) -> Path:
    db = sqlite3.connect(path)
    schema.migrate(db)
    db.execute(
        "INSERT INTO shapes (id, key, grp, version, resource, namespace, label_selector, "
        "field_selector, configured, rv, created_at, used_at, gen) VALUES "
        "(1, 'v1/configmaps@ns?labelSelector=app=x', '', 'v1', 'configmaps', 'ns', 'app=x', "
        "'', 1, '10', 0, 0, 1)"
    )
    db.executemany(
        "INSERT INTO objects VALUES (1, 'ns', ?, '', ?, '{}', '{}')", list(CACHED.items())
    )
    db.commit()
    db.close()
    return path


class Fake:
    def __init__(self, *, compacted: bool) -> None:
        self.compacted = compacted
        self.queries: list[dict[str, str]] = []

    async def configmaps(self, request: web.Request) -> web.Response:
        query = dict(request.query)
        self.queries.append(query)
        if query.get("resourceVersionMatch") == "Exact":
            if self.compacted:
                return web.json_response(
                    {"kind": "Status", "code": 410, "reason": "Expired"}, status=410
                )
            state, rv = CACHED, "10"
        else:
            state, rv = (
                (CACHED, "10")
                if "continue" in query and query["continue"].startswith("10:")
                else (LATEST, "20")
            )
        names = sorted(state)
        start = int(query["continue"].split(":")[1]) if "continue" in query else 0
        limit = int(query["limit"])
        page = names[start : start + limit]
        more = start + limit < len(names)
        body = {
            "kind": "ConfigMapList",
            "apiVersion": "v1",
            "metadata": {
                "resourceVersion": rv,
                **({"continue": f"{rv}:{start + limit}"} if more else {}),
            },
            "items": [
                {"metadata": {"name": n, "namespace": "ns", "resourceVersion": state[n]}}
                for n in page
            ],
        }
        return web.Response(body=orjson.dumps(body), content_type="application/json")


@pytest.fixture
async def served(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Served, Fake]]:
    fake = Fake(compacted=request.param)
    app = web.Application()
    app.router.add_get("/api/v1/namespaces/ns/configmaps", fake.configmaps)
    server = Served(app)
    await server.start()
    yield server, fake
    await server.stop()


@pytest.fixture
async def upstream(served: tuple[Served, Fake], tmp_path: Path) -> AsyncIterator[Upstream]:
    kubeconfig = token_kubeconfig(tmp_path / "kubeconfig", server=served[0].url, token="t")
    connected = await connect(ConnectionSettings(kubeconfig=str(kubeconfig)), metrics=Metrics())
    yield connected
    await connected.close()


@pytest.mark.parametrize("served", [False], indirect=True)
async def test_at_the_cache_rv_everything_is_equal(
    served: tuple[Served, Fake], upstream: Upstream, tmp_path: Path
) -> None:
    connection = open_read_only(database(tmp_path / "cache.db"))
    (shape,) = stored_shapes(connection)
    progress: list[int] = []
    verdict = await verify_shape(
        connection,
        upstream,
        shape,
        settings=VerifySettings(page_size=2, progress_interval=0),
        progress=lambda _, listed: progress.append(listed),
    )
    assert verdict.exact and verdict.list_rv == "10"
    assert verdict.comparison is not None and verdict.comparison.equal == 3
    assert verdict.comparison.differences == 0
    first, second = served[1].queries
    assert first == {
        "limit": "2",
        "resourceVersion": "10",
        "resourceVersionMatch": "Exact",
        "labelSelector": "app=x",
    }
    assert second == {"limit": "2", "labelSelector": "app=x", "continue": "10:2"}
    assert progress == [2, 3]
    assert not connection.in_transaction  # the snapshot was let go


@pytest.mark.parametrize("served", [True], indirect=True)
async def test_a_compacted_cache_rv_compares_with_the_latest_list(
    served: tuple[Served, Fake], upstream: Upstream, tmp_path: Path
) -> None:
    connection = open_read_only(database(tmp_path / "cache.db"))
    (shape,) = stored_shapes(connection)
    verdict = await verify_shape(
        connection, upstream, shape, settings=VerifySettings(page_size=2), progress=lambda *_: None
    )
    comparison = verdict.comparison
    assert comparison is not None and not verdict.exact and verdict.list_rv == "20"
    assert comparison.equal == 1
    assert comparison.counts[Difference.NEWER_UPSTREAM] == 2  # b modified, d created after 10
    assert comparison.counts[Difference.EXTRA] == 1  # c: deleted upstream, or an extra row
    assert comparison.differences == 1
