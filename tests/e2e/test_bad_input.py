"""Bad input, side by side: each row of the apiserver's ListOptions validation, as a LIST and as a
WATCH where it applies, gets the same answer from warmwatch as from the apiserver (HTTP code,
Status reason, message, details); malformed HTTP never takes warmwatch down; odd request
targets (bad escapes, absolute-form) are answered as the apiserver answers them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from loadtest import kubeapi
from loadtest.cluster import ControlPlane
from loadtest.sidecar import Sidecar
from tests.e2e.sidebyside import (
    SideBySide,
    Writer,
    assert_same_headers,
    side_by_side,
    summary,
    watching,
)

pytestmark = pytest.mark.e2e

WATCHLIST = "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"


@pytest.fixture(scope="module")
def sidecar(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    started = Sidecar.start(
        upstream_kubeconfig=plane.admin_kubeconfig,
        db=tmp_path_factory.mktemp("bad-input") / "warmwatch.db",
        resources=["v1/configmaps"],
    )
    yield started
    started.stop()


@pytest.fixture
async def pair(plane: ControlPlane, sidecar: Sidecar) -> AsyncIterator[SideBySide]:
    async with side_by_side(plane, sidecar) as both:
        yield both


@pytest.fixture(scope="module")
def continue_token(plane: ControlPlane) -> str:
    """A valid continue token of the apiserver (a LIST with limit=1 in kube-system)."""
    context = kubeapi.client_ssl(plane.pki, identity="admin")
    with urllib.request.urlopen(
        f"{plane.server}/api/v1/namespaces/kube-system/configmaps?limit=1", context=context
    ) as answer:
        token = json.load(answer)["metadata"]["continue"]
    assert token
    return str(token)


# (id, query, verbs): "list" sends the query as is; "watch" adds watch=1 unless the query
# already says what kind of watch it is.
ROWS: list[tuple[str, str, tuple[str, ...]]] = [
    # query that does not decode: 400 BadRequest
    ("timeoutSeconds-not-a-number", "timeoutSeconds=abc", ("list", "watch")),
    ("limit-not-a-number", "limit=1x", ("list", "watch")),
    ("limit-overflows", "limit=99999999999999999999", ("list", "watch")),
    ("label-selector-syntax", "labelSelector=app%20in%20(x", ("list", "watch")),
    ("label-selector-bad-value", "labelSelector=app%3D%25zz", ("list", "watch")),
    ("field-selector-syntax", "fieldSelector=metadata.name", ("list", "watch")),
    # resourceVersionMatch: 422 Invalid (meta.k8s.io ListOptions)
    ("rvm-without-rv", "resourceVersionMatch=NotOlderThan", ("list", "watch")),
    ("rvm-exact-without-rv", "resourceVersionMatch=Exact", ("list", "watch")),
    (
        "rvm-with-continue",
        "resourceVersion=0&resourceVersionMatch=NotOlderThan&continue={token}",
        ("list",),
    ),
    (
        "watchlist-with-continue",
        f"{WATCHLIST}&allowWatchBookmarks=true&continue={{token}}",
        ("raw",),
    ),
    ("rvm-not-supported", "resourceVersion=1&resourceVersionMatch=Newest", ("list", "watch")),
    ("rvm-exact-with-rv-0", "resourceVersion=0&resourceVersionMatch=Exact", ("list",)),
    ("rvm-several-errors", "resourceVersionMatch=Foo&continue={token}", ("list",)),
    # sendInitialEvents
    ("sie-on-list", "sendInitialEvents=true", ("list",)),
    ("sie-false-on-list", "sendInitialEvents=false", ("list",)),
    ("sie-on-watch-path", "sendInitialEvents=true", ("watch-path",)),
    ("sie-without-rvm", "watch=1&sendInitialEvents=true&allowWatchBookmarks=true", ("raw",)),
    (
        "sie-with-rvm-exact",
        "watch=1&sendInitialEvents=true&resourceVersionMatch=Exact&allowWatchBookmarks=true",
        ("raw",),
    ),
    ("legacy-watch-with-continue", "watch=1&continue=abc", ("raw",)),
    # continue and resourceVersion: 400
    ("bad-continue-token", "continue=abc", ("list",)),
    ("continue-token-not-json", "continue=bm90LWpzb24", ("list",)),
    ("continue-with-rv", "continue={token}&resourceVersion=5", ("list",)),
    ("rv-not-a-number", "resourceVersion=abc", ("list", "watch", "watch-path")),
    ("rv-negative", "resourceVersion=-1", ("list", "watch")),
    ("rv-overflows", "resourceVersion=18446744073709551616", ("list", "watch")),
    # field labels the type does not support: 400
    ("unsupported-field-label", "fieldSelector=spec.foo%3Dbar", ("list", "watch")),
    ("unsupported-field-label-mixed", "fieldSelector=metadata.name%3Da,status.x%3Dy", ("list",)),
]


def requests_of(rows: list[tuple[str, str, tuple[str, ...]]]) -> list[Any]:
    return [
        pytest.param(verb, query, id=f"{row_id}-{verb}")
        for row_id, query, verbs in rows
        for verb in verbs
    ]


ACCEPTS = {
    "json": None,
    # client-go's typed clients and kube-controller-manager: the Status in protobuf
    "protobuf": "application/vnd.kubernetes.protobuf, application/json",
    # metadata informers: no transformation for errors, so the Status in JSON
    "metadata": "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;"
    "g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,"
    "application/json",
}


@pytest.mark.parametrize("client", list(ACCEPTS))
@pytest.mark.parametrize(("verb", "query"), requests_of(ROWS))
async def test_invalid_request_gets_the_apiservers_answer(
    verb: str,
    query: str,
    client: str,
    pair: SideBySide,
    namespace: str,
    continue_token: str,
) -> None:
    """Byte for byte, in the encoding the client negotiated (a protobuf client's Status is
    protobuf, as the apiserver writes it)."""
    query = query.format(token=continue_token)
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    if verb == "watch":
        query = f"watch=1&{query}"
    elif verb == "watch-path":
        path = f"/api/v1/watch/namespaces/{namespace}/configmaps"
    api, ww = await pair.get(path, query, accept=ACCEPTS[client])
    assert api.status >= 400, api  # the row is bad input for the apiserver too
    assert ww.status == api.status
    assert ww.headers.get("Content-Type") == api.headers.get("Content-Type")
    assert ww.body == api.body
    assert_same_headers(api.headers, ww.headers)


@pytest.mark.parametrize(
    ("path", "query", "accept"),
    [
        # The resource is found first (404), ...
        ("/api/v1/nosuchresources", "limit=abc", None),
        ("/api/v1/namespaces/{ns}/nosuchresources", "resourceVersionMatch=Garbage", None),
        ("/apis/nosuch.example.com/v1/things", "limit=abc", None),
        ("/apis/nosuch.example.com/v1/things", "watch=1&sendInitialEvents=true", None),
        # ... then the representation negotiated (406), ...
        ("/api/v1/namespaces/{ns}/configmaps", "limit=abc", "text/html"),
        ("/api/v1/namespaces/{ns}/configmaps", "sendInitialEvents=true", "text/html"),
        ("/api/v1/namespaces/{ns}/configmaps", "watch=1&limit=abc", "application/cbor"),
        # ... and only then the query decoded (400/422), in what warmwatch does not serve too.
        ("/api/v1/namespaces/{ns}/configmaps", "limit=abc", "application/yaml"),
        (
            "/api/v1/namespaces/{ns}/configmaps",
            "sendInitialEvents=true",
            "application/json;as=Table;v=v1;g=meta.k8s.io",
        ),
        ("/api/v1/services", "resourceVersionMatch=Garbage", None),
    ],
)
async def test_bad_queries_are_checked_in_the_apiservers_order(
    path: str, query: str, accept: str | None, pair: SideBySide, namespace: str
) -> None:
    """Found by comparing the fuzz's cases: warmwatch decoded the query first and answered
    400/422 where the apiserver answers 404 (no such resource) or 406 (no such media type)."""
    api, ww = await pair.get(path.format(ns=namespace), query, accept=accept)
    assert api.status in (400, 404, 406, 422), api
    assert ww.status == api.status
    assert ww.body == api.body


async def test_watchlist_without_bookmarks_is_accepted_like_the_apiserver(
    pair: SideBySide, namespace: str, admin_api: kubeapi.RawClient
) -> None:
    """A first reading of the protocol listed ``sendInitialEvents`` without ``allowWatchBookmarks`` as 422; the
    apiserver (1.37) accepts it and sends the initial state with no bookmark. So does
    warmwatch."""
    writer = Writer(admin_api, namespace)
    for i in range(3):
        await writer.create(f"cm-{i}")
    query = f"{WATCHLIST}&timeoutSeconds=2"
    async with watching(pair, f"/api/v1/namespaces/{namespace}/configmaps", query) as (api, ww):
        await asyncio.gather(api.wait_ended(timeout=6), ww.wait_ended(timeout=6))
    api.check_lasted(1.8)  # (its events came before any change: no retry needed)
    assert api.status == ww.status == 200
    assert sorted(summary(ww.events, bookmarks=True)) == sorted(summary(api.events, bookmarks=True))
    assert {e["type"] for e in ww.events} == {"ADDED"}


# ------------------------------------------------------------------------- malformed HTTP


def ready(sidecar: Sidecar) -> int:
    with urllib.request.urlopen(
        f"http://127.0.0.1:{sidecar.metrics_port}/readyz", timeout=5
    ) as answer:
        return int(answer.status)


async def exchange(
    port: int,
    data: bytes,
    *,
    tls: ssl.SSLContext | None = None,
    hang_up: bool = False,
    wait: float = 5,
) -> bytes:
    """Send ``data`` raw (and with ``hang_up`` end our side of the connection), and return what
    comes back until the server closes or ``wait`` seconds pass."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
    try:
        writer.write(data)
        await writer.drain()
        if hang_up:
            writer.write_eof()
        received = b""
        with contextlib.suppress(TimeoutError, ConnectionError):
            async with asyncio.timeout(wait):
                while chunk := await reader.read(65536):
                    received += chunk
        return received
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()


MALFORMED = [
    pytest.param(b"GARBAGE\r\n\r\n", id="garbage-request-line"),
    pytest.param(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64, id="tls-hello"),
    pytest.param(
        b"GET /api/v1/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: appl",
        id="truncated-headers",
    ),
    pytest.param(
        b"GET /api/v1/configmaps HTTP/1.1\r\nHost 127.0.0.1\r\n\r\n", id="header-without-colon"
    ),
    pytest.param(
        b"GET /api/v1/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: "
        + b"a" * 200_000
        + b"\r\n\r\n",
        id="huge-header",
    ),
    pytest.param(
        b"GET /api/v1/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        + b"".join(b"X-H%d: v\r\n" % i for i in range(2000))
        + b"\r\n",
        id="many-headers",
    ),
    pytest.param(
        b"GET /api/v1/" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", id="huge-path"
    ),
    pytest.param(
        b"POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"apiVersion":',
        id="body-shorter-than-content-length",
    ),
    pytest.param(
        b"POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\nnot hex\r\n",
        id="bad-chunked-body",
    ),
    pytest.param(
        b"GET /api/v1/configmaps?watch=1&labelSelector=%zz%%% HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        id="bad-percent-encoding-query",
    ),
    pytest.param(
        b"GET /api/v1/namespaces/%zz/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        id="bad-percent-encoding-path",
    ),
    pytest.param(
        b"GET /api/v1/\xff\xfe/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", id="non-utf8-path"
    ),
    pytest.param(
        b"GET /api/v1/configmaps HTTP/9.9\r\nHost: 127.0.0.1\r\n\r\n", id="unknown-http-version"
    ),
    pytest.param(
        b"GET /api/v1/configmaps?watch=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        id="watch-then-hang-up",
    ),
]


@pytest.mark.parametrize("data", MALFORMED)
async def test_malformed_http_never_takes_warmwatch_down(
    data: bytes, sidecar: Sidecar, pair: SideBySide
) -> None:
    for hang_up in (True, False):
        answer = await exchange(sidecar.port, data, hang_up=hang_up, wait=1.5)
        if answer:
            assert answer.startswith(b"HTTP/1."), answer[:200]
    assert sidecar.process.poll() is None
    assert ready(sidecar) == 200
    served = await pair.ww.get("/api/v1/namespaces/kube-system/configmaps", "resourceVersion=0")
    assert served.status == 200
    assert served.json()["kind"] == "ConfigMapList"


def parse_response(raw: bytes) -> tuple[bytes, dict[str, str], bytes]:
    """Status line, headers (lower-case names) and body (de-chunked) of a raw HTTP answer."""
    head, _, body = raw.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = {
        name.strip().lower(): value.strip()
        for name, _, value in (line.decode().partition(":") for line in lines)
    }
    if headers.get("transfer-encoding") == "chunked":
        chunks, rest = b"", body
        while rest:
            size, _, rest = rest.partition(b"\r\n")
            length = int(size, 16)
            if length == 0:
                break
            chunks, rest = chunks + rest[:length], rest[length + 2 :]
        body = chunks
    return status, headers, body


@pytest.mark.parametrize(
    "target",
    [
        "/api/v1/namespaces/{ns}/configmaps?labelSelector=%zz",
        "/api/v1/namespaces/{ns}/configmaps?limit=%zz&labelSelector=a%3Db&x;y=1",
        "/api/v1/namespaces/{ns}/configmaps?watch=1&timeoutSeconds=1&resourceVersion=%zz",
        "/api/v1/namespaces/{ns}/configmaps?timeoutSeconds=%4&watch=%",
        "/api/v1/namespaces/%zz/configmaps",
        "/api/v1/namespaces/{ns}/configmaps/%",
        # Not percent-encoding, but a request line only this test sends as it is: Go's mux
        # answers 404 to a leading "//", which warmwatch once served from the cache.
        "//api/v1/namespaces/{ns}/configmaps",
        "/api//v1/namespaces/{ns}/configmaps",
        "/api/v1/namespaces/{ns}/configmaps/",
    ],
)
async def test_bad_percent_encoding_is_answered_like_the_apiserver(
    target: str, plane: ControlPlane, sidecar: Sidecar, namespace: str
) -> None:
    """The same raw request line to both. In the query, Go drops a parameter with a bad
    escape (``URL.Query()``); in the path, Go's HTTP server refuses the request."""
    request = (
        f"GET {target.format(ns=namespace)} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    port = int(plane.server.rsplit(":", 1)[1])
    api_status, api_headers, api_body = parse_response(
        await exchange(port, request, tls=kubeapi.client_ssl(plane.pki, identity="admin"))
    )
    ww_status, ww_headers, ww_body = parse_response(await exchange(sidecar.port, request))
    assert ww_status == api_status
    assert ww_headers.get("content-type") == api_headers.get("content-type")
    if api_body.startswith(b"{"):
        api_json, ww_json = json.loads(api_body), json.loads(ww_body)
        assert ww_json["kind"] == api_json["kind"]
        assert ww_json.get("items") == api_json.get("items")
    else:
        assert ww_body == api_body


@pytest.mark.parametrize(
    "target",
    [
        "http://127.0.0.1/api/v1/namespaces/{ns}/configmaps/x",
        "http://127.0.0.1:8001/api/v1/namespaces/{ns}/configmaps/missing",
        "HTTPS://localhost/api/v1/namespaces/{ns}/configmaps/x?pretty=1",
        "ftp://user:pw@127.0.0.1/api/v1/namespaces/{ns}/configmaps/x",
        "http://127.0.0.1/api/v1/namespaces/{ns}/configmaps?labelSelector=app%3Dx",
        "http://127.0.0.1/api/v1/namespaces/{ns}/configmaps?watch=1&timeoutSeconds=1&x=%zz",
        "http://127.0.0.1/api/v1/namespaces/{ns}/configmaps/%zz",
        "http://127.0.0.1",
        "http://127.0.0.1?watch=1",
    ],
)
async def test_absolute_form_targets_are_answered_like_the_apiserver(
    target: str, plane: ControlPlane, sidecar: Sidecar, namespace: str
) -> None:
    """``GET http://host/path HTTP/1.1`` (what clients send to a proxy): Go's server routes it
    by the URL's path and query (the Host header is ignored), and so does warmwatch — a
    single-object GET passed through, a LIST from the cache (``v1/configmaps`` is cached), a
    request without a path the apiserver's plain 404."""
    async with kubeapi.RawClient(
        base_url=plane.server, ssl_context=kubeapi.client_ssl(plane.pki, identity="admin")
    ) as admin:
        await admin.ensure(
            f"/api/v1/namespaces/{namespace}/configmaps",
            kubeapi.configmap(name="x", namespace=namespace, labels={"app": "x"}),
        )
    request = (
        f"GET {target.format(ns=namespace)} HTTP/1.1\r\nHost: ignored.example\r\n"
        "Accept: application/json\r\nConnection: close\r\n\r\n"
    ).encode()
    port = int(plane.server.rsplit(":", 1)[1])
    api_status, api_headers, api_body = parse_response(
        await exchange(port, request, tls=kubeapi.client_ssl(plane.pki, identity="admin"))
    )
    # A loopback listener checks the request's host, which is the URL's (here loopback).
    ww_status, ww_headers, ww_body = parse_response(await exchange(sidecar.port, request))
    assert ww_status == api_status
    assert ww_headers.get("content-type") == api_headers.get("content-type")
    if "configmaps?" in target and api_body.startswith(b"{"):  # a LIST or a watch
        api_json = [json.loads(line) for line in api_body.splitlines()]
        ww_json = [json.loads(line) for line in ww_body.splitlines()]
        assert [(o.get("kind"), o.get("type")) for o in ww_json] == [
            (o.get("kind"), o.get("type")) for o in api_json
        ]
        assert [o.get("items") for o in ww_json] == [o.get("items") for o in api_json]
    else:
        assert ww_body == api_body


async def test_absolute_form_with_a_foreign_host_is_refused_on_loopback(
    plane: ControlPlane, sidecar: Sidecar
) -> None:
    """The URL's host is the request's (Go's ``Request.Host``), so the loopback listener's DNS
    rebinding check refuses it as it refuses such a Host header — where the apiserver, which
    checks no host, answers. (A TLS listener beyond loopback checks no host either: there it
    is answered as by the apiserver, ``test_security``.)"""
    path = "/api/v1/namespaces/kube-system"
    for target, host, expected in (
        (f"http://evil.example{path}", "127.0.0.1", 403),
        (f"http://127.0.0.1{path}", "evil.example", 200),  # the Host header is ignored
    ):
        request = (f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").encode()
        port = int(plane.server.rsplit(":", 1)[1])
        api_status, _, _ = parse_response(
            await exchange(port, request, tls=kubeapi.client_ssl(plane.pki, identity="admin"))
        )
        assert api_status == b"HTTP/1.1 200 OK"
        ww_status, _, ww_body = parse_response(await exchange(sidecar.port, request))
        assert ww_status.split(b" ")[1] == str(expected).encode(), (target, ww_body)
        if expected == 403:
            assert b"DNS rebinding" in ww_body
