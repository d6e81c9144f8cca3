"""WebSocket upgrades (exec, attach, port-forward, kubectl 1.30+): opened upstream first,
then relayed frame by frame. SPDY upgrades are refused by passthrough (``passing``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp
from aiohttp import web

from proxy.kube.status import StatusError
from proxy.serve.answers import status_response, unavailable
from proxy.upstream.connecting import Credentials, Upstream
from proxy.upstream.errors import UpstreamStatusError, UpstreamUnavailable
from proxy.upstream.forwarding import count, forwarded_request_headers

logger = logging.getLogger(__name__)

# ------------------------------------------------------------------------- websockets


def _offered_protocols(request: web.BaseRequest) -> list[str]:
    return [
        token.strip()
        for value in request.headers.getall("Sec-WebSocket-Protocol", [])
        for token in value.split(",")
        if token.strip()
    ]


async def relay_websocket(
    request: web.Request, *, upstream: Upstream, credentials: Credentials
) -> web.StreamResponse:
    """Open the WebSocket upstream first (offering the client's subprotocols), then accept the
    client's with the subprotocol the apiserver chose, and relay frames both ways."""
    verb = request.method.upper()
    if not web.WebSocketResponse().can_prepare(request).ok:
        refused = status_response(StatusError.bad_request("invalid WebSocket handshake"))
        count(upstream, verb, refused.status)
        return refused
    headers = forwarded_request_headers(request.headers, websocket=True)
    try:
        async with upstream.websocket(
            request.raw_path,
            headers=headers,
            protocols=_offered_protocols(request),
            credentials=credentials,
        ) as upstream_ws:
            chosen = upstream_ws.protocol
            client_ws = web.WebSocketResponse(
                protocols=(chosen,) if chosen else (),
                # Frames are relayed as they are, pings and closes included.
                autoping=False,
                autoclose=False,
                max_msg_size=0,
            )
            await client_ws.prepare(request)
            count(upstream, verb, 101)
            await _relay(client_ws, upstream_ws, label=request.path)
            return client_ws
    except UpstreamUnavailable as error:
        count(upstream, verb, "error")
        return unavailable(error)
    except UpstreamStatusError as error:
        count(upstream, verb, error.code)
        return status_response(error.to_status_error())


_Socket = web.WebSocketResponse | aiohttp.ClientWebSocketResponse


async def _relay(
    client_ws: web.WebSocketResponse, upstream_ws: aiohttp.ClientWebSocketResponse, *, label: str
) -> None:
    to_upstream = asyncio.create_task(
        _relay_frames(client_ws, upstream_ws), name=f"websocket relay client->apiserver {label}"
    )
    to_client = asyncio.create_task(
        _relay_frames(upstream_ws, client_ws), name=f"websocket relay apiserver->client {label}"
    )
    tasks = {to_upstream, to_client}
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        # One direction ended (a close was relayed, or a side vanished): end both.
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        with contextlib.suppress(Exception):
            await upstream_ws.close()
        with contextlib.suppress(Exception):
            await client_ws.close()


async def _relay_frames(source: _Socket, sink: _Socket) -> None:
    while True:
        message = await source.receive()
        kind = message.type
        if kind is aiohttp.WSMsgType.BINARY:
            await sink.send_bytes(message.data)
        elif kind is aiohttp.WSMsgType.TEXT:
            await sink.send_str(message.data)
        elif kind is aiohttp.WSMsgType.PING:
            await sink.ping(message.data)
        elif kind is aiohttp.WSMsgType.PONG:
            await sink.pong(message.data)
        elif kind is aiohttp.WSMsgType.CLOSE:
            code = message.data if isinstance(message.data, int) and message.data else 1000
            if code in (1005, 1006, 1015):  # reserved: never sent in a close frame
                code = 1000
            reason = (message.extra or "").encode()
            await sink.close(code=code, message=reason)
            return
        else:  # CLOSING, CLOSED, ERROR: the source is gone
            return
