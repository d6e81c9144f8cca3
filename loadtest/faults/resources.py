"""The two resources of the fault run, ConfigMaps and the widgets custom resource: their
paths, the bodies the traffic writes, and an object as the checker's ``Item``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from loadtest.checking import Item
from loadtest.history import registry_prefix


@dataclass(frozen=True, kw_only=True)
class Resource:
    name: str
    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def flag(self) -> str:
        """warmwatch's ``--resource`` and the identity of the shape that serves every client."""
        return f"{self.api_version}/{self.plural}"

    @property
    def prefix(self) -> str:
        return registry_prefix(group=self.group, resource=self.plural)

    def collection(self, namespace: str | None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        return (
            f"{base}/namespaces/{namespace}/{self.plural}" if namespace else f"{base}/{self.plural}"
        )

    def body(
        self, *, namespace: str, name: str, labels: Mapping[str, str], serial: int, size: int
    ) -> dict[str, Any]:
        metadata = {"name": name, "namespace": namespace, "labels": dict(labels)}
        content = {"serial": str(serial), "payload": "x" * size}
        if self.group:
            return {
                "apiVersion": self.api_version,
                "kind": self.kind,
                "metadata": metadata,
                "spec": content,
            }
        return {"apiVersion": "v1", "kind": self.kind, "metadata": metadata, "data": content}

    def touch(self, serial: int) -> dict[str, Any]:
        return {"spec" if self.group else "data": {"serial": str(serial)}}


CONFIGMAPS = Resource(
    name="configmaps", group="", version="v1", plural="configmaps", kind="ConfigMap"
)


WIDGETS = Resource(
    name="widgets", group="example.com", version="v1", plural="widgets", kind="Widget"
)


RESOURCES = (CONFIGMAPS, WIDGETS)


def as_item(obj: Mapping[str, Any], *, labels: bool) -> Item:
    metadata = obj.get("metadata") or {}
    return Item(
        namespace=str(metadata.get("namespace", "")),
        name=str(metadata["name"]),
        rv=int(metadata["resourceVersion"]),
        labels=dict(metadata.get("labels") or {}) if labels else {},
    )
