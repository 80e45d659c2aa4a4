"""Operator routes of a process that owns sessions: ``GET /sessions`` and ``GET /readyz``.

``/healthz`` says the process is alive; ``/readyz`` says whether it should be sent new
sessions: its default engine not refused by its circuit breaker, below capacity and not
draining. Engines load before the app exists (``create_app`` refuses a default engine that
did not load), so a process that answers has its engines. A load balancer takes a node
out of rotation on 503 and puts it back on 200, without touching its live sessions.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from server.config import Settings
from server.sessions.manager import SessionManager
from server.sessions.session import Session


def session_summary(session: Session) -> dict[str, Any]:
    """One line of the session list: who, what, how long, and whether audio flows."""
    pipeline = session.pipeline
    return {
        "session_id": session.id,
        "engine": session.engine.name,
        "kind": session.engine.kind.value,
        "connection_state": session.connection_state,
        "age_s": round(time.time() - session.opened_at, 1),
        "frames_out": pipeline.output.frames_sent,
        "in_to_out_ms": pipeline.counters().in_to_out_recent_ms,
    }


def readiness(reasons: Sequence[str], **details: Any) -> web.Response:
    """200 with the details when there is no reason to refuse sessions, else 503 with them."""
    body: dict[str, Any] = {"ready": not reasons, "reasons": list(reasons), **details}
    if reasons:
        body["error"] = "not_ready"
        body["message"] = f"Not ready for new sessions: {', '.join(reasons)}."
    return web.json_response(body, status=503 if reasons else 200)


class AdminRoutes:
    def __init__(self, manager: SessionManager, settings: Settings) -> None:
        self._manager = manager
        self._settings = settings

    def register(self, app: web.Application) -> None:
        app.router.add_get("/sessions", self.sessions)
        app.router.add_get("/readyz", self.readyz)

    async def sessions(self, request: web.Request) -> web.Response:
        summaries = [session_summary(s) for s in self._manager.live_sessions()]
        return web.json_response({"sessions": summaries})

    async def readyz(self, request: web.Request) -> web.Response:
        reasons = []
        if self._manager.breakers[self._settings.engine].is_open:
            reasons.append("engine_circuit_open")  # the default engine failed repeatedly
        if self._manager.draining:
            reasons.append("draining")
        if self._manager.at_capacity:
            reasons.append("at_capacity")
        return readiness(
            reasons, sessions=len(self._manager), max_sessions=self._settings.max_sessions
        )
