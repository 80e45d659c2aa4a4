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
import json
import logging

import aiohttp
from aiohttp import WSCloseCode, WSMsgType, web

from server.deploy.relay import passed_headers
from server.deploy.workers import CLIENT_HEADER, Front, Worker
from server.http.auth import bearer_token
from server.http.clients import client_of
from server.http.socket_routes import SUBPROTOCOL, SocketGone, first_text, open_socket, refuse
from signaling.errors import ApiError

log = logging.getLogger(__name__)

# What the worker hears when the client vanished without a close frame: not a hang-up.
CLIENT_LOST = WSCloseCode.GOING_AWAY
FORWARDED_TYPES = (WSMsgType.TEXT, WSMsgType.BINARY)


def _resumed_session(hello: str) -> str | None:
    """The session id a hello asks to resume, if it does; the worker checks the rest."""
    try:
        payload = json.loads(hello)
    except (ValueError, RecursionError):
        return None
    resume = payload.get("resume") if isinstance(payload, dict) else None
    session_id = resume.get("session_id") if isinstance(resume, dict) else None
    return session_id if isinstance(session_id, str) else None


async def relay_socket(request: web.Request, front: Front) -> web.StreamResponse:
    ws = open_socket(request)
    await ws.prepare(request)
    client = client_of(request)
    try:
        hello = await first_text(ws)
        resumed = _resumed_session(hello)
        worker = front.owner(resumed) if resumed is not None else front.place(client)
        upstream = await _connect(request, worker, client)
    except SocketGone:
        return ws
    except ApiError as exc:
        await refuse(ws, exc)
        return ws
    placement = _Placement(worker, client) if resumed is None else None
    try:
        await upstream.send_str(hello)
        await _pipe(ws, upstream, placement)
    finally:
        if placement is not None:
            placement.settle(opened=False)
        await upstream.close()
        await ws.close()
    return ws


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


async def _connect(
    request: web.Request, worker: Worker, client: str
) -> aiohttp.ClientWebSocketResponse:
    assert worker.http is not None
    dropped = frozenset({CLIENT_HEADER.lower(), "sec-websocket-key", "sec-websocket-version"})
    headers = {
        k: v
        for k, v in passed_headers(request, dropped).items()
        if not k.lower().startswith("sec-websocket")
    }
    headers[CLIENT_HEADER] = client
    token = bearer_token(request)  # a browser's rides on a subprotocol: the worker needs it
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        return await worker.http.ws_connect(
            f"http://worker{request.path_qs}", headers=headers, protocols=(SUBPROTOCOL,)
        )
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ApiError(502, "worker_unavailable", "The session's worker did not answer.") from exc


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
        code = upstream.close_code or WSCloseCode.OK
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
