"""Writing a streamed answer (a LIST, a watch, a passed-through answer) to a client that may
stop reading, and cutting a client.

Every write has a deadline (``ServeSettings.slow_write_timeout``). A client that accepts no
data for that long is cut with a TCP reset: it must not hold a cache reader and its read
snapshot (which keeps the SQLite write-ahead log from being checkpointed), a task or memory
for as long as it likes. A cut watch resumes from its last resourceVersion out of the log; a
cut LIST is visibly incomplete, and the client lists again.

Answers are written in pieces of about :data:`PIECE` bytes (:class:`Pieces`): a write
returns once the transport's buffer is below its high-water mark, so what a client that stopped
reading pins in memory is one piece and that buffer, not a whole batch of rows or events.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web
from aiohttp.http_writer import StreamWriter

PIECE: Final = 64 * 1024
"""Bytes gathered into one write: the size of the transport's high-water mark, so a write
blocks with about one piece beyond it."""

Send = Callable[[bytes], Awaitable[None]]
"""A write with the slow-client deadline (:func:`write_within`)."""


class SlowClient(Exception):
    """The client did not accept a write within the slow-write timeout."""


class ClientGone(Exception):
    """The client disconnected while its answer was written: a ``ConnectionError`` of the
    write, re-raised as this where it must not pass for an upstream failure (aiohttp's
    ``ClientConnectionResetError`` is also an aiohttp ``ClientError``)."""


def cut(request: web.BaseRequest) -> None:
    """Close the client's connection now, discarding what it has not read (a TCP reset).

    ``close()`` would first wait for the client to read our buffer, and even ``abort()`` leaves
    the kernel holding the connection open until the client reads what the socket still has:
    a client that stopped reading would keep it forever.
    """
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


async def write_within(
    response: web.StreamResponse,
    data: bytes,
    *,
    timeout: float,
    transport: asyncio.BaseTransport | None = None,
) -> None:
    """``response.write(data)``, or :class:`SlowClient` after ``timeout``.

    A write waits only while the transport's buffer is above its high-water mark (aiohttp
    then waits for it to drain). So given the ``transport``, a write of less than the mark
    into an empty buffer cannot wait and goes without a timer: the common case of a client
    that keeps up, where arming and cancelling the timer was a tenth of a watcher's work."""
    if takes_at_once(transport, len(data)):
        await response.write(data)
        return
    try:
        async with asyncio.timeout(timeout):
            await response.write(data)
    except TimeoutError:
        raise SlowClient from None


def takes_at_once(transport: asyncio.BaseTransport | None, size: int) -> bool:
    """A write of ``size`` bytes into ``transport`` cannot wait: its buffer is empty and the
    write stays below the buffer's high-water mark. (uvloop's transports are not registered as
    ``asyncio.WriteTransport``, so they are recognised by their methods.)"""
    if transport is None or transport.is_closing():
        return False
    buffered = getattr(transport, "get_write_buffer_size", None)
    limits = getattr(transport, "get_write_buffer_limits", None)
    if buffered is None or limits is None:
        return False
    return bool(buffered() == 0 and size < limits()[1])


def write_now(
    response: web.StreamResponse, data: bytes, *, transport: asyncio.BaseTransport | None
) -> bool:
    """Write ``data`` into the answer from synchronous code, or return False having written
    nothing: when the transport's buffer is not empty (the client is behind: the caller's
    own loop then writes with the deadline) or ``data`` would fill it past its high-water
    mark.

    aiohttp's writer frames the data (chunked encoding) and hands it to the transport
    synchronously; it awaits only to drain (not asked for here), to compress, or for a
    ``on_chunk_sent`` signal, neither of which a streamed answer of ours has. So its
    coroutine is driven by hand: one step that must finish. Should a future aiohttp suspend
    there, it suspends before writing and is closed: nothing was written, False."""
    writer = response._payload_writer  # no public synchronous write exists
    if not isinstance(writer, StreamWriter) or not takes_at_once(transport, len(data)):
        return False
    step = writer.write(data, drain=False)
    try:
        step.send(None)
    except StopIteration:
        return True
    step.close()
    return False


class Pieces:
    """Bytes gathered into writes of about :data:`PIECE` bytes."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.written = 0
        self._parts: list[bytes] = []
        self._size = 0

    async def add(self, *parts: bytes) -> None:
        for part in parts:
            self._parts.append(part)
            self._size += len(part)
        if self._size >= PIECE:
            await self.flush()

    async def flush(self) -> None:
        """Write what is gathered (nothing when nothing is)."""
        if not self._parts:
            return
        data = b"".join(self._parts)
        self._parts.clear()
        self._size = 0
        self.written += len(data)
        await self.send(data)
