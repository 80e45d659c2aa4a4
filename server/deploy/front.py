"""The front process: one public HTTP endpoint in front of one worker process per core.

A Python process saturates one core with aiortc's per-packet work, so the server runs N
workers, each with its own event loop, aiortc stack and engines. The front owns no media:
it serves the page, places each new session on the least-loaded worker (live sessions,
then measured CPU), forwards every later request for that session to its worker (the
worker's prefix is part of the session id, so routing needs no shared state), and refuses
new sessions with 503 at once when the whole server is at capacity.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Sequence

from aiohttp import web
from aiohttp.typedefs import Handler

from server.config import Settings
from server.deploy.front_admin import register_front_admin
from server.deploy.relay import passed_headers, relay
from server.deploy.socket_relay import relay_socket
from server.deploy.workers import CLIENT_HEADER, Front, Worker
from server.http.bodies import read_body
from server.http.clients import client_of
from server.http.errors import json_errors
from server.http.node import NodeLoad, register_node_routes
from server.http.page import register_page
from server.http.routes import ApiRoute, Reach, register_forwarding
from server.http.security import protect
from signaling.errors import ApiError

log = logging.getLogger(__name__)

FRONT_KEY: web.AppKey[Front] = web.AppKey("front")


async def forward(
    request: web.Request, worker: Worker, body: bytes | None = None, limit: int | None = None
) -> web.StreamResponse:
    """Send ``request`` (with ``body`` when already read) to ``worker`` and relay its answer,
    streaming event streams."""
    assert worker.http is not None
    headers = passed_headers(request, frozenset({CLIENT_HEADER.lower()}))
    headers[CLIENT_HEADER] = client_of(request)  # who asked, as the front sees it
    if body is None and request.can_read_body:
        body = await read_body(request, limit or request.app[FRONT_KEY].settings.max_body_bytes)
    unavailable = ApiError(502, "worker_unavailable", "The session's worker did not answer.")
    return await relay(
        request, worker.http, f"http://worker{request.path_qs}", body, headers, unavailable
    )


def _resumed_session(body: bytes) -> str | None:
    """The session id an offer asks to resume, if it does; the worker checks the rest."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None  # the worker gives the precise error
    resume = payload.get("resume") if isinstance(payload, dict) else None
    session_id = resume.get("session_id") if isinstance(resume, dict) else None
    return session_id if isinstance(session_id, str) else None


def _forwarder(route: ApiRoute) -> Handler:
    """The front's handler for ``route``: where it sends the request, by the route's reach.

    Bodies are buffered up to the route's own cap (a voice prompt is far larger than the
    offers and text every other route takes); the worker applies the exact limits.
    """

    async def place_and_forward(request: web.Request) -> web.StreamResponse:
        """A new session goes to the least-loaded worker; a resumed one to the worker that
        has it (it holds its slot already, so capacity does not apply)."""
        front = request.app[FRONT_KEY]
        body = await read_body(request, route.max_body_bytes or front.settings.max_body_bytes)
        resumed = _resumed_session(body) if request.content_type == "application/json" else None
        if resumed is not None:
            return await forward(request, front.owner(resumed), body)
        client = client_of(request)
        worker = front.place(client)
        worker.placing += 1
        worker.clients[client] += 1
        try:
            response = await forward(request, worker, body)
        finally:
            worker.placing -= 1
            worker.clients[client] -= 1
        if response.status in (200, 201):
            # Counted now; the next load reading confirms it.
            worker.sessions += 1
            worker.clients[client] += 1
        return response

    async def to_owner(request: web.Request) -> web.StreamResponse:
        front = request.app[FRONT_KEY]
        owner = front.owner(request.match_info["session_id"])
        return await forward(request, owner, limit=route.max_body_bytes)

    async def to_any(request: web.Request) -> web.StreamResponse:
        front = request.app[FRONT_KEY]
        live = [w for w in front.workers if w.alive]
        if not live:
            raise ApiError(503, "no_workers", "No worker process is running.")
        return await forward(request, live[0], limit=route.max_body_bytes)

    async def socket(request: web.Request) -> web.StreamResponse:
        return await relay_socket(request, request.app[FRONT_KEY])

    handlers = {
        Reach.NEW_SESSION: place_and_forward,
        Reach.SESSION: to_owner,
        Reach.SOCKET: socket,
    }
    return handlers.get(route.reach, to_any)


async def drain_front(app: web.Application) -> None:
    """On SIGTERM: refuse new sessions while the workers drain theirs."""
    await app[FRONT_KEY].drain()


def create_front_app(settings: Settings, worker_args: Sequence[str]) -> web.Application:
    app = web.Application(middlewares=[json_errors], client_max_size=settings.max_body_bytes)
    front = Front(settings, worker_args)
    app[FRONT_KEY] = front
    register_forwarding(app, _forwarder)
    protect(app, settings, register_page(app))
    register_front_admin(app, front)
    register_node_routes(app, FrontNode(front, settings.advertise_url or ""))

    async def on_startup(app: web.Application) -> None:
        await front.start()

    async def on_cleanup(app: web.Application) -> None:
        await front.close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


class FrontNode:
    """A front and its workers as one node of a cluster."""

    def __init__(self, front: Front, url: str) -> None:
        self._front = front
        self._url = url

    def load(self) -> NodeLoad:
        front = self._front
        serving = front.serving
        clients: Counter[str] = Counter()
        for worker in serving:
            clients.update(worker.clients)
        return NodeLoad(
            url=self._url,
            capacity=front.capacity,
            live=front.load,
            cpu=max((w.cpu for w in serving), default=0.0),
            engines=front.engine_names,
            draining=front.draining or front.refusing,
            clients={client: n for client, n in clients.items() if client and n > 0},
        )

    def stop_admitting(self) -> None:
        self._front.refusing = True
