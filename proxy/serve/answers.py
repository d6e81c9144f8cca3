"""Status answers: how warmwatch answers an error, in the apiserver's own form.

A Status is written as the apiserver writes it: compact JSON and a newline (or its protobuf
form, in the encoding the client negotiated: ``routing.statuses``), with ``Retry-After``
from ``details.retryAfterSeconds``.
"""

from __future__ import annotations

from aiohttp import web

from proxy.cache.shapes import Encoding
from proxy.kube import protobuf
from proxy.kube.status import StatusError
from proxy.upstream.errors import UpstreamUnavailable

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
