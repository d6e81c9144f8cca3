"""Content negotiation for cached reads: can the cache answer this Accept header, and how?

The cache holds JSON. It answers:
- full objects in JSON when the client accepts ``application/json`` (client-go's
  ``application/vnd.kubernetes.protobuf,application/json`` included: client-go picks its decoder
  from the response's Content-Type);
- ``PartialObjectMetadata[List]`` in JSON for metadata-only clients
  (``application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1``);
- nothing else: ``as=Table`` (kubectl get) and protobuf-only requests pass through, the
  apiserver renders those.

Media ranges are taken in the client's order (q-values are not used by Kubernetes clients).
"""

from __future__ import annotations

import enum


class Representation(enum.Enum):
    FULL = "full"
    METADATA = "metadata"
    PASS_THROUGH = "pass-through"


_JSON_TYPES = frozenset({"application/json", "application/*", "*/*"})


def _parameters(parts: list[str]) -> dict[str, str]:
    parameters = {}
    for part in parts:
        name, _, value = part.partition("=")
        parameters[name.strip().lower()] = value.strip().strip('"')
    return parameters


def negotiate(accept: str | None, *, watch: bool) -> Representation:
    """What to answer for ``accept`` on a LIST (``watch=False``) or a WATCH."""
    if not accept or not accept.strip():
        return Representation.FULL
    metadata_as = "PartialObjectMetadata" if watch else "PartialObjectMetadataList"
    for media_range in accept.split(","):
        media_type, *rest = media_range.split(";")
        media_type = media_type.strip().lower()
        parameters = _parameters(rest)
        as_kind = parameters.get("as")
        if as_kind is None:
            if media_type in _JSON_TYPES:
                return Representation.FULL
            continue  # protobuf, yaml, cbor: the cache cannot, try the next range
        if parameters.get("g") != "meta.k8s.io" or parameters.get("v", "v1") != "v1":
            continue
        if as_kind == "Table":
            return Representation.PASS_THROUGH  # rendering tables is the apiserver's job
        if as_kind == metadata_as and media_type == "application/json":
            return Representation.METADATA
    return Representation.PASS_THROUGH
