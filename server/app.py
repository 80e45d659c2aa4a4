"""The aiohttp application: signaling routes, the page, health, and the process resources.

``Server`` owns what lives as long as the process: the engine registry (models loaded
once), the thread pool that runs engine calls off the event loop, and the session manager.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from aiohttp import web

from media.engines.registry import EngineRegistry
from media.rtc.compat import accept_rsa_dtls_peers
from media.vad import SileroVad, VadUnavailable
from server import observability, prompt_routes
from server.config import Settings
from server.security import protect
from server.session_routes import SessionRoutes
from server.sessions import SessionManager
from signaling.errors import json_errors
from signaling.ice import announce_host_address, bind_host_ports, restrict_host_addresses
from signaling.routes import SignalingRoutes

log = logging.getLogger(__name__)

WEB_DIR = Path(__file__).resolve().parent.parent / "web"
SERVER_KEY: web.AppKey[Server] = web.AppKey("server")


class Server:
    """The process-wide parts, built once and closed once."""

    def __init__(self, settings: Settings, registry: EngineRegistry, id_prefix: str = "") -> None:
        self.settings = settings
        self.registry = registry
        self.executor = ThreadPoolExecutor(
            max_workers=settings.engine_threads, thread_name_prefix="engine"
        )
        self.sessions = SessionManager(
            settings, registry, self.executor, load_vad(), id_prefix=id_prefix
        )

    async def close(self) -> None:
        await self.sessions.close_all()
        self.executor.shutdown(wait=True)


def load_vad() -> SileroVad | None:
    """The shared voice activity detector for barge-in, or None (logged) when missing."""
    try:
        return SileroVad()
    except VadUnavailable as exc:
        log.warning("barge-in disabled: %s", exc)
        return None


def file_handler(path: Path) -> Callable[[web.Request], Awaitable[web.FileResponse]]:
    async def serve(request: web.Request) -> web.FileResponse:
        return web.FileResponse(path)

    return serve


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def register_page(app: web.Application) -> frozenset[str]:
    """``/healthz`` and the page's files; returns the page's paths, which need no token.

    One route per page file, not a static catch-all at "/": that would answer every unknown
    path itself (an empty, non-JSON 404 for GET, 405 for other methods), and no request path
    can name a file outside web/. Hidden files (an editor's swap file) are not served.
    """
    app.router.add_get("/healthz", healthz)
    pages = {"/": WEB_DIR / "index.html"}
    for path in sorted(WEB_DIR.iterdir()):
        if path.is_file() and not path.name.startswith("."):
            pages[f"/{path.name}"] = path
    for route, path in pages.items():
        app.router.add_get(route, file_handler(path))
    return frozenset(pages)


async def drain_sessions(app: web.Application) -> None:
    """On SIGTERM: refuse new sessions, let live ones finish up to the drain timeout."""
    server = app[SERVER_KEY]
    await server.sessions.drain(server.settings.drain_timeout)


def create_app(
    settings: Settings, registry: EngineRegistry, id_prefix: str = ""
) -> web.Application:
    """Build the app around an already loaded registry (tests share one across apps).

    ``id_prefix`` starts every session id, so a front process can route a session's
    requests to the worker that owns it.
    """
    if settings.engine not in registry.names:
        raise ValueError(
            f"--engine {settings.engine!r} is not available "
            f"(available: {', '.join(registry.names) or 'none'}; "
            f"unavailable: {registry.unavailable or 'none'})"
        )
    accept_rsa_dtls_peers()
    restrict_host_addresses(settings.ice_hosts)
    bind_host_ports(settings.rtp_port_range)
    announce_host_address(settings.announce_ip)
    server = Server(settings, registry, id_prefix)
    app = web.Application(middlewares=[json_errors], client_max_size=settings.max_body_bytes)
    app[SERVER_KEY] = server
    SignalingRoutes(server.sessions, settings.ice_servers, settings.max_body_bytes).register(app)
    SessionRoutes(server.sessions).register(app)
    prompt_routes.register(app, server.sessions)
    protect(app, settings, register_page(app))
    observability.register(app, server.sessions, settings)

    async def on_shutdown(app: web.Application) -> None:
        await server.close()

    app.on_shutdown.append(on_shutdown)
    return app
