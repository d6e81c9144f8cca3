"""Writing a streamed answer (a LIST, a watch) to a client that may stop reading.

Every write has a deadline (``ServeSettings.slow_write_timeout``). A client that accepts no
data for that long is cut with a TCP reset: it must not hold a cache reader and its read
snapshot (which keeps the SQLite write-ahead log from being checkpointed), a task or memory
for as long as it likes. A cut watch resumes from its last resourceVersion out of the log; a
cut LIST is visibly incomplete, and the client lists again.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct

from aiohttp import web


class SlowClient(Exception):
    """The client did not accept a write within the slow-write timeout."""


async def write_within(response: web.StreamResponse, data: bytes, *, timeout: float) -> None:
    """``response.write(data)``, or :class:`SlowClient` after ``timeout``."""
    try:
        await asyncio.wait_for(response.write(data), timeout)
    except TimeoutError:
        raise SlowClient from None


def cut(request: web.BaseRequest) -> None:
    """Close the connection now, discarding what the client has not read (a TCP reset).

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
