"""HTTP routes on a live session: speak, interrupt, its event stream and its description.

These serve backends and WHIP clients that have no data channel; they carry the same
messages and events as the data channel does.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from server.sessions.manager import SessionManager
from signaling.errors import ApiError

SSE_KEEPALIVE_SECONDS = 15.0
JSON_TYPE = "application/json"


async def _json_body(request: web.Request) -> Any:
    if request.content_type != JSON_TYPE:
        got = request.content_type or "none"
        raise ApiError(415, "unsupported_media_type", f"Send {JSON_TYPE} (got {got}).")
    try:
        # JSON is UTF-8 (RFC 8259 section 8.1): a charset parameter is not obeyed, so an
        # unknown one cannot fail the decoding.
        return json.loads((await request.read()).decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # also bad UTF-8, a 5000-digit number
        raise ApiError(400, "invalid_json", "The body is not valid JSON.") from exc


class SessionRoutes:
    def __init__(self, sessions: SessionManager) -> None:
        self._sessions = sessions

    def handlers(self) -> dict[str, Handler]:
        """This class's handlers by their names in ``server.http.routes``."""
        return {
            "describe": self.describe,
            "speak": self.speak,
            "interrupt": self.interrupt,
            "events": self.events,
        }

    async def describe(self, request: web.Request) -> web.Response:
        session = self._sessions.get(request.match_info["session_id"])
        return web.json_response(session.describe())

    async def speak(self, request: web.Request) -> web.Response:
        session = self._sessions.get(request.match_info["session_id"])
        body = await _json_body(request)
        if isinstance(body, dict):
            body = {**body, "type": "speak"}
        ack = session.command(body)
        assert ack is not None
        return web.json_response({"id": ack["id"]}, status=202)

    async def interrupt(self, request: web.Request) -> web.Response:
        session = self._sessions.get(request.match_info["session_id"])
        session.command({"type": "interrupt"})
        return web.json_response({"interrupted": True})

    async def events(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: one ``data:`` line of JSON per event, until the session ends."""
        session = self._sessions.get(request.match_info["session_id"])
        queue = session.events.subscribe()
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            }
        )
        await response.prepare(request)
        try:
            await response.write(b": connected\n\n")
            while True:
                try:
                    async with asyncio.timeout(SSE_KEEPALIVE_SECONDS):
                        event = await queue.get()
                except TimeoutError:
                    await response.write(b": keep-alive\n\n")
                    continue
                if event is None:
                    break
                await response.write(f"data: {json.dumps(event)}\n\n".encode())
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            session.events.unsubscribe(queue)
        return response
