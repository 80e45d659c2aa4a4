"""A worker process: one event loop, one aiortc stack, its own engines, behind a front.

The front process (``server.deploy.front``) starts one worker per core and talks to each over a
Unix socket with plain HTTP: the worker serves the whole API for the sessions it owns,
plus ``GET /internal/load`` for placement. Media never passes through the front: each
worker's peer connections send and receive RTP themselves.
"""

from __future__ import annotations

import logging
import os
import time

from aiohttp import web

from server.config import Settings
from server.deploy.engines import load_engines
from server.deploy.parent import die_with_parent
from server.deploy.runner import serve_unix
from server.http.app import SERVER_KEY, create_app, drain_sessions
from server.http.routes import worker_prefix

log = logging.getLogger(__name__)


class LoadMeter:
    """CPU this process used since the last reading, as a fraction of one core."""

    def __init__(self) -> None:
        self._cpu = time.process_time()
        self._wall = time.monotonic()

    def read(self) -> float:
        cpu, wall = time.process_time(), time.monotonic()
        fraction = (cpu - self._cpu) / max(wall - self._wall, 1e-6)
        self._cpu, self._wall = cpu, wall
        return round(fraction, 3)


def run_worker(settings: Settings, index: int, socket_path: str) -> int:
    die_with_parent()
    registry = load_engines(settings)
    app = create_app(settings, registry, id_prefix=worker_prefix(index, settings.node_id))
    meter = LoadMeter()

    async def load(request: web.Request) -> web.Response:
        sessions = app[SERVER_KEY].sessions
        return web.json_response(
            {
                "index": index,
                "pid": os.getpid(),
                "sessions": len(sessions),
                "cpu": meter.read(),
                "clients": sessions.sessions_by_client(),
            }
        )

    app.router.add_get("/internal/load", load)
    serve_unix(app, socket_path, drain_sessions)
    registry.close()
    return 0
