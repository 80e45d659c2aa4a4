"""The aiohttp application: signaling routes, the page, health, and the process resources.

``Server`` owns what lives as long as the process: the engine registry (models loaded
once), the engine threads that run engine calls off the event loop (most urgent call
first: ``media.pipeline.executor``), and the session manager.
"""

from __future__ import annotations

import logging

from aiohttp import web

from media.audio.vad import VadUnavailable
from media.engines.registry import EngineRegistry
from media.pipeline.executor import PriorityPool
from media.pipeline.shared_vad import SharedVad
from media.rtc.compat import (
    accept_rsa_dtls_peers,
    announce_host_address,
    bind_host_ports,
    restrict_host_addresses,
)
from server.config import Settings
from server.http import observability
from server.http.errors import json_errors
from server.http.node import ProcessNode, register_node_routes
from server.http.page import register_page
from server.http.prompt_routes import PromptRoutes
from server.http.routes import register_api
from server.http.security import protect
from server.http.session_routes import SessionRoutes
from server.http.signaling_routes import SignalingRoutes
from server.http.socket_routes import SocketRoutes
from server.http.twilio_routes import TwilioRoutes
from server.sessions.manager import SessionManager

log = logging.getLogger(__name__)

SERVER_KEY: web.AppKey[Server] = web.AppKey("server")


class Server:
    """The process-wide parts, built once and closed once."""

    def __init__(self, settings: Settings, registry: EngineRegistry, id_prefix: str = "") -> None:
        self.settings = settings
        self.registry = registry
        self.executor = PriorityPool(settings.engine_threads, thread_name_prefix="engine")
        self.vad = load_vad()
        self.sessions = SessionManager(
            settings, registry, self.executor, self.vad, id_prefix=id_prefix
        )

    async def close(self) -> None:
        await self.sessions.close_all()
        if self.vad is not None:
            self.vad.close()
        self.executor.shutdown(wait=True)


def load_vad() -> SharedVad | None:
    """The shared voice activity detector for barge-in, or None (logged) when missing."""
    try:
        return SharedVad()
    except VadUnavailable as exc:
        log.warning("barge-in disabled: %s", exc)
        return None


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
    register_api(
        app,
        {
            **SignalingRoutes(
                server.sessions, settings.ice_servers, settings.max_body_bytes
            ).handlers(),
            **SessionRoutes(server.sessions).handlers(),
            **PromptRoutes(server.sessions).handlers(),
            **SocketRoutes(server.sessions).handlers(),
            **TwilioRoutes(server.sessions, settings).handlers(),
        },
    )
    protect(app, settings, register_page(app))
    observability.register(app, server.sessions, settings)
    node = ProcessNode(
        server.sessions, settings.advertise_url or "", settings.max_sessions, tuple(registry.names)
    )
    register_node_routes(app, node)

    async def on_shutdown(app: web.Application) -> None:
        await server.close()

    app.on_shutdown.append(on_shutdown)
    return app
