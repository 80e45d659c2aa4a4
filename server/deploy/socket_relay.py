"""The front's side of a session's socket (``/ws``, ``/twilio/media``): relayed whole to
one worker.

The front reads the client's first message (``/ws``'s ``hello``) to choose the worker (the
least-loaded one for a new session, the owner for a resume: its id names the worker), opens
a socket to that worker, passes the first message on and then every message both ways
until either side closes. Close codes
cross too, so a hang-up (1000) still ends the session and a dropped client (no close
frame) still only detaches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp
from aiohttp import WSCloseCode, WSMsgType, web

from server.deploy.relay import passed_headers
from server.deploy.workers import CLIENT_HEADER, Front, Worker
from server.http.auth import bearer_token
from server.http.clients import client_of
from server.http.socket_routes import SUBPROTOCOL, accept, refuse, resumed_session
from signaling.errors import ApiError

log = logging.getLogger(__name__)

# What the worker hears when the client vanished without a close frame: not a hang-up.
CLIENT_LOST = WSCloseCode.GOING_AWAY
FORWARDED_TYPES = (WSMsgType.TEXT, WSMsgType.BINARY)


async def relay_socket(request: web.Request, front: Front) -> web.StreamResponse:
    ws, hello = await accept(request)
    if hello is None:
        return ws
    client = client_of(request)
    resumed = resumed_session(hello)
    try:
        worker = front.owner(resumed) if resumed is not None else front.place(client)
        assert worker.http is not None
        upstream = await connect_upstream(
            request, worker.http, f"http://worker{request.path_qs}", {CLIENT_HEADER: client}
        )
    except ApiError as exc:
        await refuse(ws, exc)
        return ws
    placement = _Placement(worker, client) if resumed is None else None
    await relay(ws, hello, upstream, placement)
    return ws


async def relay(
    ws: web.WebSocketResponse,
    first: str,
    upstream: aiohttp.ClientWebSocketResponse,
    placement: _Placement | None = None,
) -> None:
    """Pass the client's first message on, then everything both ways until one side ends."""
    try:
        await upstream.send_str(first)
        await _pipe(ws, upstream, placement)
    finally:
        if placement is not None:
            placement.settle(opened=False)
        await upstream.close()
        await ws.close()


class _Placement:
    """A new session placed on a worker: counted as placing until the worker answers."""

    def __init__(self, worker: Worker, client: str) -> None:
        self._worker = worker
        self._client = client
        self._settled = False
        worker.placing += 1
        worker.clients[client] += 1

    def settle(self, opened: bool) -> None:
        if self._settled:
            return
        self._settled = True
        self._worker.placing -= 1
        self._worker.clients[self._client] -= 1
        if opened:  # counted now; the next load reading confirms it
            self._worker.sessions += 1
            self._worker.clients[self._client] += 1


async def connect_upstream(
    request: web.Request, http: aiohttp.ClientSession, url: str, extra: dict[str, str]
) -> aiohttp.ClientWebSocketResponse:
    """A socket to the process that serves this one (a worker, or another node), carrying
    the request's end-to-end headers and ``extra``."""
    dropped = frozenset(k.lower() for k in extra)
    headers = {
        k: v
        for k, v in passed_headers(request, dropped).items()
        if not k.lower().startswith("sec-websocket")
    }
    headers.update(extra)
    token = bearer_token(request)  # a browser's rides on a subprotocol: pass it as a header
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        return await http.ws_connect(url, headers=headers, protocols=(SUBPROTOCOL,))
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ApiError(502, "upstream_unavailable", "The session's server did not answer.") from exc


async def _pipe(
    ws: web.WebSocketResponse,
    upstream: aiohttp.ClientWebSocketResponse,
    placement: _Placement | None,
) -> None:
    """Carry messages both ways until one side closes; close the other alike."""

    async def down() -> None:
        async for message in upstream:
            if message.type not in FORWARDED_TYPES:
                break
            if placement is not None:
                refused = message.type is WSMsgType.TEXT and '"error"' in message.data
                placement.settle(opened=not refused)
            await _forward(ws, message)
        code = upstream.close_code
        if code in (None, WSCloseCode.ABNORMAL_CLOSURE):
            # 1006 never goes in a close frame: the worker vanished, which is a server error.
            code = WSCloseCode.INTERNAL_ERROR
        await ws.close(code=code, message=b"")

    async def up() -> None:
        async for message in ws:
            if message.type not in FORWARDED_TYPES:
                break
            await _forward(upstream, message)
        code = ws.close_code if ws.close_code not in (None, WSCloseCode.ABNORMAL_CLOSURE) else None
        await upstream.close(code=code or CLIENT_LOST)

    tasks = [asyncio.create_task(down()), asyncio.create_task(up())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, RuntimeError):
                await task


async def _forward(
    to: web.WebSocketResponse | aiohttp.ClientWebSocketResponse, message: aiohttp.WSMessage
) -> None:
    if message.type is WSMsgType.TEXT:
        await to.send_str(message.data)
    else:
        await to.send_bytes(message.data)
