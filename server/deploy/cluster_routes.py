"""Requests that belong to another node reach it from any node.

A middleware on the node's public app (a single server's, or the front's):

- a new session (offer, WHIP) is placed by the cluster (``Cluster.place``): on this node it
  is handled here, on another it is relayed there with the reservation, which the chosen
  node checks in Redis before it takes the offer (a client cannot claim one); media then
  flows between the caller and that node. A node that began to drain (or vanished) after
  Redis last heard from it refuses the offer, which is then placed on another node. A
  resumed session goes to the node that has it.
- every later request for a session (WHIP ``Location``, PATCH, DELETE, speak, interrupt,
  events, a socket's resume) goes to the node its id names (ids start ``<node>.``); a node
  that has left answers for its sessions with 404 ``session_not_found`` at once.
- the whole cluster full: 503 ``at_capacity`` with ``Retry-After``; a client holding its
  share across the cluster: 429 ``client_session_limit``.

While Redis is away, offers are admitted here (local admission only) and other nodes'
sessions are reached at the addresses last known.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import CollectorRegistry, Counter

from server.config import Settings
from server.deploy.cluster import Cluster, Placement
from server.deploy.relay import passed_headers, relay
from server.deploy.socket_relay import connect_upstream
from server.deploy.socket_relay import relay as relay_socket
from server.http.bodies import read_body
from server.http.clients import CLIENT_KEY, PLACED_CHECK, client_of
from server.http.node import CLUSTER_KEY
from server.http.routes import ApiRoute, Reach, node_of, route_of
from server.http.socket_routes import OPENED_SOCKET, accept, refuse, resumed_session
from server.sessions import refusals
from signaling.errors import ApiError

log = logging.getLogger(__name__)

RESERVATION_HEADER = "X-Cosyrtc-Reservation"
PLACED_CLIENT_HEADER = "X-Cosyrtc-Placed-Client"  # who asked, as the placing node saw it
NODE_TIMEOUT = aiohttp.ClientTimeout(total=30, sock_connect=1.0)
INTERNAL = frozenset({RESERVATION_HEADER.lower(), PLACED_CLIENT_HEADER.lower()})
CREATED = (200, 201)
PLACED_KEY = web.RequestKey("placed_reservation", str)
# A placed node may start draining (or vanish) before its record says so: the offer is
# placed again elsewhere, so a rolling restart refuses nothing.
PLACEMENT_ATTEMPTS = 3
DRAINING = refusals.draining().code


class ClusterRouting:
    def __init__(
        self, cluster: Cluster, settings: Settings, registry: CollectorRegistry | None
    ) -> None:
        self._cluster = cluster
        self._settings = settings
        self._http: aiohttp.ClientSession | None = None
        self._placements = Counter(
            "cosyrtc_placements",
            "New sessions this node placed, by the node that took them.",
            ["node"],
            registry=registry,
        )

    async def start(self, app: web.Application) -> None:
        self._http = aiohttp.ClientSession(timeout=NODE_TIMEOUT)
        self._cluster.start()

    async def stop(self, app: web.Application) -> None:
        if self._http is not None:
            await self._http.close()
        await self._cluster.close()

    def middleware(self) -> Middleware:
        @web.middleware
        async def route_across_nodes(request: web.Request, handler: Handler) -> web.StreamResponse:
            route = route_of(request)
            if route is not None and route.reach is Reach.SESSION:
                owner = node_of(request.match_info["session_id"])
                if owner is not None and owner != self._cluster.node_id:
                    return await self._to_node(request, owner, body=None, route=route)
            if route is not None and route.reach is Reach.NEW_SESSION:
                return await self._new_session(request, route, handler)
            if route is not None and route.handler == "websocket":
                return await self._socket(request, handler)
            return await handler(request)

        return route_across_nodes

    async def _socket(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """A socket whose hello resumes a session another node owns is relayed there whole;
        any other is this node's (new sessions over sockets are admitted where they land)."""
        ws, hello = await accept(request)
        if hello is None:
            return ws
        resumed = resumed_session(hello)
        owner = node_of(resumed) if resumed is not None else None
        if owner is None or owner == self._cluster.node_id:
            request[OPENED_SOCKET] = (ws, hello)
            return await handler(request)
        gone = ApiError(404, "session_not_found", "No live session has that id.")
        url = await self._cluster.url_of(owner)
        if url is None or self._http is None:
            await refuse(ws, gone)
            return ws
        try:
            upstream = await connect_upstream(
                request, self._http, url.rstrip("/") + request.path_qs, {}
            )
        except ApiError:  # the node vanished with its sessions (its record has not expired)
            await refuse(ws, gone)
            return ws
        await relay_socket(ws, hello, upstream)
        return ws

    async def _new_session(
        self, request: web.Request, route: ApiRoute, handler: Handler
    ) -> web.StreamResponse:
        body = await read_body(request, route.max_body_bytes or self._settings.max_body_bytes)
        offer = _json(body) if request.content_type == "application/json" else None
        resumed = _resumed_session(offer)
        if resumed is not None:
            owner = node_of(resumed)
            if owner is not None and owner != self._cluster.node_id:
                return await self._to_node(request, owner, body, route)
            return await handler(request)
        if await self.placed_here(request):
            reservation = request[PLACED_KEY]
            return await self._here(request, handler, reservation, client_of(request))
        client = client_of(request)
        engine = request.match_info.get("engine") or _engine(offer) or self._settings.engine
        limit = self._settings.max_client_sessions
        refused_by: list[str] = []
        for _ in range(PLACEMENT_ATTEMPTS):
            placement = await self._cluster.place(engine, client, limit, refused_by)
            if placement is None:  # Redis away: this node decides alone
                return await handler(request)
            if placement.outcome == "client_limit":
                raise refusals.client_limit(limit)
            if placement.outcome != "ok" or placement.node_id is None:
                break
            self._placements.labels(placement.node_id).inc()
            response = await self._open_on(placement, request, handler, body, client)
            if response is not None:
                return response
            refused_by.append(placement.node_id)
        raise refusals.unavailable(
            "at_capacity", "Every node of the cluster is at capacity; retry shortly."
        )

    async def _open_on(
        self,
        placement: Placement,
        request: web.Request,
        handler: Handler,
        body: bytes,
        client: str,
    ) -> web.StreamResponse | None:
        """The session opened on the placed node, or None when that node began to drain
        (or vanished) after Redis last heard from it: the offer is then placed again."""
        assert placement.node_id is not None and placement.reservation is not None
        if placement.node_id == self._cluster.node_id:
            try:
                response = await self._here(request, handler, placement.reservation, client)
            except ApiError as exc:
                if exc.code == DRAINING:
                    return None
                raise
            return None if _refused_as_draining(response) else response
        headers = {RESERVATION_HEADER: placement.reservation, PLACED_CLIENT_HEADER: client}
        try:
            response = await self._relay(request, placement.url or "", body, headers)
        except ApiError:
            await self._cluster.release(placement.node_id, placement.reservation, client)
            return None
        if response.status not in CREATED:
            await self._cluster.release(placement.node_id, placement.reservation, client)
            if _refused_as_draining(response):
                return None
        return response

    async def placed_here(self, request: web.Request) -> bool:
        """Whether another node placed this offer here (its reservation is in Redis); then
        the client it was placed for is the request's client."""
        if PLACED_KEY in request:
            return True
        reservation = request.headers.get(RESERVATION_HEADER)
        if reservation is None or not await self._cluster.is_reserved(reservation):
            return False
        request[PLACED_KEY] = reservation
        request[CLIENT_KEY] = request.headers.get(PLACED_CLIENT_HEADER, client_of(request))
        return True

    async def _here(
        self, request: web.Request, handler: Handler, reservation: str, client: str
    ) -> web.StreamResponse:
        """Open the session on this node; then publish it and drop the reservation together."""
        try:
            response = await handler(request)
        except BaseException:
            await self._cluster.release(self._cluster.node_id, reservation, client)
            raise
        if response.status in CREATED:
            await self._cluster.publish(reservation, client)
        else:
            await self._cluster.release(self._cluster.node_id, reservation, client)
        return response

    async def _to_node(
        self, request: web.Request, node_id: str, body: bytes | None, route: ApiRoute
    ) -> web.StreamResponse:
        url = await self._cluster.url_of(node_id)
        if url is None:
            raise ApiError(404, "session_not_found", "No live session has that id.")
        if body is None and request.can_read_body:
            body = await read_body(request, route.max_body_bytes or self._settings.max_body_bytes)
        try:
            return await self._relay(request, url, body, {})
        except ApiError:
            # The node vanished with its sessions (its record has not expired yet).
            raise ApiError(404, "session_not_found", "No live session has that id.") from None

    async def _relay(
        self, request: web.Request, base_url: str, body: bytes | None, extra: dict[str, str]
    ) -> web.StreamResponse:
        assert self._http is not None
        headers = {**passed_headers(request, INTERNAL), **extra}
        unavailable = ApiError(502, "node_unavailable", "The session's node did not answer.")
        url = base_url.rstrip("/") + request.path_qs
        return await relay(request, self._http, url, body, headers, unavailable)


def attach_cluster(
    app: web.Application,
    cluster: Cluster,
    settings: Settings,
    registry: CollectorRegistry | None = None,
) -> None:
    """Make ``app`` a node of ``cluster``: its routing after the guards, its membership for
    the app's life."""
    routing = ClusterRouting(cluster, settings, registry)
    app[CLUSTER_KEY] = cluster
    app[PLACED_CHECK] = routing.placed_here
    app.middlewares.append(routing.middleware())
    app.on_startup.append(routing.start)
    app.on_cleanup.append(routing.stop)


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None  # the handler gives the precise error


def _refused_as_draining(response: web.StreamResponse) -> bool:
    """Whether ``response`` is a node's 503 ``draining`` (relayed, or from the front)."""
    if response.status != 503 or not isinstance(response, web.Response):
        return False
    refusal = _json(response.body) if isinstance(response.body, bytes) else None
    return isinstance(refusal, dict) and refusal.get("error") == DRAINING


def _engine(offer: Any) -> str | None:
    engine = offer.get("engine") if isinstance(offer, dict) else None
    return engine if isinstance(engine, str) and engine else None


def _resumed_session(offer: Any) -> str | None:
    resume = offer.get("resume") if isinstance(offer, dict) else None
    session_id = resume.get("session_id") if isinstance(resume, dict) else None
    return session_id if isinstance(session_id, str) else None
