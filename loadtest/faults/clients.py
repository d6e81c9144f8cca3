"""Raw Python watchers behind warmwatch that behave like client-go's reflector, in their
variants (bookmarks or not, a label selector, per namespace, WatchList, a slow reader); each
records what it sees in a ``ClientLog``."""

from __future__ import annotations

import asyncio
import random
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from loadtest.checking import (
    Bookmarked,
    ClientLog,
    EventType,
    Expired,
    Item,
    Listed,
    Observation,
    Received,
    StreamEnded,
    WatchStarted,
)
from loadtest.faults import INITIAL_EVENTS_END, WRITE_TIMEOUT, Key
from loadtest.faults.resources import CONFIGMAPS, WIDGETS, Resource, as_item
from proxy.kube.selectors import LabelSelector


@dataclass(frozen=True, kw_only=True)
class ClientSpec:
    name: str
    resource: Resource
    namespace: str | None = None
    label_selector: str = ""
    bookmarks: bool = True
    watch_list: bool = False
    timeout: tuple[int, int] = (30, 90)
    """``timeoutSeconds`` of each watch, uniform (client-go: 300-600)."""
    slow: bool = False


class Retry(Exception):
    """An answer to retry after a pause (warmwatch starting, 503, 504, 429...)."""


def _small_receive_buffer(addr_info: Any) -> socket.socket:
    """A socket with a tiny receive window, so a reader that stops reading fills warmwatch's
    buffers in seconds and hits its write timeout."""
    family, kind, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=kind, proto=proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return sock


class WatchClient:
    """A raw watcher that behaves like client-go's reflector and records what it observes."""

    def __init__(self, *, spec: ClientSpec, base_url: str, rng: random.Random) -> None:
        self.spec = spec
        self.base_url = base_url
        self.rng = rng
        self.selector = LabelSelector.parse(spec.label_selector)
        self.observations: list[Observation] = []
        self.state: dict[Key, int] = {}
        self.rv: str | None = None
        self.need_list = True
        self.after_expired = False
        self.expired = 0
        self.lists = 0
        self.cutoffs = 0
        self.stalls = 0
        self.errors: Counter[str] = Counter()
        self.final_phase = False
        self.synced = asyncio.Event()
        self._present = asyncio.Event()
        self._present.set()
        self._step_task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    # -- control -----------------------------------------------------------------------------

    async def leave(self) -> None:
        """Disconnect now and stay away until :meth:`come_back`."""
        self._present.clear()
        task = self._step_task
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def come_back(self) -> None:
        self._present.set()

    def expected(self, final: Iterable[Item]) -> dict[Key, int]:
        namespace = self.spec.namespace
        return {
            item.key: item.rv
            for item in final
            if (namespace is None or item.namespace == namespace)
            and self.selector.matches(item.labels)
        }

    def converged(self, final: Iterable[Item]) -> bool:
        return not self.need_list and self.state == self.expected(final)

    def log(self) -> ClientLog:
        return ClientLog(
            name=self.spec.name,
            observations=list(self.observations),
            namespace=self.spec.namespace,
            label_selector=self.spec.label_selector,
            shape=self.spec.resource.flag,
        )

    # -- the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Until cancelled."""
        connector = aiohttp.TCPConnector(
            limit=4, socket_factory=_small_receive_buffer if self.spec.slow else None
        )
        async with aiohttp.ClientSession(
            connector=connector,
            read_bufsize=16384 if self.spec.slow else 2**18,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
            headers={"Accept": "application/json"},
        ) as session:
            self._session = session
            delay = 0.1
            while True:
                await self._present.wait()
                started = time.monotonic()
                task = asyncio.create_task(self._step())
                self._step_task = task
                try:
                    await asyncio.wait({task})
                except asyncio.CancelledError:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    raise
                finally:
                    self._step_task = None
                if task.cancelled():
                    continue  # told to leave
                error = task.exception()
                if error is None:
                    delay = 0.1
                    if time.monotonic() - started < 0.2:
                        await asyncio.sleep(0.1)
                    continue
                if not isinstance(error, (aiohttp.ClientError, OSError, TimeoutError, Retry)):
                    raise error
                self.errors[type(error).__name__] += 1
                await asyncio.sleep(delay * self.rng.uniform(0.5, 1.5))
                delay = min(delay * 2, 2.0)

    async def _step(self) -> None:
        if self.need_list:
            if self.spec.watch_list:
                await self._watch(None)
                return
            await self._list()
        await self._watch(self.rv)

    @property
    def _url(self) -> str:
        return self.base_url + self.spec.resource.collection(self.spec.namespace)

    def _params(self, **params: str) -> dict[str, str]:
        if self.spec.label_selector:
            params["labelSelector"] = self.spec.label_selector
        return params

    async def _list(self) -> None:
        assert self._session is not None
        params = self._params(limit="500")
        if not self.after_expired:
            params["resourceVersion"] = "0"  # client-go's first list; after 410 a quorum list
        items: list[Item] = []
        rv = ""
        async with asyncio.timeout(60):
            while True:
                async with self._session.get(self._url, params=params) as response:
                    if response.status != 200:
                        raise Retry(f"LIST answered {response.status}")
                    body = orjson.loads(await response.read())
                metadata = body.get("metadata") or {}
                rv = rv or str(metadata["resourceVersion"])
                items += [as_item(obj, labels=False) for obj in body.get("items") or []]
                token = metadata.get("continue")
                if not token:
                    break
                params = self._params(limit="500", **{"continue": token})
        self.observations.append(Listed(rv=int(rv), items=items))
        self.state = {item.key: item.rv for item in items}
        self._synced(rv)

    def _synced(self, rv: str) -> None:
        self.rv = rv
        self.need_list = self.after_expired = False
        self.lists += 1
        self.synced.set()

    def _expired(self) -> None:
        self.observations.append(Expired())
        self.expired += 1
        self.need_list = self.after_expired = True

    async def _watch(self, rv: str | None) -> None:
        assert self._session is not None
        params = self._params(watch="1", timeoutSeconds=str(self.rng.randint(*self.spec.timeout)))
        if self.spec.bookmarks or rv is None:
            params["allowWatchBookmarks"] = "true"
        if rv is None:  # WatchList: the state as initial events, then the bookmark that ends them
            params |= {"sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan"}
        else:
            params["resourceVersion"] = rv
        async with self._session.get(self._url, params=params) as response:
            if response.status == 410:
                self._expired()
                return
            if response.status != 200:
                raise Retry(f"WATCH answered {response.status}")
            self.observations.append(WatchStarted(rv=None if rv is None else int(rv)))
            ended = False
            try:
                ended = await self._follow(response, initial={} if rv is None else None)
            finally:
                if not ended:
                    self.observations.append(StreamEnded())

    async def _follow(
        self, response: aiohttp.ClientResponse, *, initial: dict[Key, int] | None
    ) -> bool:
        """Read one watch stream; True when it ended with 410 (recorded as Expired)."""
        async for line in self._lines(response):
            event = orjson.loads(line)
            kind = event.get("type")
            obj = event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    self._expired()
                    return True
                self.errors[f"ERROR {obj.get('code')} {obj.get('reason')}"] += 1
                return False
            metadata = obj.get("metadata") or {}
            rv_text = str(metadata["resourceVersion"])
            rv = int(rv_text)
            if kind == "BOOKMARK":
                end = (metadata.get("annotations") or {}).get(INITIAL_EVENTS_END) == "true"
                self.observations.append(Bookmarked(rv=rv, initial_events_end=end))
                if initial is None:
                    self.rv = rv_text
                elif end:
                    self.state = initial
                    initial = None
                    self._synced(rv_text)
                continue
            key = (str(metadata.get("namespace", "")), str(metadata["name"]))
            self.observations.append(
                Received(type=EventType(kind), namespace=key[0], name=key[1], rv=rv)
            )
            if initial is not None:
                initial[key] = rv
                continue
            if kind == "DELETED":
                self.state.pop(key, None)
            else:
                self.state[key] = rv
            self.rv = rv_text
        return False

    async def _lines(self, response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        if not self.spec.slow:
            async for line in response.content:
                if line.strip():
                    yield line
            return
        # The slow reader: reads for a while, then stops reading for longer than warmwatch's
        # write timeout. warmwatch cuts it off; it resumes from its last RV.
        next_stall = time.monotonic() + self.rng.uniform(3, 8)
        stalled = False
        try:
            while True:
                if not self.final_phase and time.monotonic() >= next_stall:
                    self.stalls += 1
                    stalled = True
                    await asyncio.sleep(WRITE_TIMEOUT + self.rng.uniform(8, 14))
                    next_stall = time.monotonic() + self.rng.uniform(3, 8)
                line = await response.content.readline()
                if not line:
                    return
                if line.strip():
                    yield line
        except (aiohttp.ClientError, OSError):
            if stalled:
                self.cutoffs += 1
            raise


def client_specs(namespaces: Sequence[str]) -> list[ClientSpec]:
    cm, wi = CONFIGMAPS, WIDGETS
    return [
        ClientSpec(name="cm-all", resource=cm),
        ClientSpec(name="cm-all-nobookmarks", resource=cm, bookmarks=False, timeout=(15, 45)),
        ClientSpec(name="cm-gold", resource=cm, label_selector="tier=gold"),
        ClientSpec(
            name="cm-gold-silver-nobookmarks",
            resource=cm,
            label_selector="tier in (gold,silver)",
            bookmarks=False,
        ),
        ClientSpec(name="cm-watchlist", resource=cm, watch_list=True),
        ClientSpec(name=f"cm-{namespaces[1]}", resource=cm, namespace=namespaces[1]),
        ClientSpec(name="cm-slow", resource=cm, slow=True, timeout=(60, 120)),
        ClientSpec(name="wi-all", resource=wi),
        ClientSpec(
            name="wi-notbronze-shard1-nobookmarks",
            resource=wi,
            label_selector="tier!=bronze,shard=1",
            bookmarks=False,
        ),
        ClientSpec(
            name="wi-watchlist-gold-bronze",
            resource=wi,
            watch_list=True,
            label_selector="tier in (gold,bronze)",
        ),
        ClientSpec(
            name=f"wi-{namespaces[2]}-nobookmarks",
            resource=wi,
            namespace=namespaces[2],
            bookmarks=False,
        ),
    ]
