"""A small raw HTTP client for tests and load tools: create many objects fast, list, watch.

Tests talk to the apiserver (and to warmwatch) with real clients — kubectl, kubernetes-asyncio,
the Go informer program. This is the harness's own tool for setting the stage: it sends raw JSON
with bounded concurrency so that 20,000 ConfigMaps take seconds, not minutes.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from loadtest import pki


def client_ssl(plane_pki: pki.Pki, *, identity: str) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(plane_pki.ca_cert))
    user = plane_pki.identity(identity)
    context.load_cert_chain(str(user.certificate), str(user.key))
    return context


class ApiError(Exception):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:500]!r}")
        self.status = status
        self.body = body


@dataclass(kw_only=True)
class RawClient:
    """JSON over HTTP to an apiserver-compatible endpoint."""

    base_url: str
    ssl_context: ssl.SSLContext | None = None
    token: str | None = None
    concurrency: int = 32

    def __post_init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> RawClient:
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        self._session = aiohttp.ClientSession(
            base_url=self.base_url,
            headers=headers,
            connector=aiohttp.TCPConnector(ssl=self.ssl_context or False, limit=self.concurrency),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "use `async with RawClient(...)`"
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        ok: Iterable[int] = (200, 201, 202),
    ) -> dict[str, Any]:
        data = orjson.dumps(body) if body is not None else None
        async with self.session.request(
            method,
            path,
            data=data,
            params=params,
            headers={"Content-Type": content_type} if data is not None else None,
        ) as response:
            raw = await response.read()
            if response.status not in set(ok):
                raise ApiError(response.status, raw)
            return orjson.loads(raw) if raw else {}

    async def get(self, path: str, **params: str) -> dict[str, Any]:
        return await self.request("GET", path, params=params or None)

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self.request("POST", path, body=body)

    async def ensure(self, path: str, body: Mapping[str, Any]) -> None:
        """Create, accepting 409 AlreadyExists."""
        await self.request("POST", path, body=body, ok=(200, 201, 202, 409))

    async def delete(self, path: str) -> dict[str, Any]:
        return await self.request("DELETE", path, ok=(200, 202, 404))

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return await self.request(
            "PATCH", path, body=patch, content_type="application/merge-patch+json"
        )

    async def gather(self, calls: Iterable[Any]) -> list[Any]:
        """Run coroutines with at most ``concurrency`` in flight."""
        limit = asyncio.Semaphore(self.concurrency)

        async def bounded(call: Any) -> Any:
            async with limit:
                return await call

        return list(await asyncio.gather(*(bounded(c) for c in calls)))

    async def watch(self, path: str, **params: str) -> AsyncIterator[dict[str, Any]]:
        """Yield watch events (decoded) until the server ends the stream."""
        async with self.session.get(path, params={"watch": "true", **params}) as response:
            if response.status != 200:
                raise ApiError(response.status, await response.read())
            async for line in response.content:
                if line.strip():
                    yield orjson.loads(line)


def configmap(
    *, name: str, namespace: str, size: int = 0, labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A ConfigMap of roughly ``size`` bytes of data."""
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "data": {"payload": "x" * size} if size else {"k": name},
    }
    return body


def custom_resource_definition(
    *, group: str, kind: str, labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A namespaced CRD ``<kind>s.<group>`` (lower case) served and stored as ``v1``,
    schema-less (any field is kept)."""
    singular = kind.lower()
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{singular}s.{group}", "labels": dict(labels or {})},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {
                "plural": f"{singular}s",
                "singular": singular,
                "kind": kind,
                "listKind": f"{kind}List",
            },
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


async def service_account_token(
    client: RawClient, *, namespace: str, account: str, audiences: Sequence[str] = ()
) -> str:
    """A bearer token of the service account (a TokenRequest, valid for an hour), for
    ``audiences`` (none: the apiserver's own)."""
    spec: dict[str, Any] = {"expirationSeconds": 3600}
    if audiences:
        spec["audiences"] = list(audiences)
    answer = await client.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    return str(answer["status"]["token"])


async def ensure_namespace(client: RawClient, name: str) -> None:
    await client.ensure("/api/v1/namespaces", {"metadata": {"name": name}})


async def create_configmaps(
    client: RawClient,
    *,
    namespace: str,
    count: int,
    size: int = 0,
    prefix: str = "cm",
    labels: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Create ``count`` ConfigMaps concurrently; returns the created objects."""
    await ensure_namespace(client, namespace)
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    return await client.gather(
        client.create(
            path, configmap(name=f"{prefix}-{i:06d}", namespace=namespace, size=size, labels=labels)
        )
        for i in range(count)
    )


def kubeconfig_for(
    base_url: str,
    *,
    path: Path,
    token: str | None = None,
    token_file: Path | None = None,
    ca: Path | None = None,
) -> Path:
    """A kubeconfig pointing clients at ``base_url`` (warmwatch's listener, or the
    apiserver), with a bearer ``token`` or a ``token_file`` and, for https, the ``ca``."""
    cluster = f"    server: {base_url}\n" + (f"    certificate-authority: {ca}\n" if ca else "")
    if token:
        user = f"    token: {token}\n"
    elif token_file:
        user = f"    tokenFile: {token_file}\n"
    else:
        user = "    {}\n"
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: warmwatch\n  cluster:\n{cluster}"
        f"users:\n- name: client\n  user:\n{user}"
        "contexts:\n- name: warmwatch\n  context:\n    cluster: warmwatch\n    user: client\n"
        "current-context: warmwatch\n"
    )
    return path
