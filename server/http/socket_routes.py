"""``GET /ws``: a session over a WebSocket, for clients that cannot or need not use WebRTC.

The first message is the client's ``hello`` (``signaling.websocket``); the answer is
``ready`` with the session id and its resume token, or an ``error`` and a close code of
``4000 + the HTTP status`` the same refusal would have had (``4503``: at capacity, with
``retry_after_s``). Then binary messages carry audio both ways
(``media.transports.socket_frames``) and text messages the data channel's JSON control
messages and events, plus ``ack``/``credit`` (flow control) and ``bye`` (hang up).

A socket that closes with code 1000, or after ``bye``, ends its session; any other close
(a dropped network, a crashed client) detaches it, resumable with the token for the grace
period like a WebRTC call. The heartbeat notices a peer that vanished without a close.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from aiohttp import WSCloseCode, WSMsgType, web
from aiohttp.typedefs import Handler

from server.http.clients import client_of
from server.sessions.manager import SessionManager
from signaling.errors import ApiError
from signaling.websocket import parse_hello, ready_message

log = logging.getLogger(__name__)

SUBPROTOCOL = "cosyrtc"
HELLO_TIMEOUT_S = 10.0
HEARTBEAT_S = 5.0  # a ping this often; a peer that answers none is gone
# aiohttp's own cap on a message, above every limit the protocol checks itself (a 16 KiB
# hello or control message, 120 ms of audio): those get their precise refusal, and only a
# message far beyond them is cut off by aiohttp (close 1009).
MAX_SOCKET_MESSAGE_BYTES = 64 * 1024


class WebSocketLink:
    """An aiohttp WebSocket as the transport's link."""

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self._ws = ws

    async def send_bytes(self, data: bytes) -> None:
        await self._ws.send_bytes(data)

    async def send_str(self, data: str) -> None:
        await self._ws.send_str(data)

    async def close(self, code: int, reason: str) -> None:
        await self._ws.close(code=code, message=reason.encode())


def refusal(exc: ApiError) -> str:
    """An ``ApiError`` as the socket's ``error`` message."""
    message: dict[str, str | int] = {"type": "error", "error": exc.code, "message": exc.message}
    retry_after = exc.headers.get("Retry-After")
    if retry_after is not None:
        message["retry_after_s"] = int(retry_after)
    return json.dumps(message)


class SocketGone(Exception):
    """The client closed or dropped the socket before its first message."""


async def first_text(ws: web.WebSocketResponse) -> str:
    """The client's first message, which must be text, within ``HELLO_TIMEOUT_S``;
    ``SocketGone`` when the socket ended first (there is no one left to refuse)."""
    try:
        async with asyncio.timeout(HELLO_TIMEOUT_S):
            message = await ws.receive()
    except TimeoutError:
        raise ApiError(408, "hello_timeout", "Send the hello within 10 s.") from None
    if message.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
        raise SocketGone
    if message.type is not WSMsgType.TEXT:
        raise ApiError(400, "invalid_hello", "The first message must be a JSON text hello.")
    return str(message.data)


async def refuse(ws: web.WebSocketResponse, exc: ApiError) -> None:
    """Tell the client why (if it is still there) and close with ``4000 + status``."""
    with contextlib.suppress(ConnectionError, RuntimeError):
        await ws.send_str(refusal(exc))
    await ws.close(code=4000 + exc.status, message=exc.code.encode())


def open_socket(request: web.Request) -> web.WebSocketResponse:
    """The response that upgrades ``request``, or 426 when it is not a WebSocket request."""
    ws = web.WebSocketResponse(
        heartbeat=HEARTBEAT_S, max_msg_size=MAX_SOCKET_MESSAGE_BYTES, protocols=(SUBPROTOCOL,)
    )
    if not ws.can_prepare(request).ok:
        raise ApiError(
            426,
            "websocket_required",
            "This route speaks WebSocket: open it with a WebSocket client.",
            headers={"Upgrade": "websocket"},
        )
    return ws


# A socket a middleware already upgraded, with the first message it read (a cluster node
# reads the hello to see whether it resumes a session another node owns).
OPENED_SOCKET: web.RequestKey[tuple[web.WebSocketResponse, str]] = web.RequestKey(
    "opened_socket", tuple
)


async def accept(request: web.Request) -> tuple[web.WebSocketResponse, str | None]:
    """Upgrade ``request`` and read the client's first message; None for the message when
    the socket is done already (gone, or refused with its reason)."""
    ws = open_socket(request)
    await ws.prepare(request)
    try:
        return ws, await first_text(ws)
    except SocketGone:
        return ws, None
    except ApiError as exc:
        await refuse(ws, exc)
        return ws, None


def resumed_session(hello: str) -> str | None:
    """The session id a hello asks to resume, if it does; the owner checks the rest."""
    try:
        payload = json.loads(hello)
    except (ValueError, RecursionError):
        return None
    resume = payload.get("resume") if isinstance(payload, dict) else None
    session_id = resume.get("session_id") if isinstance(resume, dict) else None
    return session_id if isinstance(session_id, str) else None


class SocketRoutes:
    def __init__(self, sessions: SessionManager) -> None:
        self._sessions = sessions

    def handlers(self) -> dict[str, Handler]:
        """This class's handlers by their names in ``server.http.routes``."""
        return {"websocket": self.websocket}

    async def websocket(self, request: web.Request) -> web.StreamResponse:
        if OPENED_SOCKET in request:
            ws, first = request[OPENED_SOCKET]
        else:
            ws, opened = await accept(request)
            if opened is None:
                return ws
            first = opened
        link = WebSocketLink(ws)
        try:
            hello = parse_hello(first)
            attached = await self._sessions.open_socket(hello, link, client_of(request))
        except ApiError as exc:
            await refuse(ws, exc)
            return ws
        session, connection = attached.session, attached.connection
        hung_up = False
        try:  # from here on the session is listed: whatever happens, the socket's end is told
            await ws.send_str(
                ready_message(
                    session.id,
                    session.resume_token,
                    session.engine.name,
                    session.engine.kind.value,
                    attached.codec,
                    connection.credit_ms,
                    attached.next_seq,
                    attached.resumed,
                )
            )
            connection.start()
            async for message in ws:
                if message.type is WSMsgType.BINARY:
                    connection.receive_bytes(message.data)
                elif message.type is WSMsgType.TEXT and connection.receive_text(message.data):
                    hung_up = True
                    break
        except (ConnectionError, RuntimeError) as exc:
            log.debug("session %s: socket ended: %s", session.id, exc)
        finally:
            hung_up = hung_up or ws.close_code == WSCloseCode.OK
            await self._sessions.socket_closed(session, connection, hung_up)
            await ws.close()
        return ws
