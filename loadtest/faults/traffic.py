"""Traffic straight to the apiserver: creates, updates, label changes and deletes at
``--rate``, in a few namespaces."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from typing import Any

import aiohttp

from loadtest import kubeapi
from loadtest.faults import TIERS
from loadtest.faults.options import Options
from loadtest.faults.resources import RESOURCES


class Traffic:
    """Writes to the apiserver at ``rate`` per second until stopped: creates (names are reused
    after deletion), content updates, label changes, deletes. Failures (the apiserver is down)
    are counted and slow it down; what etcd applied is the reference's business, not ours."""

    CONCURRENCY = 48

    def __init__(self, *, api: kubeapi.RawClient, options: Options, rng: random.Random) -> None:
        self.api = api
        self.options = options
        self.rng = rng
        self.namespaces = options.namespace_names
        self.pool = max(4, int(options.population * 1.2 / len(self.namespaces)))
        self.live: set[tuple[str, str, str]] = set()
        self.busy: set[tuple[str, str, str]] = set()
        self.serial = 0
        self.ops: Counter[str] = Counter()

    async def seed(self) -> None:
        """Learn what exists already (a reused control plane)."""
        for resource in RESOURCES:
            for namespace in self.namespaces:
                body = await self.api.get(resource.collection(namespace))
                for obj in body.get("items") or []:
                    self.live.add((resource.name, namespace, obj["metadata"]["name"]))

    def _labels(self) -> dict[str, str]:
        labels = {"shard": str(self.rng.randrange(2))}
        tier = self.rng.choice(TIERS)
        if tier is not None:
            labels["tier"] = tier
        return labels

    async def run(self, stop: asyncio.Event) -> None:
        tick = 0.05
        carry = 0.0
        limit = asyncio.Semaphore(self.CONCURRENCY)
        tasks: set[asyncio.Task[None]] = set()
        while not stop.is_set():
            started = time.monotonic()
            carry += self.options.rate * tick
            while carry >= 1 and not limit.locked():
                carry -= 1
                await limit.acquire()
                task = asyncio.create_task(self._one())
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                task.add_done_callback(lambda _: limit.release())
            carry = min(carry, self.options.rate)  # do not burst after an outage
            await asyncio.sleep(max(0.0, tick - (time.monotonic() - started)))
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _one(self) -> None:
        resource = self.rng.choice(RESOURCES)
        namespace = self.rng.choice(self.namespaces)
        name = f"{resource.name[:2]}-{self.rng.randrange(self.pool):04d}"
        key = (resource.name, namespace, name)
        if key in self.busy:
            return
        self.busy.add(key)
        self.serial += 1
        serial = self.serial
        path = resource.collection(namespace)
        try:
            async with asyncio.timeout(15):
                if key not in self.live:
                    op = "create"
                    body = resource.body(
                        namespace=namespace,
                        name=name,
                        labels=self._labels(),
                        serial=serial,
                        size=self.options.payload,
                    )
                    await self.api.request("POST", path, body=body, ok=(200, 201, 409))
                    self.live.add(key)
                else:
                    choice = self.rng.random()
                    if choice < 0.2:
                        op = "delete"
                        await self.api.request("DELETE", f"{path}/{name}", ok=(200, 202, 404))
                        self.live.discard(key)
                    else:
                        op = "relabel" if choice < 0.5 else "update"
                        patch = resource.touch(serial)
                        if op == "relabel":
                            labels: dict[str, Any] = {"tier": self.rng.choice(TIERS)}
                            if self.rng.random() < 0.3:
                                labels["shard"] = str(self.rng.randrange(2))
                            patch["metadata"] = {"labels": labels}
                        answer = await self.api.request(
                            "PATCH",
                            f"{path}/{name}",
                            body=patch,
                            content_type="application/merge-patch+json",
                            ok=(200, 404),
                        )
                        if answer.get("kind") == "Status":
                            self.live.discard(key)
            self.ops[op] += 1
        except (kubeapi.ApiError, aiohttp.ClientError, OSError, TimeoutError):
            self.ops["failed"] += 1
            await asyncio.sleep(0.5)  # the apiserver is away: keep the pressure down
        finally:
            self.busy.discard(key)
