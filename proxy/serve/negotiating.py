"""Content negotiation for cached reads: can the cache answer this Accept header, and how?

The cache answers, in the first of the client's media ranges it can produce:
- full objects in protobuf (``application/vnd.kubernetes.protobuf``, as client-go's typed
  clients and kube-controller-manager ask first) for built-in types, from a protobuf shape;
- full objects in JSON (``application/json``);
- ``PartialObjectMetadata[List]`` for metadata-only clients, in protobuf for built-in types
  (``application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1``,
  client-go's metadata informers: the garbage collector) or in JSON;
- nothing else: ``as=Table`` (kubectl get), YAML and CBOR pass through; the apiserver renders
  those. Custom resources have no protobuf form: their protobuf ranges are skipped, as the
  apiserver skips them, and the next range (JSON) is used.

Media ranges are taken in the client's order (q-values are not used by Kubernetes clients).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from proxy.cache.shapes import Encoding
from proxy.kube import protobuf


class Representation(enum.Enum):
    FULL = "full"
    METADATA = "metadata"
    PASS_THROUGH = "pass-through"


_JSON_TYPES = frozenset({"application/json", "application/*", "*/*"})


@dataclass(frozen=True, kw_only=True, slots=True)
class Negotiated:
    representation: Representation
    encoding: Encoding = Encoding.JSON


PASS_THROUGH = Negotiated(representation=Representation.PASS_THROUGH)


def _parameters(parts: list[str]) -> dict[str, str]:
    parameters = {}
    for part in parts:
        name, _, value = part.partition("=")
        parameters[name.strip().lower()] = value.strip().strip('"')
    return parameters


def negotiate(accept: str | None, *, single: bool, protobuf_ok: bool) -> Negotiated:
    """What to answer for ``accept``: a list (``single=False``), or objects one by one (a
    WATCH's events, a GET); ``protobuf_ok``: the resource has a protobuf form (built-in)."""
    if not accept or not accept.strip():
        return Negotiated(representation=Representation.FULL)
    metadata_as = "PartialObjectMetadata" if single else "PartialObjectMetadataList"
    for media_range in accept.split(","):
        media_type, *rest = media_range.split(";")
        media_type = media_type.strip().lower()
        parameters = _parameters(rest)
        if media_type == protobuf.MEDIA_TYPE:
            if not protobuf_ok:
                continue
            encoding = Encoding.PROTOBUF
        elif media_type in _JSON_TYPES:
            encoding = Encoding.JSON
        else:
            continue  # yaml, cbor: the cache cannot, try the next range
        as_kind = parameters.get("as")
        if as_kind is None:
            return Negotiated(representation=Representation.FULL, encoding=encoding)
        if parameters.get("g") != "meta.k8s.io" or parameters.get("v", "v1") != "v1":
            continue
        if as_kind == "Table":
            return PASS_THROUGH  # rendering tables is the apiserver's job
        if as_kind == metadata_as and media_type in ("application/json", protobuf.MEDIA_TYPE):
            return Negotiated(representation=Representation.METADATA, encoding=encoding)
    return PASS_THROUGH


def status_encoding(accept: str | None, *, protobuf_ok: bool) -> Encoding:
    """The encoding of a Status the apiserver writes for ``accept`` (its ``ErrorNegotiated``):
    the first media range it serves as it is — a transformation (``as=Table``,
    ``as=PartialObjectMetadataList``) is not offered for errors — protobuf for a resource
    that has that form, else JSON; JSON when nothing fits."""
    for media_range in (accept or "").split(","):
        media_type, *rest = media_range.split(";")
        media_type = media_type.strip().lower()
        if "as" in _parameters(rest):
            continue
        if media_type == protobuf.MEDIA_TYPE and protobuf_ok:
            return Encoding.PROTOBUF
        if media_type in _JSON_TYPES:
            return Encoding.JSON
    return Encoding.JSON
