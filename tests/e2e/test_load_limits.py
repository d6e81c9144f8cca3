"""Hostile clients held at once, against warmwatch in front of the real apiserver:

- 500 half-open connections (request headers begun, never finished),
- 300 watchers that never read, each resuming before 3,000 events (~7 MB) it must be sent,
- 8 LIST clients of that 3,000-object collection that stop reading after the first bytes.

While they are held a well-behaved client's LIST and watch resume are answered within 1 s,
warmwatch's RSS stays below ``RSS_BOUND`` and what the kernel holds to send on its
connections below ``KERNEL_QUEUE_BOUND``, and afterwards: the half-open connections were
closed by the header timeout, the LIST and watch clients that stopped reading by the write
deadline, and nothing was logged as a traceback.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

import aiohttp
import orjson
import pytest

from loadtest import kubeapi, ports
from loadtest.sidecar import Sidecar

pytestmark = pytest.mark.e2e

OBJECTS = 3000
SIZE = 2000
HALF_OPEN = 500
WATCHERS = 300
STALLED_LISTS = 8
HEADER_TIMEOUT = 45.0
WRITE_TIMEOUT = 20.0
"""Long enough that the checks while they are held come before it: opening them all and
filling 300 watchers' socket buffers keeps two cores busy for several seconds."""
RSS_BOUND = 300 * 2**20
"""What warmwatch may take with all of them held (stated in the README: Limits)."""
KERNEL_QUEUE_BOUND = 100 * 2**20
"""What the kernel may hold to send on warmwatch's connections with all of them held: about
``connections.UNSENT_LOW_WATER`` plus a piece for each of the 308 that stopped reading.
Without that bound Linux grew each watcher's send buffer to ~4 MiB: 0.9-1.1 GiB in all."""


async def raw_client(port: int, request: bytes) -> socket.socket:
    """A connection with a tiny receive buffer (so a client that does not read stops the
    server's writes at once, not after megabytes of kernel buffers) that sent ``request``."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, request)
    return sock


_ESTABLISHED = 1


def is_closed(sock: socket.socket) -> bool:
    """The server closed (FIN) or reset the connection: its TCP state, read without
    consuming anything the server sent."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] != _ESTABLISHED


async def closed_within(sockets: list[socket.socket], timeout: float) -> int:
    """How many of ``sockets`` are still open after waiting up to ``timeout`` for all."""
    open_ = len(sockets)
    for _ in range(max(int(timeout / 0.2), 1)):
        open_ = sum(not is_closed(s) for s in sockets)
        if not open_:
            break
        await asyncio.sleep(0.2)
    return open_


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()


async def test_hostile_clients_are_bounded_and_others_served(
    namespace: str,
    admin_api: kubeapi.RawClient,
    start_sidecar: Callable[..., Sidecar],
) -> None:
    collection = f"/api/v1/namespaces/{namespace}/configmaps"
    sidecar = start_sidecar(
        resources=[f"v1/configmaps@{namespace}"],
        extra=[f"--header-timeout={HEADER_TIMEOUT}", f"--watch-write-timeout={WRITE_TIMEOUT}"],
    )
    async with aiohttp.ClientSession(sidecar.url) as session:
        async with session.get(collection) as answer:
            start_rv = (await answer.json())["metadata"]["resourceVersion"]
        # Created through the cache's watch: the log holds 3,000 ADDED events after start_rv.
        await kubeapi.create_configmaps(admin_api, namespace=namespace, count=OBJECTS, size=SIZE)
        while True:
            async with session.get(collection) as answer:
                listed = await answer.json()
            if len(listed["items"]) == OBJECTS:
                break
            await asyncio.sleep(0.5)
        baseline = sidecar.rss_bytes()

        opened = time.monotonic()
        half_open = [await raw_client(sidecar.port, get(collection)[:40]) for _ in range(HALF_OPEN)]
        first_watcher = time.monotonic()
        watchers = [
            await raw_client(sidecar.port, get(f"{collection}?watch=1&resourceVersion={start_rv}"))
            for _ in range(WATCHERS)
        ]
        stalled = []
        for _ in range(STALLED_LISTS):
            sock = await raw_client(sidecar.port, get(collection))
            head = await asyncio.get_running_loop().sock_recv(sock, 100)
            assert head.startswith(b"HTTP/1.1 200")  # then it reads no more
            stalled.append(sock)
        await asyncio.sleep(2)  # every watcher has written until its client's buffer is full
        held_rss = sidecar.rss_bytes()
        kernel_queued = sum(ports.send_queues(sidecar.port).values())

        # A well-behaved client, while they are all held.
        began = time.monotonic()
        async with session.get(collection) as answer:
            assert answer.status == 200
            listed = await answer.json()
        list_seconds = time.monotonic() - began
        assert len(listed["items"]) == OBJECTS
        began = time.monotonic()
        async with session.get(
            collection,
            params={"watch": "1", "resourceVersion": listed["metadata"]["resourceVersion"]},
            timeout=aiohttp.ClientTimeout(total=30),
        ) as watch:
            watch_seconds = time.monotonic() - began
            assert watch.status == 200
            await admin_api.create(collection, kubeapi.configmap(name="after", namespace=namespace))
            event = orjson.loads(await asyncio.wait_for(watch.content.readline(), 10))
        assert event["object"]["metadata"]["name"] == "after"
        print(
            f"RSS baseline {baseline / 2**20:.0f} MiB, held {held_rss / 2**20:.0f} MiB, "
            f"kernel send queues {kernel_queued / 2**20:.0f} MiB; "
            f"LIST {list_seconds:.3f} s, watch resume {watch_seconds:.3f} s"
        )
        assert list_seconds < 1.0
        assert watch_seconds < 1.0
        assert held_rss < RSS_BOUND
        assert kernel_queued < KERNEL_QUEUE_BOUND
        # None was closed before its write deadline.
        assert time.monotonic() - first_watcher < WRITE_TIMEOUT - 1
        assert not any(is_closed(s) for s in [*half_open, *watchers, *stalled])

        # The stalled LISTs and watchers are cut by the write deadline...
        still_open = await closed_within([*stalled, *watchers], WRITE_TIMEOUT + 15)
        assert not still_open, f"{still_open} stalled clients still open"
        # ...and the half-open connections by the header timeout, not before.
        assert time.monotonic() - opened < HEADER_TIMEOUT - 1
        assert not any(is_closed(s) for s in half_open)
        still_open = await closed_within(
            half_open, HEADER_TIMEOUT + 10 - (time.monotonic() - opened)
        )
        assert not still_open, f"{still_open} half-open connections still open"
        assert (
            sidecar.metric("warmwatch_client_errors_total", {"reason": "header_timeout"})
            >= HALF_OPEN
        )
        assert (
            sidecar.metric("warmwatch_client_errors_total", {"reason": "slow"})
            >= WATCHERS + STALLED_LISTS
        )
        assert sidecar.rss_bytes() < RSS_BOUND
        for sock in [*half_open, *watchers, *stalled]:
            sock.close()
    log = sidecar.log.read_text()
    assert "Traceback" not in log
    assert " ERROR " not in log
