"""How warmwatch's answers look like the apiserver's: its Status answers, and the headers the
apiserver puts on every answer (:func:`apiserver_headers`, on every response of the API
listener, passed through or not).

A Status is written as the apiserver writes it: compact JSON and a newline (or its protobuf
form, in the encoding the client negotiated: ``routing.statuses``), with ``Retry-After``
from ``details.retryAfterSeconds``.
"""

from __future__ import annotations

import uuid

from aiohttp import web

from proxy.cache.shapes import Encoding
from proxy.kube import protobuf
from proxy.kube.status import StatusError
from proxy.upstream.errors import UpstreamUnavailable

BARE = "warmwatch.bare"
"""Marks an answer Go's HTTP server itself would write: no apiserver headers on it."""

STATUS = web.ResponseKey("warmwatch.status", StatusError)
"""The StatusError an answer of :func:`status_response` carries: the serving layer writes it
again in the encoding the client negotiated (``serve/routing.statuses``)."""


def status_response(error: StatusError, *, encoding: Encoding = Encoding.JSON) -> web.Response:
    """The Status answer as the apiserver writes it. The one way warmwatch answers an
    error."""
    if encoding is Encoding.PROTOBUF:
        response = web.Response(
            status=error.code, body=error.to_protobuf(), content_type=protobuf.MEDIA_TYPE
        )
    else:
        response = web.Response(
            status=error.code, body=error.to_http_body(), content_type="application/json"
        )
    if error.retry_after is not None:
        response.headers["Retry-After"] = str(error.retry_after)
    response[STATUS] = error
    return response


def unavailable(error: UpstreamUnavailable) -> web.Response:
    """The answer while the apiserver cannot be reached: 503 with ``Retry-After: 1``."""
    return status_response(StatusError.service_unavailable(str(error), retry_after_seconds=1))


async def apiserver_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Headers the apiserver puts on every answer, where the answer (ours, or passed through
    from the apiserver) lacks them: ``Audit-Id`` (the client's, echoed, else a new one) and
    ``Cache-Control: no-cache, private``."""
    if response.get(BARE):
        return
    if "Audit-Id" not in response.headers:
        response.headers["Audit-Id"] = request.headers.get("Audit-Id") or str(uuid.uuid4())
    response.headers.setdefault("Cache-Control", "no-cache, private")
