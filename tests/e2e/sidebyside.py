"""Send the same LIST/WATCH to warmwatch and to the real apiserver, and compare the answers.

An :class:`Endpoint` is one server (the apiserver over TLS as admin, or warmwatch over plain
HTTP); queries are sent exactly as written (already encoded), so both servers parse the same
bytes. :class:`WatchStream` collects a watch's events in the background so a test can make
changes while both streams run, then wait until each has seen the same point.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import aiohttp
import orjson
from yarl import URL

from loadtest import kubeapi
from loadtest.cluster import ControlPlane
from loadtest.sidecar import Sidecar

Event = dict[str, Any]

METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
METADATA_WATCH = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class Endpoint:
    name: str
    base: str
    session: aiohttp.ClientSession
    ssl_context: ssl.SSLContext | bool = False

    def url(self, path: str, query: str = "") -> URL:
        return URL(f"{self.base}{path}{'?' + query if query else ''}", encoded=True)

    async def get(self, path: str, query: str = "", *, accept: str | None = None) -> Answer:
        headers = {"Accept": accept} if accept else {}
        async with self.session.get(
            self.url(path, query), headers=headers, ssl=self.ssl_context
        ) as response:
            return Answer(response.status, dict(response.headers), await response.read())

    def watch(self, path: str, query: str, *, accept: str | None = None) -> WatchStream:
        return WatchStream(self, path, query, accept=accept)


@dataclass
class WatchStream:
    """A running watch; ``async with`` starts it, leaving closes it."""

    endpoint: Endpoint
    path: str
    query: str
    accept: str | None = None
    status: int = 0
    headers: Mapping[str, str] = field(default_factory=dict)
    error_body: bytes = b""
    events: list[Event] = field(default_factory=list)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    started_at: float = 0.0
    ended_at: float | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> WatchStream:
        opened = asyncio.Event()
        self.started_at = time.monotonic()
        self._task = asyncio.create_task(self._run(opened))
        await asyncio.wait_for(opened.wait(), 30)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self, opened: asyncio.Event) -> None:
        headers = {"Accept": self.accept} if self.accept else {}
        try:
            async with self.endpoint.session.get(
                self.endpoint.url(self.path, self.query),
                headers=headers,
                ssl=self.endpoint.ssl_context,
                timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
            ) as response:
                self.status = response.status
                self.headers = dict(response.headers)
                opened.set()
                if response.status != 200:
                    self.error_body = await response.read()
                    return
                async for line in response.content:
                    if line.strip():
                        self.events.append(orjson.loads(line))
                        self._changed.set()
        finally:
            opened.set()
            self.ended_at = time.monotonic()
            self.ended.set()
            self._changed.set()

    async def wait_until(self, done: Callable[[list[Event]], bool], *, timeout: float = 20) -> None:
        """Wait until ``done(events)``; fails with what arrived so far."""
        deadline = time.monotonic() + timeout
        while not done(self.events):
            remaining = deadline - time.monotonic()
            if self.ended.is_set() and not done(self.events):
                self.check_not_dropped()
            if remaining <= 0 or (self.ended.is_set() and not done(self.events)):
                raise AssertionError(
                    f"{self.endpoint.name} watch {self.path}?{self.query}: condition not met "
                    f"(ended={self.ended.is_set()}, status={self.status}) after "
                    f"{len(self.events)} events: {summary(self.events)[-10:]}"
                )
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    def check_not_dropped(self) -> None:
        """Raise :class:`ApiserverDroppedWatch` if this apiserver watch ended early with no
        ERROR: its cache closes watchers it finds unresponsive (``Forcing ... watcher close due
        to unresponsiveness``), which happens on a loaded machine."""
        if (
            self.endpoint.name == "apiserver"
            and self.ended.is_set()
            and self.status == 200
            and not any(e["type"] == "ERROR" for e in self.events)
        ):
            raise ApiserverDroppedWatch(
                f"the apiserver ended {self.path}?{self.query} after {self.elapsed:.1f}s and "
                f"{len(self.events)} events"
            )

    def check_lasted(self, seconds: float) -> None:
        """A stream that should have lasted ``seconds``: if the apiserver's ended sooner,
        it dropped it (see :meth:`check_not_dropped`)."""
        if self.elapsed < seconds:
            self.check_not_dropped()

    async def wait_for_name(self, name: str, *, timeout: float = 20) -> None:
        await self.wait_until(
            lambda events: any(name_of(e) == name for e in events), timeout=timeout
        )

    async def wait_ended(self, *, timeout: float = 20) -> None:
        await asyncio.wait_for(self.ended.wait(), timeout)

    @property
    def elapsed(self) -> float:
        end = self.ended_at if self.ended_at is not None else time.monotonic()
        return end - self.started_at


class ApiserverDroppedWatch(AssertionError):
    """The apiserver closed a watch it found too slow: nothing to compare this time."""


def again_if_the_apiserver_drops_a_watch(test: Callable[..., Awaitable[None]]) -> Any:
    """Run a side-by-side test again (up to three times, each in a fresh namespace) when the
    apiserver closed one of its watches as unresponsive. The apiserver's cache does this when
    a watcher's small input buffer stays full for ~100 ms, as on this 2-core test machine
    under load; it is the apiserver's right (clients resume), but it leaves nothing to
    compare. The test takes its namespace as ``ns`` and its :class:`Writer` as ``writer``."""

    @functools.wraps(test)
    async def run(**kwargs: Any) -> None:
        namespace = kwargs["ns"]
        for attempt in range(1, 4):
            try:
                await test(**kwargs)
                return
            except ApiserverDroppedWatch:
                if attempt == 3:
                    raise
            writer: Writer = kwargs["writer"]
            again = Writer(writer.api, f"{namespace}-again-{attempt}")
            await kubeapi.ensure_namespace(writer.api, again.namespace)
            kwargs["writer"], kwargs["ns"] = again, again.namespace

    return run


@dataclass
class SideBySide:
    api: Endpoint
    ww: Endpoint

    @property
    def both(self) -> tuple[Endpoint, Endpoint]:
        return self.api, self.ww

    async def get(
        self, path: str, query: str = "", *, accept: str | None = None
    ) -> tuple[Answer, Answer]:
        answers = await asyncio.gather(
            self.api.get(path, query, accept=accept), self.ww.get(path, query, accept=accept)
        )
        return answers[0], answers[1]


@contextlib.asynccontextmanager
async def side_by_side(plane: ControlPlane, sidecar: Sidecar) -> AsyncIterator[SideBySide]:
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
    ) as session:
        yield SideBySide(
            api=Endpoint(
                "apiserver",
                plane.server,
                session,
                kubeapi.client_ssl(plane.pki, identity="admin"),
            ),
            ww=Endpoint("warmwatch", sidecar.url, session),
        )


@contextlib.asynccontextmanager
async def watching(
    pair: SideBySide, path: str, query: str, *, accept: str | None = None
) -> AsyncIterator[tuple[WatchStream, WatchStream]]:
    """The same watch opened on both servers (apiserver first, warmwatch second)."""
    async with (
        pair.api.watch(path, query, accept=accept) as api,
        pair.ww.watch(path, query, accept=accept) as ww,
    ):
        yield api, ww


def name_of(event: Event) -> str:
    return str((event.get("object") or {}).get("metadata", {}).get("name", ""))


def rv_of(event: Event) -> str:
    return str((event.get("object") or {}).get("metadata", {}).get("resourceVersion", ""))


def summary(events: list[Event], *, bookmarks: bool = False) -> list[tuple[str, str, str]]:
    """(type, name, rv) of each event; BOOKMARKs left out unless asked for."""
    return [
        (e["type"], name_of(e), rv_of(e)) for e in events if bookmarks or e["type"] != "BOOKMARK"
    ]


def changes(events: list[Event]) -> list[Event]:
    """The events that are not BOOKMARKs."""
    return [e for e in events if e["type"] != "BOOKMARK"]


def without_type_meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A list item without kind/apiVersion (the apiserver leaves them out of built-in lists;
    warmwatch serves its items as the watch events carried them, with)."""
    return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}


def status_of(answer: Answer) -> dict[str, Any]:
    payload = answer.json()
    assert isinstance(payload, dict) and payload.get("kind") == "Status", answer
    return payload


# ------------------------------------------------------------------------ making changes


@dataclass
class Writer:
    """Writes ConfigMaps in one namespace through the apiserver, one at a time, and records
    what each write should produce as a watch event: (type, name, rv). The RV of a delete is
    not in its answer (a Status), so it is recorded as ``""``."""

    api: kubeapi.RawClient
    namespace: str
    log: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/configmaps"

    async def create(
        self, name: str, *, labels: Mapping[str, str] | None = None, size: int = 0
    ) -> str:
        body = kubeapi.configmap(name=name, namespace=self.namespace, labels=labels, size=size)
        created = await self.api.create(self.path, body)
        rv = str(created["metadata"]["resourceVersion"])
        self.log.append(("ADDED", name, rv))
        return rv

    async def patch(self, name: str, patch: Mapping[str, Any]) -> str:
        updated = await self.api.merge_patch(f"{self.path}/{name}", patch)
        rv = str(updated["metadata"]["resourceVersion"])
        self.log.append(("MODIFIED", name, rv))
        return rv

    async def touch(self, name: str) -> str:
        return await self.patch(name, {"data": {"touched": str(time.monotonic_ns())}})

    async def relabel(self, name: str, labels: Mapping[str, str | None]) -> str:
        return await self.patch(name, {"metadata": {"labels": dict(labels)}})

    async def delete(self, name: str) -> None:
        await self.api.delete(f"{self.path}/{name}")
        self.log.append(("DELETED", name, ""))


def assert_same_headers(api: Mapping[str, str], ww: Mapping[str, str]) -> None:
    """The headers a client may look at: the same media type and caching, an audit ID."""
    for name in ("Content-Type", "Cache-Control", "Retry-After"):
        assert ww.get(name) == api.get(name), name
    assert ww.get("Audit-Id") and api.get("Audit-Id")
