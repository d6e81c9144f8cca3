"""The request target as Go's HTTP server reads it: an absolute-form target is routed by its
path and query, and its host is the request's host for the loopback Host check."""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from proxy.kube.status import StatusError
from proxy.serve import authenticating, routing

Seen = list[tuple[str, str, str, str]]


async def _route(target: str, *, host: str, seen: Seen) -> web.StreamResponse:
    """``target`` through the target and authentication middlewares (``none`` mode)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append((request.raw_path, request.path, request.query_string, request.host))
        return web.Response(text="ok")

    guard = authenticating.middleware(authenticating.ClientAuth(mode="none"))

    async def guarded(request: web.Request) -> web.StreamResponse:
        return await guard(request, handler)

    request = make_mocked_request("GET", target, headers={"Host": host})
    return await routing.request_target(request, guarded)


async def test_an_absolute_form_target_is_routed_by_its_path_and_query() -> None:
    seen: Seen = []
    target = "http://127.0.0.1:8001/api/v1/namespaces/a/configmaps/x%2Fy?limit=1&a=%20"
    answer = await _route(target, host="ignored.example", seen=seen)
    assert answer.status == 200
    # The URL's host is the request's, as in Go: the Host header is ignored.
    assert seen == [
        (
            "/api/v1/namespaces/a/configmaps/x%2Fy?limit=1&a=%20",
            "/api/v1/namespaces/a/configmaps/x/y",
            "limit=1&a= ",
            "127.0.0.1",
        )
    ]


async def test_an_absolute_form_target_without_a_path_is_not_found() -> None:
    seen: Seen = []
    for target in ("http://127.0.0.1", "http://127.0.0.1?watch=1", "http:opaque"):
        answer = await _route(target, host="127.0.0.1", seen=seen)
        assert isinstance(answer, web.Response)
        assert (answer.status, answer.text) == (404, "404 page not found\n")
        assert answer.content_type == "text/plain"
    assert seen == []


async def test_an_absolute_form_target_with_a_foreign_host_is_refused_on_loopback() -> None:
    seen: Seen = []
    with pytest.raises(StatusError) as refused:
        await _route("http://evil.example/api/v1/namespaces", host="127.0.0.1", seen=seen)
    assert refused.value.code == 403 and "DNS rebinding" in refused.value.message
    # Rejected paths are matched on the path, whatever the form.
    with pytest.raises(StatusError) as rejected:
        await _route("http://localhost/api/v1/nodes/n/proxy/run/a/b/c", host="x", seen=seen)
    assert "--reject-paths" in rejected.value.message
    assert seen == []
