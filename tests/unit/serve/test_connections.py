"""Connections below HTTP (``proxy.serve.connections``): the header deadline (slowloris), the
header size limit, the connection limit, and what aiohttp reports about bad clients (one line,
counted, no header value, no traceback). A real aiohttp server on loopback, served as warmwatch
serves its API listener."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web

from loadtest import ports
from proxy.metrics import Metrics
from proxy.serve import connections, routing
from proxy.serve.limiting import Limits

Server = tuple[int, Metrics]


async def ok(_: web.Request) -> web.Response:
    return web.Response(text="ok")


async def gone(_: web.Request) -> web.Response:
    raise ConnectionResetError("the client left")


async def stream(request: web.Request) -> web.StreamResponse:
    """16 MiB in pieces of 64 KiB, as a LIST from the cache is written."""
    response = web.StreamResponse()
    await response.prepare(request)
    for _ in range(256):
        await response.write(b"x" * 65536)
    return response


@pytest.fixture
async def start() -> AsyncIterator[Callable[..., Any]]:
    runners: list[web.AppRunner] = []

    async def start_server(**limits: Any) -> Server:
        app = web.Application(middlewares=[connections.middleware, routing.statuses])
        app.router.add_get("/ok", ok)
        app.router.add_get("/gone", gone)
        app.router.add_get("/stream", stream)
        metrics = Metrics()
        app[routing.METRICS] = metrics
        runner, site = await connections.serve(
            app,
            address=("127.0.0.1", 0),
            limits=Limits(**limits),
            metrics=metrics,
            shutdown_timeout=1,
        )
        runners.append(runner)
        return site.port, metrics

    yield start_server
    for runner in runners:
        await runner.cleanup()


def errors(metrics: Metrics, reason: str) -> float:
    return metrics.value("warmwatch_client_errors_total", {"reason": reason}) or 0.0


async def read_all(reader: asyncio.StreamReader, timeout: float = 5) -> bytes:
    """Everything until the server closes (a reset counts as a close)."""
    data = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), timeout):
            data += chunk
    except ConnectionResetError:
        pass
    return data


REQUEST = b"GET /ok HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


async def test_headers_not_sent_in_time_close_the_connection(start: Any) -> None:
    port, metrics = await start(header_timeout=0.5)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /ok HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert await read_all(reader) == b""
    assert 0.4 < loop.time() - began < 3
    assert errors(metrics, "header_timeout") == 1
    writer.close()


async def test_a_trickle_of_header_bytes_does_not_extend_the_deadline(start: Any) -> None:
    port, metrics = await start(header_timeout=0.5)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /ok HTTP/1.1\r\n")

    async def trickle() -> None:
        for _ in range(40):
            writer.write(b"X-A: b\r\n")
            await asyncio.sleep(0.1)

    feeding = asyncio.create_task(trickle())
    try:
        assert await read_all(reader) == b""
        assert not feeding.done()  # closed while the client was still sending
    finally:
        feeding.cancel()
        writer.close()
    assert errors(metrics, "header_timeout") == 1


async def test_an_idle_keep_alive_connection_is_not_a_slow_header(start: Any) -> None:
    """Between requests the idle timeout applies; the next request's first byte starts its
    header deadline."""
    port, metrics = await start(header_timeout=0.3, idle_timeout=30)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(REQUEST)
    assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200")
    await asyncio.sleep(0.8)  # idle, past the header deadline
    writer.write(REQUEST)
    assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200")
    writer.write(b"GET /ok HTTP/1.1\r\n")  # a further request that stalls
    assert await read_all(reader) == b""
    assert errors(metrics, "header_timeout") == 1
    writer.close()


async def test_headers_up_to_the_apiservers_limit_are_accepted(start: Any) -> None:
    port, metrics = await start()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    big = b"a" * 200_000  # aiohttp alone refuses a header line over 8,190 bytes
    writer.write(
        b"GET /ok?x=" + big + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + big + b"\r\n\r\n"
    )
    assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200")
    writer.close()
    assert errors(metrics, "header_too_large") == 0


async def test_headers_over_the_limit_get_gos_431(start: Any) -> None:
    port, metrics = await start(max_header_bytes=100_000)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /ok HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    for _ in range(60):
        writer.write(b"X-H: " + b"v" * 4000 + b"\r\n")
    answer = await read_all(reader)
    assert answer == connections.HEADER_TOO_LARGE
    assert errors(metrics, "header_too_large") == 1
    writer.close()


async def test_connections_over_the_limit_get_429_then_are_closed_unread(start: Any) -> None:
    port, metrics = await start(max_connections=2)
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(REQUEST)
    answer = await read_all(reader)
    assert answer.startswith(b"HTTP/1.1 429")
    assert b"Retry-After: 1\r\n" in answer
    assert answer.endswith(b"Too many requests, please try again later.\n")
    writer.close()
    # Past twice the limit a connection is closed at once, before it is read.
    more = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await asyncio.sleep(0.1)
    assert await read_all(reader) == b""
    assert (metrics.value("warmwatch_rejected_total", {"limit": "connections"}) or 0) >= 2
    for _, w in [*held, *more, (reader, writer)]:
        w.close()
    await asyncio.sleep(0.2)
    # Below the limit again: served.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(REQUEST)
    assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200")
    writer.close()


async def test_a_malformed_request_is_one_line_without_its_headers(
    start: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    port, metrics = await start()
    for garbage in (
        b"GET /ok HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer s3cret\x01\r\n\r\n",
        b"GET /ok HTTP/1.1\r\nAuthorization Bearer s3cret\r\n\r\n",
        b"\x16\x03\x01\x02\x00s3cret tls hello\r\n\r\n",
        b"GET /ok HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz s3cret\r\n",
    ):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(garbage)
        answer = await read_all(reader)
        assert answer.startswith((b"HTTP/1.1 400", b"HTTP/1.0 400")) or answer == b"", answer
        writer.close()
    assert errors(metrics, "malformed") >= 3
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [r for r in caplog.records if r.exc_info]
    assert "s3cret" not in caplog.text
    assert "client error: malformed" in caplog.text


async def test_a_client_that_left_is_no_error(start: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    port, metrics = await start()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /gone HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    answer = await read_all(reader)
    assert b"500" not in answer.partition(b"\r\n")[0]
    writer.close()
    assert errors(metrics, "disconnected") == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


async def test_blank_lines_are_not_a_request(start: Any) -> None:
    """Empty lines before a request line are skipped by the parser: they neither end the
    headers nor stop their deadline."""
    port, metrics = await start(header_timeout=0.5)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"\r\n\r\n\r\n\r\n")
    assert await read_all(reader) == b""
    assert errors(metrics, "header_timeout") == 1
    writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"\r\n" + REQUEST)
    assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200")
    writer.close()


async def test_a_client_that_stops_reading_holds_little_kernel_memory(start: Any) -> None:
    """The kernel takes about ``UNSENT_LOW_WATER`` of an answer its client does not read,
    not the several MiB Linux's send-buffer autotuning would grow to (about 3 MiB here
    without the bound); the rest waits in the server, where the write deadline sees it."""
    port, _ = await start()
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # it fills at once
    client.setblocking(False)
    await asyncio.get_running_loop().sock_connect(client, ("127.0.0.1", port))
    await asyncio.get_running_loop().sock_sendall(client, REQUEST.replace(b"/ok", b"/stream"))
    await asyncio.sleep(0.5)  # the server wrote until its socket took no more
    queued = ports.send_queues(port)[client.getsockname()[1]]
    client.close()
    assert 0 < queued < connections.UNSENT_LOW_WATER + 2 * 65536


@pytest.mark.parametrize(
    ("data", "end"),
    [
        (b"GET / HTTP/1.1\r\nHost: a\r\n\r\nbody", 27),
        (b"GET / HTTP/1.1\nHost: a\n\nbody", 24),
        (b"GET / HTTP/1.1\r\nHost: a\r\n", -1),
    ],
)
def test_headers_end(data: bytes, end: int) -> None:
    assert connections.headers_end(data) == end


async def test_headers_held_by_all_connections_together_are_bounded(start: Any) -> None:
    """Past the shared budget, a connection with large headers is refused; a small request
    still goes through."""
    port, metrics = await start(header_budget=300_000)
    big = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
    for _, writer in big:
        writer.write(b"GET /ok HTTP/1.1\r\nX-A: " + b"a" * 100_000)  # unfinished
        await writer.drain()
    await asyncio.sleep(0.3)

    async def answer(reader: asyncio.StreamReader) -> bytes:
        try:
            return await asyncio.wait_for(reader.read(1000), 0.5)
        except TimeoutError:
            return b""  # still open: its headers are within the budget

    answers = [await answer(reader) for reader, _ in big]
    assert answers.count(connections.HEADER_TOO_LARGE) == 2  # 4 x 100 KB, budget 300 KB
    assert errors(metrics, "header_too_large") >= 1
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(REQUEST)
    assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200")
    for _, w in [*big, (reader, writer)]:
        w.close()
