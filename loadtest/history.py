"""The reference history for the fault test: every change, read from etcd itself.

A watch on the apiserver cannot be the reference across apiserver restarts: the restarted
apiserver's watch cache refuses older resourceVersions (410) to every client. etcd keeps the
whole history until it is compacted, so the recorder watches etcd directly through its
JSON gateway (``/v3/watch``) from a known revision, with ``prev_kv`` so a deletion carries the
deleted object. The test control plane stores objects as JSON (``--storage-media-type``), so
values decode without protobuf. An object's resourceVersion is its etcd ``mod_revision``; a
deletion's is the revision of the delete.

The recorder must stay connected while faults happen (it does not go through warmwatch or the
apiserver), and it must have read past a revision before anything compacts etcd beyond it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from loadtest.checking import Change, EventType, Item, Reference


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _range_end(prefix: str) -> str:
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return base64.b64encode(bytes(raw)).decode()


def registry_prefix(*, group: str, resource: str) -> str:
    """Where the apiserver keeps a resource in etcd (built-in core types have no group)."""
    return f"/registry/{group}/{resource}/" if group else f"/registry/{resource}/"


def _item(value: bytes, rv: int) -> Item:
    obj: dict[str, Any] = orjson.loads(value)
    metadata = obj.get("metadata") or {}
    return Item(
        namespace=metadata.get("namespace", ""),
        name=metadata["name"],
        rv=rv,
        labels=dict(metadata.get("labels") or {}),
    )


class HistoryCompacted(Exception):
    """etcd compacted revisions the recorder had not read yet: the history has a gap."""


@dataclass
class EtcdHistory:
    """Records the changes under ``prefix`` from ``start`` (an etcd revision) on."""

    endpoint: str
    prefix: str
    start: int = 0
    initial: list[Item] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    revision: int = 0
    """Every change under ``prefix`` up to this revision has been read (the newest event's, or a
    progress notification's): compacting etcd up to it is safe."""

    async def snapshot(self, session: aiohttp.ClientSession) -> None:
        """The state at the current revision: the history starts after it."""
        async with session.post(
            f"{self.endpoint}/v3/kv/range",
            json={
                "key": _b64(self.prefix),
                "range_end": _range_end(self.prefix),
            },
        ) as answer:
            body = await answer.json(content_type=None)
        self.start = self.revision = int(body["header"]["revision"])
        self.initial = [
            _item(base64.b64decode(kv["value"]), int(kv["mod_revision"]))
            for kv in body.get("kvs", [])
        ]

    async def record(self, session: aiohttp.ClientSession, *, stop: asyncio.Event) -> None:
        """Append every change after ``start`` until ``stop`` is set (reconnects as needed).

        Raises :class:`HistoryCompacted` if etcd compacted past what was read: the history has
        a gap and nothing checked against it can be trusted."""
        while not stop.is_set():
            request = {
                "create_request": {
                    "key": _b64(self.prefix),
                    "range_end": _range_end(self.prefix),
                    "start_revision": self.revision + 1,
                    "prev_kv": True,
                    "progress_notify": True,
                }
            }
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ConnectionError):
                async with session.post(
                    f"{self.endpoint}/v3/watch",
                    json=request,
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                ) as stream:
                    stream.raise_for_status()
                    reader = asyncio.ensure_future(self._consume(stream))
                    stopper = asyncio.ensure_future(stop.wait())
                    await asyncio.wait({reader, stopper}, return_when=asyncio.FIRST_COMPLETED)
                    for task in (reader, stopper):
                        task.cancel()
                    await asyncio.gather(stopper, return_exceptions=True)
                    if not reader.cancelled() and reader.done():
                        reader.result()  # a broken stream (ClientError) or a compaction
                    else:
                        await asyncio.gather(reader, return_exceptions=True)
            if not stop.is_set():
                await asyncio.sleep(0.2)

    async def _consume(self, stream: aiohttp.ClientResponse) -> None:
        # Messages are newline-delimited JSON; one message may hold thousands of events (a
        # catch-up from an old revision), far beyond aiohttp's line-length limit.
        buffer = bytearray()
        async for chunk in stream.content.iter_any():
            scanned = len(buffer)
            buffer += chunk
            start = 0
            while (end := buffer.find(b"\n", scanned)) >= 0:
                line = bytes(buffer[start:end])
                start = scanned = end + 1
                if line.strip():
                    self._message(orjson.loads(line).get("result") or {})
            del buffer[:start]

    def _message(self, result: dict[str, Any]) -> None:
        if result.get("canceled"):
            compacted = int(result.get("compact_revision") or 0)
            if compacted:
                raise HistoryCompacted(
                    f"{self.prefix}: etcd compacted to revision {compacted} before the history "
                    f"read past revision {self.revision}"
                )
            raise aiohttp.ClientPayloadError(
                f"{self.prefix}: watch canceled: {result.get('cancel_reason', '')}"
            )
        events = result.get("events") or []
        for event in events:
            self._append(event)
        # The header of a progress notification (no events) promises every event up to its
        # revision was sent. Not so the ``created`` answer: its header is etcd's current
        # revision while the events since ``start_revision`` are still to come.
        header = result.get("header") or {}
        if not events and not result.get("created") and "revision" in header:
            self.revision = max(self.revision, int(header["revision"]))

    def _append(self, event: dict[str, Any]) -> None:
        kv = event["kv"]
        rv = int(kv["mod_revision"])
        if event.get("type") == "DELETE":
            previous = _item(base64.b64decode(event["prev_kv"]["value"]), rv)
            self.changes.append(
                Change(
                    type=EventType.DELETED,
                    namespace=previous.namespace,
                    name=previous.name,
                    rv=rv,
                    labels=previous.labels,
                )
            )
        else:
            item = _item(base64.b64decode(kv["value"]), rv)
            kind = EventType.ADDED if kv.get("version") == "1" else EventType.MODIFIED
            self.changes.append(
                Change(
                    type=kind, namespace=item.namespace, name=item.name, rv=rv, labels=item.labels
                )
            )
        self.revision = max(self.revision, rv)

    def reference(self) -> Reference:
        return Reference(
            changes=list(self.changes), initial_rv=self.start, initial=list(self.initial)
        )


async def compact(endpoint: str, *, revision: int) -> None:
    """Compact etcd's history up to ``revision`` (what the apiserver does every 5 minutes)."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{endpoint}/v3/kv/compaction", json={"revision": revision, "physical": True}
        ) as answer,
    ):
        answer.raise_for_status()


async def current_revision(endpoint: str) -> int:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{endpoint}/v3/kv/range", json={"key": _b64("/"), "count_only": True}
        ) as answer,
    ):
        return int((await answer.json(content_type=None))["header"]["revision"])
