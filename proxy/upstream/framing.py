"""Watch stream framing: newline-delimited JSON, one event per line, or protobuf's
length-prefixed frames (``application/vnd.kubernetes.protobuf;stream=watch``: a 4-byte
big-endian length, then the message).

aiohttp's own line reader refuses lines longer than its buffer limit (128 KiB), and Kubernetes
objects reach 1.5 MiB, so the stream is split here. Each chunk that arrives is split at once and
its complete lines (or frames) are yielded together: the reflector commits them as one batch, which is how
events are batched under load without adding latency when the stream is quiet.
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

import orjson

MAX_LINE = 64 * 1024 * 1024
"""A line (or frame) longer than this is not a Kubernetes object (etcd's limit is ~1.5 MiB)."""


class FramingError(ValueError):
    pass


async def line_batches(chunks: AsyncIterable[bytes]) -> AsyncIterator[list[bytes]]:
    """Complete lines, grouped by the chunk that completed them. A final unterminated line is
    yielded too (a stream may end without the last newline)."""
    pending = b""
    async for chunk in chunks:
        if not chunk:
            continue
        data = pending + chunk if pending else chunk
        lines = data.split(b"\n")
        pending = lines.pop()
        if len(pending) > MAX_LINE:
            raise FramingError(f"watch event longer than {MAX_LINE} bytes")
        complete = [line for line in lines if line.strip()]
        if complete:
            yield complete
    if pending.strip():
        yield [pending]


def event_object_bytes(line: bytes, event: dict[str, Any]) -> bytes:
    """The exact bytes of ``event["object"]`` within ``line``, without re-encoding.

    The apiserver writes ``{"type":"...","object":{...}}``; the object then runs from after
    ``"object":`` to the line's last ``}``. Anything else is re-encoded from the decoded event.
    """
    marker = line.find(b'"object":')
    end = line.rfind(b"}")
    if line.startswith(b'{"type":') and marker > 0 and end > marker:
        raw = line[marker + 9 : end].strip()
        if raw.startswith(b"{") and raw.endswith(b"}"):
            return raw
    return orjson.dumps(event.get("object"))


async def frame_batches(chunks: AsyncIterable[bytes]) -> AsyncIterator[list[bytes]]:
    """Complete length-prefixed frames, grouped by the chunk that completed them."""
    pending = b""
    async for chunk in chunks:
        data = pending + chunk if pending else chunk
        frames: list[bytes] = []
        at = 0
        while len(data) - at >= 4:
            (length,) = struct.unpack_from(">I", data, at)
            if length > MAX_LINE:
                raise FramingError(f"watch frame of {length} bytes")
            if len(data) - at - 4 < length:
                break
            frames.append(data[at + 4 : at + 4 + length])
            at += 4 + length
        pending = data[at:]
        if frames:
            yield frames
    if pending:
        raise FramingError(f"watch stream ended inside a frame ({len(pending)} bytes left)")
