"""The API's routes, listed once for both kinds of process that answer them.

A process that owns sessions (a single server, or a worker) registers a handler for each
route; the front, which owns none, registers for each how it passes the request on
(:class:`Reach`). Both read this table, so a route added here is served, or refused with a
startup error naming it, in both.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Handler

from signaling.offers import WHIP_SESSION_PATH

# 30 s of 48 kHz 16-bit stereo: the longest voice clip the engines accept, at its largest.
MAX_PROMPT_BYTES = 30 * 48_000 * 2 * 2 + 1024


class Reach(enum.Enum):
    """Where the front sends a request for this route."""

    NEW_SESSION = "new_session"  # the least-loaded worker (a resume: the session's owner)
    SESSION = "session"  # the worker whose prefix starts ``{session_id}``
    ANY_WORKER = "any_worker"  # any live worker: every worker answers it alike
    # A WebSocket that opens a session (or resumes one, by its hello): relayed whole to
    # the least-loaded worker, or to the resumed session's.
    SOCKET = "socket"


@dataclass(frozen=True)
class ApiRoute:
    method: str
    path: str
    reach: Reach
    handler: str  # the name under which the session-owning process provides its handler
    max_body_bytes: int | None = None  # None: the server's --max-body-bytes


API_ROUTES: tuple[ApiRoute, ...] = (
    ApiRoute("GET", "/engines", Reach.ANY_WORKER, "engines"),
    ApiRoute("GET", "/ws", Reach.SOCKET, "websocket"),
    ApiRoute("POST", "/twilio/voice", Reach.ANY_WORKER, "twilio_voice"),
    ApiRoute("GET", "/twilio/media", Reach.SOCKET, "twilio_media"),
    ApiRoute("POST", "/offer", Reach.NEW_SESSION, "offer"),
    ApiRoute("POST", "/whip", Reach.NEW_SESSION, "whip_publish"),
    ApiRoute("POST", "/whip/{engine}", Reach.NEW_SESSION, "whip_publish"),
    ApiRoute("OPTIONS", "/whip", Reach.ANY_WORKER, "whip_options"),
    ApiRoute("OPTIONS", "/whip/{engine}", Reach.ANY_WORKER, "whip_options"),
    ApiRoute("DELETE", WHIP_SESSION_PATH, Reach.SESSION, "delete_session"),
    ApiRoute("PATCH", WHIP_SESSION_PATH, Reach.SESSION, "whip_trickle"),
    ApiRoute("OPTIONS", WHIP_SESSION_PATH, Reach.SESSION, "whip_options"),
    ApiRoute("DELETE", "/sessions/{session_id}", Reach.SESSION, "delete_session"),
    ApiRoute("GET", "/sessions/{session_id}", Reach.SESSION, "describe"),
    ApiRoute("POST", "/sessions/{session_id}/speak", Reach.SESSION, "speak"),
    ApiRoute("POST", "/sessions/{session_id}/interrupt", Reach.SESSION, "interrupt"),
    ApiRoute("GET", "/sessions/{session_id}/events", Reach.SESSION, "events"),
    ApiRoute(
        "POST", "/sessions/{session_id}/prompt", Reach.SESSION, "set_prompt", MAX_PROMPT_BYTES
    ),
)


def node_prefix(node_id: str | None) -> str:
    """The start of every session id a cluster node hands out: how any node routes to it."""
    return f"{node_id}." if node_id else ""


def node_of(session_id: str) -> str | None:
    """The node a session id names (ids are URL-safe base64, so they have no dots)."""
    node, dot, _ = session_id.partition(".")
    return node if dot else None


def worker_prefix(index: int, node_id: str | None = None) -> str:
    """The start of every session id that worker ``index`` hands out: how the front routes."""
    return f"{node_prefix(node_id)}w{index}-"


_BY_RESOURCE = {(route.method, route.path): route for route in API_ROUTES}


def route_of(request: web.Request) -> ApiRoute | None:
    """The API route a request matched, if it matched one."""
    resource = request.match_info.route.resource
    if resource is None or request.match_info.http_exception is not None:
        return None
    return _BY_RESOURCE.get((request.method, resource.canonical))


def register_api(app: web.Application, handlers: Mapping[str, Handler]) -> None:
    """Serve every API route with the handler of its name; a missing one fails at start-up."""
    missing = sorted({route.handler for route in API_ROUTES} - handlers.keys())
    if missing:
        raise RuntimeError(f"no handler for API routes: {', '.join(missing)}")
    for route in API_ROUTES:
        app.router.add_route(route.method, route.path, handlers[route.handler])


def register_forwarding(app: web.Application, forwarder: Callable[[ApiRoute], Handler]) -> None:
    """Serve every API route with the front's handler for how it is reached."""
    for route in API_ROUTES:
        app.router.add_route(route.method, route.path, forwarder(route))
