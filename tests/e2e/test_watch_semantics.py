"""LIST and WATCH semantics, side by side: every request goes to warmwatch and to the real
apiserver, and the answers are compared.

warmwatch caches ``v1/configmaps`` cluster-wide, so namespaced and selector requests are served
by local filtering of that broader shape (docs/design.md §2), with selector transitions computed by
warmwatch rather than by the apiserver.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from loadtest import kubeapi
from loadtest.cluster import ControlPlane
from loadtest.sidecar import Sidecar
from proxy.cache import maintaining
from tests.e2e.sidebyside import (
    METADATA_LIST,
    METADATA_WATCH,
    Endpoint,
    Event,
    SideBySide,
    WatchStream,
    Writer,
    again_if_the_apiserver_drops_a_watch,
    assert_same_headers,
    changes,
    name_of,
    rv_of,
    side_by_side,
    status_of,
    summary,
    watching,
    without_type_meta,
)

pytestmark = pytest.mark.e2e

INITIAL_EVENTS_END = "k8s.io/initial-events-end"
WATCH_WRITE_TIMEOUT = 3.0


@pytest.fixture(scope="module")
def sidecar(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    """One warmwatch for the module: configmaps cluster-wide, a bookmark every second, slow
    watchers closed after 3 s."""
    started = Sidecar.start(
        upstream_kubeconfig=plane.admin_kubeconfig,
        db=tmp_path_factory.mktemp("watch-semantics") / "warmwatch.db",
        resources=["v1/configmaps"],
        extra=["--bookmark-interval=1", f"--watch-write-timeout={WATCH_WRITE_TIMEOUT:g}"],
    )
    yield started
    started.stop()


@pytest.fixture
async def pair(plane: ControlPlane, sidecar: Sidecar) -> AsyncIterator[SideBySide]:
    async with side_by_side(plane, sidecar) as both:
        yield both


@pytest.fixture
def ns(namespace: str) -> str:
    """A fresh namespace (the test plane publishes no ``kube-root-ca.crt``: it stays empty)."""
    return namespace


@pytest.fixture
def writer(admin_api: kubeapi.RawClient, ns: str) -> Writer:
    return Writer(admin_api, ns)


def collection(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/configmaps"


async def churn(writer: Writer, *, tag: str = "") -> None:
    """Creates, updates, relabels and deletes, then a ``sentinel`` create that marks the end."""
    await writer.create(f"a{tag}", labels={"app": "x"})
    await writer.create(f"b{tag}")
    await writer.touch(f"a{tag}")
    await writer.relabel(f"b{tag}", {"app": "y"})
    await writer.delete(f"a{tag}")
    await writer.create(f"c{tag}")
    await writer.touch(f"b{tag}")
    await writer.delete(f"c{tag}")
    await writer.create(f"sentinel{tag}", labels={"app": "x"})


async def until_sentinel(*streams: WatchStream, name: str = "sentinel") -> None:
    await asyncio.gather(*(stream.wait_for_name(name) for stream in streams))


def assert_same_events(api: WatchStream, ww: WatchStream) -> None:
    """The same events, object for object (BOOKMARKs aside: they are not changes)."""
    assert summary(ww.events) == summary(api.events)
    assert [e["object"] for e in changes(ww.events)] == [e["object"] for e in changes(api.events)]
    assert api.status == ww.status == 200
    assert_same_headers(api.headers, ww.headers)


def items_of(answer_json: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (
            i["metadata"].get("namespace", ""),
            i["metadata"]["name"],
            i["metadata"]["resourceVersion"],
        )
        for i in answer_json["items"] or []
    }


# ------------------------------------------------------------------------------- resuming


@pytest.mark.parametrize(
    "style", ["watch-parameter", "watch-path-prefix", "watch-path-prefix-and-parameter"]
)
@again_if_the_apiserver_drops_a_watch
async def test_resume_from_resource_version_sends_what_the_apiserver_sends(
    style: str, pair: SideBySide, writer: Writer, ns: str
) -> None:
    """A watch from RV N receives every change after N, identical to the apiserver's, also on
    the deprecated ``/watch/`` path."""
    for i in range(3):
        start = await writer.create(f"before-{i}")
    path, query = collection(ns), f"watch=true&resourceVersion={start}"
    if style != "watch-parameter":
        path = f"/api/v1/watch/namespaces/{ns}/configmaps"
        query = query if style.endswith("parameter") else f"resourceVersion={start}"
    async with watching(pair, path, query) as (api, ww):
        await churn(writer)
        await until_sentinel(api, ww)
    assert api.status == ww.status == 200
    assert_same_events(api, ww)
    expected = [(t, n, rv) for t, n, rv in writer.log if not n.startswith("before-")]
    assert [(t, n) for t, n, _ in summary(ww.events)] == [(t, n) for t, n, _ in expected]
    assert all(int(rv_of(e)) > int(start) for e in ww.events)


def trim_log(db: Path, *, keep: int) -> None:
    """What the periodic maintenance does with ``--retention-events=keep`` (it runs once a
    minute; the test applies it to the stopped sidecar's database instead of waiting)."""
    with contextlib.closing(sqlite3.connect(db)) as connection:
        (shape_id,) = connection.execute(
            "SELECT id FROM shapes WHERE key = 'v1/configmaps'"
        ).fetchone()
        trimmed = maintaining.trim(
            connection, shape_id=shape_id, max_events=keep, max_age=1e9, max_bytes=1 << 40
        )
        assert trimmed.dropped > 0


async def expired(endpoint_watch: Callable[[], WatchStream], rv: str) -> str:
    """Watch from ``rv``: exactly one ERROR 410 Expired, then the stream closes; returns the
    oldest resumable RV the message names."""
    async with endpoint_watch() as stream:
        await stream.wait_ended(timeout=10)
    assert stream.status == 200
    assert [e["type"] for e in stream.events] == ["ERROR"], stream.events
    status = stream.events[0]["object"]
    assert status == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": status["message"],
        "reason": "Expired",
        "code": 410,
    }
    found = re.fullmatch(rf"too old resource version: {rv} \((\d+)\)", status["message"])
    assert found, status["message"]
    assert int(found[1]) > int(rv)
    return found[1]


async def test_resource_version_older_than_the_log_is_expired_like_the_apiserver(
    plane: ControlPlane,
    sidecar: Sidecar,
    start_sidecar: Callable[..., Sidecar],
    writer: Writer,
    ns: str,
) -> None:
    """An RV older than the retained log: ERROR 410 Expired, ``too old resource version: N
    (M)``, then the stream closes — on both. M is the oldest RV a watch may resume from, and
    resuming from it works on both. The apiserver's window starts when its watch cache did
    (restart it); warmwatch's where its retention cut the log."""
    old = await writer.create("old")
    sidecar.stop()  # its upstream watch would hold up the apiserver's graceful shutdown
    try:
        plane.stop_apiserver()
        plane.start_apiserver()
    finally:
        sidecar.restart()
    sidecar = start_sidecar(resources=["v1/configmaps"], extra=["--retention-events=3"])
    async with kubeapi.RawClient(  # the old client's pooled connections died with the apiserver
        base_url=plane.server, ssl_context=kubeapi.client_ssl(plane.pki, identity="admin")
    ) as fresh:
        writer.api = fresh
        await expired_on_both_then_trimmed(plane, sidecar, writer, old)


async def expired_on_both_then_trimmed(
    plane: ControlPlane, sidecar: Sidecar, writer: Writer, old: str
) -> None:
    path = collection(writer.namespace)
    rvs = [await writer.touch("old") for _ in range(8)]
    async with side_by_side(plane, sidecar) as pair:
        query = f"watch=1&resourceVersion={old}"
        oldest = {
            endpoint.name: await expired(lambda e=endpoint: e.watch(path, query), old)
            for endpoint in pair.both
        }
        for endpoint in pair.both:  # M itself is resumable
            async with endpoint.watch(
                path, f"watch=1&resourceVersion={oldest[endpoint.name]}"
            ) as stream:
                await stream.wait_until(
                    lambda events: rv_of(events[-1]) == rvs[-1] if events else False
                )
            assert "ERROR" not in {e["type"] for e in stream.events}

    # The log retention cuts warmwatch's log: RVs before the cut are now too old.
    sidecar.stop()
    trim_log(sidecar.db, keep=3)
    sidecar.restart()
    async with side_by_side(plane, sidecar) as pair:
        cut = await expired(
            lambda: pair.ww.watch(path, f"watch=1&resourceVersion={rvs[1]}"), rvs[1]
        )
        assert int(cut) <= int(rvs[-1])
        async with watching(pair, path, f"watch=1&resourceVersion={cut}") as (api, ww):
            await writer.create("sentinel")
            await until_sentinel(api, ww)
        assert_same_events(api, ww)
        assert [rv for _, _, rv in summary(ww.events)[:-1]] == [r for r in rvs if int(r) > int(cut)]


# ------------------------------------------------------------------------- initial state


def replay_matches(
    events: list[Event], *, before: dict[str, str], writes: list[tuple[str, str, str]]
) -> int | None:
    """The k for which ``events`` are the state after ``writes[:k]`` as ADDED (any order), then
    exactly ``writes[k:]`` in order: no gap, no duplicate. None when there is none."""
    state = dict(before)
    seen = summary(events)
    for k in range(len(writes) + 1):
        if k:
            kind, name, rv = writes[k - 1]
            if kind == "DELETED":
                state.pop(name, None)
            else:
                state[name] = rv
        initial, live = seen[: len(state)], seen[len(state) :]
        if {("ADDED", n, rv) for n, rv in state.items()} != set(initial):
            continue
        if len(live) == len(writes) - k and all(
            (t, n) == (wt, wn) and (rv == wrv or wt == "DELETED")
            for (t, n, rv), (wt, wn, wrv) in zip(live, writes[k:], strict=True)
        ):
            return k
    return None


@pytest.mark.parametrize(
    ("watch_path", "query"),
    [
        (False, "watch=1"),
        (False, "watch=1&resourceVersion=0"),
        (True, "allowWatchBookmarks=true"),  # not defaulted to a WatchList: no annotated bookmark
    ],
    ids=["rv-unset", "rv-0", "watch-path-with-bookmarks"],
)
@again_if_the_apiserver_drops_a_watch
async def test_initial_state_then_live_events_without_gap_or_duplicate(
    watch_path: bool, query: str, pair: SideBySide, writer: Writer, ns: str
) -> None:
    """RV unset or "0": synthetic ADDED for the state, then every later change exactly once —
    while changes are being made as the watch starts."""
    for i in range(10):
        await writer.create(f"cm-{i}")
    listed = (await pair.api.get(collection(ns))).json()
    before = {i["metadata"]["name"]: i["metadata"]["resourceVersion"] for i in listed["items"]}
    writer.log.clear()

    started = asyncio.Event()

    async def write() -> None:
        for i in range(30):
            if i == 8:
                started.set()
            if i % 3 == 0:
                await writer.create(f"new-{i}")
            elif i % 3 == 1:
                await writer.touch(f"cm-{i // 3}")
            else:
                await writer.delete(f"cm-{i // 3}")
        await writer.create("sentinel")

    path = f"/api/v1/watch/namespaces/{ns}/configmaps" if watch_path else collection(ns)
    writing_task = asyncio.create_task(write())
    await started.wait()
    async with watching(pair, path, query) as (api, ww):
        await writing_task
        await until_sentinel(api, ww)
    for stream in (api, ww):
        k = replay_matches(stream.events, before=before, writes=writer.log)
        assert k is not None, (stream.endpoint.name, summary(stream.events), writer.log)
        bookmarks = [e for e in stream.events if e["type"] == "BOOKMARK"]
        if "allowWatchBookmarks" not in query:
            assert bookmarks == []
        assert not any(b["object"]["metadata"].get("annotations") for b in bookmarks)


@pytest.mark.parametrize(
    "query",
    [
        "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
        "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&resourceVersion={rv}",
        "watch=1&allowWatchBookmarks=true",  # the apiserver defaults this to a WatchList
        "watch=1&allowWatchBookmarks=true&resourceVersion=0",
    ],
    ids=["watchlist", "watchlist-not-older-than", "defaulted-rv-unset", "defaulted-rv-0"],
)
@again_if_the_apiserver_drops_a_watch
async def test_watch_list_initial_events_then_annotated_bookmark_then_changes(
    query: str, pair: SideBySide, writer: Writer, ns: str
) -> None:
    for i in range(5):
        rv = await writer.create(f"cm-{i}")
    state = items_of((await pair.api.get(collection(ns))).json())
    async with watching(pair, collection(ns), query.format(rv=rv)) as (api, ww):

        def initial_end(events: list[Event]) -> int | None:
            """Index of the initial-events-end bookmark (a periodic one may follow it
            before this is looked at)."""
            return next(
                (
                    i
                    for i, e in enumerate(events)
                    if e["type"] == "BOOKMARK"
                    and (e["object"]["metadata"].get("annotations") or {}).get(INITIAL_EVENTS_END)
                ),
                None,
            )

        def ended_initial(events: list[Event]) -> bool:
            return initial_end(events) is not None

        await asyncio.gather(api.wait_until(ended_initial), ww.wait_until(ended_initial))
        initial = {s.endpoint.name: initial_end(s.events) or 0 for s in (api, ww)}
        writer.log.clear()
        await churn(writer)
        await until_sentinel(api, ww)

    shapes = {}
    for stream in (api, ww):
        n = initial[stream.endpoint.name]
        added, bookmark = stream.events[:n], stream.events[n]
        assert {e["type"] for e in added} == {"ADDED"}
        assert {(ns, name_of(e), rv_of(e)) for e in added} == state
        assert bookmark["object"]["kind"] == "ConfigMap"
        assert bookmark["object"]["apiVersion"] == "v1"
        metadata = bookmark["object"]["metadata"]
        assert metadata["annotations"] == {INITIAL_EVENTS_END: "true"}
        assert int(metadata["resourceVersion"]) >= max(int(rv) for _, _, rv in state)
        shapes[stream.endpoint.name] = (sorted(bookmark["object"]), sorted(metadata))
        live = summary(stream.events[n + 1 :])
        assert [(t, name) for t, name, _ in live] == [(t, name) for t, name, _ in writer.log]
    assert shapes["warmwatch"] == shapes["apiserver"]
    assert summary(ww.events[initial["warmwatch"] + 1 :]) == summary(
        api.events[initial["apiserver"] + 1 :]
    )


@pytest.mark.parametrize("rv", ["", "&resourceVersion=0"], ids=["rv-unset", "rv-0"])
@again_if_the_apiserver_drops_a_watch
async def test_send_initial_events_false_starts_from_now(
    rv: str, pair: SideBySide, writer: Writer, ns: str
) -> None:
    """``sendInitialEvents=false``: no initial state, only the changes made after the start."""
    for i in range(3):
        last = await writer.create(f"cm-{i}")
    assert (await pair.ww.get(collection(ns), f"resourceVersion={last}")).status == 200
    query = f"watch=1&sendInitialEvents=false&resourceVersionMatch=NotOlderThan{rv}"
    async with watching(pair, collection(ns), query) as (api, ww):
        writer.log.clear()
        await churn(writer)
        await until_sentinel(api, ww)
    assert_same_events(api, ww)
    assert [(t, n) for t, n, _ in summary(ww.events)] == [(t, n) for t, n, _ in writer.log]


@again_if_the_apiserver_drops_a_watch
async def test_periodic_bookmarks_are_well_formed_and_resumable(
    pair: SideBySide, writer: Writer, ns: str
) -> None:
    """``allowWatchBookmarks``: warmwatch (``--bookmark-interval=1``) sends BOOKMARKs of the
    watched kind carrying only an RV; a watch resumed from that RV, on warmwatch or on the
    apiserver, continues with the same events. (The apiserver's own come about once a minute.)"""
    start = await writer.create("cm")
    async with pair.ww.watch(
        collection(ns), f"watch=1&allowWatchBookmarks=true&resourceVersion={start}"
    ) as ww:
        await ww.wait_until(lambda events: len(events) >= 2, timeout=5)
    assert [e["type"] for e in ww.events[:2]] == ["BOOKMARK", "BOOKMARK"]
    for event in ww.events[:2]:
        assert event["object"] == {
            "kind": "ConfigMap",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": rv_of(event)},
        }
        assert int(rv_of(event)) >= int(start)
    bookmark = rv_of(ww.events[1])
    async with watching(pair, collection(ns), f"watch=1&resourceVersion={bookmark}") as (api, ww):
        await writer.touch("cm")
        await writer.create("sentinel")
        await until_sentinel(api, ww)
    assert_same_events(api, ww)
    assert [(t, n) for t, n, _ in summary(ww.events)] == [("MODIFIED", "cm"), ("ADDED", "sentinel")]


@pytest.mark.parametrize("traffic", ["quiet", "busy"])
@again_if_the_apiserver_drops_a_watch
async def test_timeout_seconds_ends_the_stream_in_time(
    traffic: str, pair: SideBySide, writer: Writer, ns: str
) -> None:
    """``timeoutSeconds=2``: both end the stream normally after ~2 s, also while events flow."""
    start = await writer.create("cm")
    stop = asyncio.Event()

    async def busy() -> None:
        while not stop.is_set():
            await writer.touch("cm")
            await asyncio.sleep(0.05)

    task = asyncio.create_task(busy()) if traffic == "busy" else None
    try:
        query = f"watch=1&resourceVersion={start}&timeoutSeconds=2&allowWatchBookmarks=true"
        async with watching(pair, collection(ns), query) as (api, ww):
            await asyncio.gather(api.wait_ended(timeout=6), ww.wait_ended(timeout=6))
    finally:
        stop.set()
        if task is not None:
            await task
    api.check_lasted(1.8)
    for stream in (api, ww):
        assert stream.status == 200
        assert 1.8 <= stream.elapsed <= 3.5, (stream.endpoint.name, stream.elapsed)
        assert "ERROR" not in {e["type"] for e in stream.events}
        if traffic == "busy":
            assert len(changes(stream.events)) >= 5
    if traffic == "quiet":
        assert changes(api.events) == changes(ww.events) == []


# ----------------------------------------------------------------------------- filtering


@again_if_the_apiserver_drops_a_watch
async def test_label_selector_transitions_match_the_apiserver(
    pair: SideBySide, writer: Writer, ns: str
) -> None:
    """A label-selector watch served from the cluster-wide shape: objects that stop matching
    are DELETED (previous object, new RV), those that start matching ADDED — as the apiserver
    computes them itself."""
    start = await writer.create("a", labels={"app": "x"})
    await writer.create("b", labels={"app": "y"})
    await writer.create("c")
    path, selector = collection(ns), "labelSelector=app%3Dx"
    initial_query = f"watch=1&resourceVersion=0&{selector}"
    async with (
        watching(pair, path, f"watch=1&resourceVersion={start}&{selector}") as (api, ww),
        watching(pair, path, initial_query) as (api_initial, ww_initial),
    ):
        await writer.touch("a")  # MODIFIED
        await writer.relabel("a", {"app": "y"})  # DELETED (previous object, new RV)
        await writer.touch("a")  # nothing
        await writer.relabel("b", {"app": "x"})  # ADDED
        await writer.relabel("c", {"app": "x", "tier": "web"})  # ADDED
        await writer.relabel("c", {"tier": None})  # MODIFIED
        await writer.relabel("a", {"app": "x"})  # ADDED
        await writer.delete("b")  # DELETED
        await writer.relabel("c", {"app": None})  # DELETED (previous object, new RV)
        await writer.delete("c")  # nothing
        await writer.create("d", labels={"app": "z"})  # nothing
        await writer.create("sentinel", labels={"app": "x"})
        await until_sentinel(api, ww, api_initial, ww_initial)
    assert_same_events(api, ww)
    assert [(t, n) for t, n, _ in summary(ww.events)] == [
        ("MODIFIED", "a"),
        ("DELETED", "a"),
        ("ADDED", "b"),
        ("ADDED", "c"),
        ("MODIFIED", "c"),
        ("ADDED", "a"),
        ("DELETED", "b"),
        ("DELETED", "c"),
        ("ADDED", "sentinel"),
    ]
    transition = ww.events[1]["object"]
    assert transition["metadata"]["labels"] == {"app": "x"}  # the previous object
    assert rv_of(ww.events[1]) == writer.log[4][2]  # at the relabel's RV
    assert summary(ww_initial.events)[0] == summary(api_initial.events)[0] == ("ADDED", "a", start)
    assert_same_events(api_initial, ww_initial)


@pytest.mark.parametrize(
    ("where", "query", "both_namespaces"),
    [
        ("namespace-path", "", False),
        ("metadata.namespace", "fieldSelector=metadata.namespace%3D{ns}", False),
        ("metadata.name", "fieldSelector=metadata.name%3Dshared", True),
        (
            "metadata.name!=",
            "fieldSelector=metadata.name!%3Dshared,metadata.namespace%3D{ns}",
            False,
        ),
    ],
)
@again_if_the_apiserver_drops_a_watch
async def test_namespace_and_field_filtering_of_the_cluster_wide_shape(
    where: str,
    query: str,
    both_namespaces: bool,
    pair: SideBySide,
    writer: Writer,
    ns: str,
    admin_api: kubeapi.RawClient,
) -> None:
    """Requests narrower than the cached shape are filtered locally, and agree with the
    apiserver: LIST now, then WATCH from that LIST's RV while two namespaces change."""
    other = Writer(admin_api, f"{ns}-other")
    await kubeapi.ensure_namespace(admin_api, other.namespace)
    for w in (writer, other):
        await w.create("shared")
        await w.create("own")
    path = collection(ns) if where == "namespace-path" else "/api/v1/configmaps"
    query = query.format(ns=ns)
    listed = "&".join(q for q in (f"resourceVersion={writer.log[-1][2]}", query) if q)
    api_list, ww_list = await pair.get(path, listed)
    assert api_list.status == ww_list.status == 200
    assert items_of(ww_list.json()) == items_of(api_list.json())
    assert {(ns, "shared", writer.log[0][2]), (ns, "own", writer.log[1][2])} & items_of(
        ww_list.json()
    )

    start = ww_list.json()["metadata"]["resourceVersion"]
    async with watching(pair, path, f"watch=1&resourceVersion={start}&{query}") as (api, ww):
        for w in (other, writer):
            await w.touch("shared")
            await w.touch("own")
            await w.delete("own")
            await w.create("new")
        # the last change, one that every variant sees
        last = await (writer.touch("shared") if both_namespaces else writer.create("last"))
        await asyncio.gather(
            *(s.wait_until(lambda events: any(rv_of(e) == last for e in events)) for s in (api, ww))
        )
    assert_same_events(api, ww)
    namespaces = {e["object"]["metadata"]["namespace"] for e in ww.events}
    assert namespaces == ({ns, other.namespace} if both_namespaces else {ns})


# ---------------------------------------------------------------------------- slow readers


async def test_a_stuck_watcher_is_closed_while_the_others_receive_everything(
    pair: SideBySide, sidecar: Sidecar, writer: Writer, ns: str
) -> None:
    """One client stops reading: warmwatch closes its connection within the write timeout
    (``--watch-write-timeout=3``), and ten watchers of the same shape that read receive every
    event meanwhile, undelayed."""
    start = await writer.create("first")
    path, query = collection(ns), f"watch=1&resourceVersion={start}"
    stuck = socket.socket()
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills quickly
    stuck.connect(("127.0.0.1", sidecar.port))
    stuck.sendall(f"GET {path}?{query} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    try:
        async with contextlib.AsyncExitStack() as stack:
            readers = [
                await stack.enter_async_context(pair.ww.watch(path, query)) for _ in range(10)
            ]
            # 8 MB: more than the socket buffers take in (the kernel's autotuned send buffer
            # is at most tcp_wmem's 4 MiB; the stuck client's receive buffer 4 KiB) plus
            # aiohttp's own, so warmwatch's writes to the stuck client block.
            for i in range(16):
                await writer.create(f"big-{i:02d}", size=500_000)
            written = time.monotonic()
            await writer.create("sentinel")
            await until_sentinel(*readers)
            expected = [("ADDED", n, rv) for _, n, rv in writer.log[1:]]
            for reader in readers:
                assert summary(reader.events) == expected
            closed = await closed_by_peer(stuck, timeout=WATCH_WRITE_TIMEOUT + 5)
            assert closed, "warmwatch kept the stuck watcher's connection"
            assert time.monotonic() - written <= WATCH_WRITE_TIMEOUT + 5
            # The others are still being served.
            await writer.create("after")
            await until_sentinel(*readers, name="after")
    finally:
        stuck.close()


def tcp_state(local_port: int, remote_port: int) -> str | None:
    """The kernel's state of a loopback TCP connection (``/proc/net/tcp``), None when gone."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, state = fields[1], fields[2], fields[3]
        if (
            int(local.split(":")[1], 16) == local_port
            and int(remote.split(":")[1], 16) == remote_port
        ):
            return state
    return None


async def closed_by_peer(connection: socket.socket, *, timeout: float) -> bool:
    """The peer closed (reset) a connection we never read, within ``timeout``. (A FIN could
    not reach us: it queues behind the data we do not read.)"""
    local, remote = connection.getsockname()[1], connection.getpeername()[1]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if tcp_state(local, remote) != "01":  # 01 = ESTABLISHED
            return True
        await asyncio.sleep(0.1)
    return False


# ---------------------------------------------------------------------------------- LIST


@pytest.mark.parametrize(
    "query",
    [
        "",
        "resourceVersion=0",
        "resourceVersion={rv}",
        "resourceVersion={rv}&resourceVersionMatch=NotOlderThan",
        "resourceVersion=0&resourceVersionMatch=NotOlderThan",
        "resourceVersion=0&limit=2",
        "labelSelector=app%3Dx",
        "labelSelector=app%20notin%20(x)",
    ],
)
async def test_list_equals_the_apiservers(
    query: str, pair: SideBySide, writer: Writer, ns: str
) -> None:
    for i in range(12):
        rv = await writer.create(f"cm-{i:02d}", labels={"app": "x" if i % 2 else "y"})
    query = query.format(rv=rv)
    # warmwatch must have reached the last write; then both answer for the same state.
    assert (await pair.ww.get(collection(ns), f"resourceVersion={rv}")).status == 200
    api, ww = await pair.get(collection(ns), query)
    assert api.status == ww.status == 200
    assert ww.headers["Content-Type"] == api.headers["Content-Type"] == "application/json"
    assert_same_headers(api.headers, ww.headers)
    api_list, ww_list = api.json(), ww.json()
    assert (ww_list["kind"], ww_list["apiVersion"]) == ("ConfigMapList", "v1")
    assert (api_list["kind"], api_list["apiVersion"]) == ("ConfigMapList", "v1")
    assert items_of(ww_list) == items_of(api_list)
    assert [without_type_meta(i) for i in ww_list["items"]] == [
        without_type_meta(i) for i in api_list["items"]
    ]
    assert set(ww_list["metadata"]) == set(api_list["metadata"]) == {"resourceVersion"}
    assert int(ww_list["metadata"]["resourceVersion"]) >= int(rv)
    assert ww.body.endswith(b"\n")


async def test_list_limit_pages_like_the_apiserver_or_whole_from_the_cache(
    pair: SideBySide, writer: Writer, ns: str
) -> None:
    """``limit`` with RV N is an exact, paginated read: passed through, the same pages and
    tokens as the apiserver's. With RV unset warmwatch answers from the cache and ignores
    ``limit`` (docs/design.md §5, as the watch cache does for RV "0"): one whole answer, no
    ``continue``, holding what the apiserver's pages add up to."""
    for i in range(5):
        rv = await writer.create(f"cm-{i}")
    assert (await pair.ww.get(collection(ns), f"resourceVersion={rv}")).status == 200

    async def pages(endpoint: Endpoint, query: str) -> list[dict[str, Any]]:
        answers, token = [], None
        while True:  # the next pages: limit and the token only
            page = (
                await endpoint.get(collection(ns), f"limit=2&continue={token}" if token else query)
            ).json()
            answers.append(page)
            token = page["metadata"].get("continue")
            if not token:
                return answers

    exact = f"limit=2&resourceVersion={rv}"
    api_pages, ww_pages = await pages(pair.api, exact), await pages(pair.ww, exact)
    assert ww_pages == api_pages
    assert [len(p["items"]) for p in ww_pages] == [2, 2, 1]

    api_pages, ww_pages = await pages(pair.api, "limit=2"), await pages(pair.ww, "limit=2")
    assert len(ww_pages) == 1 and len(api_pages) == 3
    assert [without_type_meta(i) for i in ww_pages[0]["items"]] == [
        without_type_meta(i) for p in api_pages for i in p["items"]
    ]


async def test_list_not_older_than_a_future_rv_times_out_like_the_apiserver(
    pair: SideBySide, ns: str
) -> None:
    future = "999999999"
    query = f"resourceVersion={future}&resourceVersionMatch=NotOlderThan"
    started = time.monotonic()
    api, ww = await pair.get(collection(ns), query)
    assert time.monotonic() - started < 8
    assert api.status == ww.status == 504
    assert ww.headers["Retry-After"] == api.headers["Retry-After"] == "1"
    assert_same_headers(api.headers, ww.headers)
    api_status, ww_status = status_of(api), status_of(ww)
    pattern = rf"Timeout: Too large resource version: {future}, current: (\d+)"
    assert re.fullmatch(pattern, api_status["message"])
    assert re.fullmatch(pattern, ww_status["message"])
    del api_status["message"], ww_status["message"]
    assert ww_status == api_status
    assert ww.body.endswith(b"\n") and api.body.endswith(b"\n")


@again_if_the_apiserver_drops_a_watch
async def test_watch_from_an_rv_not_reached_yet_waits_for_it_like_the_apiserver(
    pair: SideBySide, writer: Writer, ns: str
) -> None:
    """A watch from an RV ahead of the server is no error: it waits for that RV, then sends
    the changes after it. One far ahead just ends at ``timeoutSeconds`` with nothing sent."""
    rv = await writer.create("cm")
    ahead = str(int(rv) + 3)
    async with (
        watching(pair, collection(ns), f"watch=1&resourceVersion={ahead}") as (api, ww),
        watching(pair, collection(ns), "watch=1&resourceVersion=999999999&timeoutSeconds=2") as (
            api_far,
            ww_far,
        ),
    ):
        for _ in range(6):
            await writer.touch("cm")
        await writer.create("sentinel")
        await until_sentinel(api, ww)
        await asyncio.gather(api_far.wait_ended(timeout=6), ww_far.wait_ended(timeout=6))
    api_far.check_lasted(1.8)
    assert_same_events(api, ww)
    assert all(int(rv_of(e)) > int(ahead) for e in ww.events)
    assert 0 < len(changes(ww.events)) < 7
    for stream in (api_far, ww_far):
        assert stream.status == 200
        assert stream.events == []
        assert 1.8 <= stream.elapsed <= 3.5


def without_rv(answer: dict[str, Any]) -> dict[str, Any]:
    return {**answer, "metadata": {**answer["metadata"], "resourceVersion": "(any)"}}


# ------------------------------------------------------------------------- metadata only


@again_if_the_apiserver_drops_a_watch
async def test_metadata_only_list_and_watch_match_the_apiserver(
    pair: SideBySide, writer: Writer, ns: str
) -> None:
    """``as=PartialObjectMetadataList`` / ``as=PartialObjectMetadata``: objects reduced to their
    metadata, equal to the apiserver's."""
    for i in range(4):
        rv = await writer.create(f"cm-{i}", labels={"i": str(i)})
    assert (await pair.ww.get(collection(ns), f"resourceVersion={rv}")).status == 200
    api, ww = await pair.get(collection(ns), accept=METADATA_LIST)
    assert api.status == ww.status == 200
    assert ww.headers["Content-Type"] == api.headers["Content-Type"]
    api_list, ww_list = api.json(), ww.json()
    assert ww_list["kind"] == api_list["kind"] == "PartialObjectMetadataList"
    assert ww_list["apiVersion"] == api_list["apiVersion"] == "meta.k8s.io/v1"
    assert ww_list["items"] == api_list["items"]
    assert {i["kind"] for i in ww_list["items"]} == {"PartialObjectMetadata"}
    assert len(ww_list["items"]) == 4

    empty = f"/api/v1/namespaces/{ns}-empty/configmaps"
    api_empty, ww_empty = await pair.get(empty, accept=METADATA_LIST)
    assert api_empty.status == ww_empty.status == 200
    assert without_rv(ww_empty.json()) == without_rv(api_empty.json())
    assert ww_empty.json()["items"] is None  # Go's nil slice, as the apiserver writes it
    api_empty, ww_empty = await pair.get(empty)
    assert without_rv(ww_empty.json()) == without_rv(api_empty.json())
    assert ww_empty.json()["items"] == []

    query = f"watch=1&resourceVersion={rv}"
    async with watching(pair, collection(ns), query, accept=METADATA_WATCH) as (api_w, ww_w):
        await writer.touch("cm-1")
        await writer.relabel("cm-2", {"i": "changed"})
        await writer.delete("cm-3")
        await writer.create("sentinel")
        await until_sentinel(api_w, ww_w)
    assert_same_events(api_w, ww_w)
    assert {e["object"]["kind"] for e in ww_w.events} == {"PartialObjectMetadata"}
    assert set(ww_w.events[0]["object"]) == {"kind", "apiVersion", "metadata"}
