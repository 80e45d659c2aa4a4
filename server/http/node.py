"""This process as a node: its load as other nodes see it, and the routes that show it.

A node is what one public address serves: a single server, or a front with its workers.
``GET /cluster`` (admin) lists the nodes and their load (just this one without a cluster);
``POST /admin/drain`` (admin) stops this node taking new sessions while its live ones go on,
and, in a cluster, tells the other nodes at once: what a rolling restart needs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from aiohttp import web

from server.sessions.manager import SessionManager
from signaling.errors import ApiError


@dataclass(frozen=True)
class NodeLoad:
    """What a node tells the cluster about itself."""

    url: str
    capacity: int
    live: int
    cpu: float
    engines: tuple[str, ...]
    draining: bool
    clients: Mapping[str, int]


class LocalNode(Protocol):
    """The process a node's routes and its cluster membership speak for."""

    def load(self) -> NodeLoad: ...

    def stop_admitting(self) -> None: ...


class ClusterView(Protocol):
    """The cluster, as the node's routes see it (``server.deploy.cluster``)."""

    node_id: str

    async def nodes(self) -> list[dict[str, Any]] | None: ...

    def changed(self) -> None: ...


NODE_KEY: web.AppKey[LocalNode] = web.AppKey("node")
CLUSTER_KEY: web.AppKey[ClusterView] = web.AppKey("cluster")


class CpuMeter:
    """CPU this process used since the last reading, as a fraction of one core."""

    def __init__(self) -> None:
        self._cpu = time.process_time()
        self._wall = time.monotonic()

    def read(self) -> float:
        cpu, wall = time.process_time(), time.monotonic()
        fraction = (cpu - self._cpu) / max(wall - self._wall, 1e-6)
        self._cpu, self._wall = cpu, wall
        return round(fraction, 3)


class ProcessNode:
    """A single server process as a node: its own sessions are the node's."""

    def __init__(
        self, sessions: SessionManager, url: str, capacity: int, engines: tuple[str, ...]
    ) -> None:
        self._sessions = sessions
        self._url = url
        self._capacity = capacity
        self._engines = engines
        self._cpu = CpuMeter()

    def load(self) -> NodeLoad:
        return NodeLoad(
            url=self._url,
            capacity=self._capacity,
            live=len(self._sessions) + self._sessions.opening,
            cpu=self._cpu.read(),
            engines=self._engines,
            draining=self._sessions.draining,
            clients=self._sessions.sessions_by_client(),
        )

    def stop_admitting(self) -> None:
        self._sessions.draining = True


async def cluster(request: web.Request) -> web.Response:
    view = request.app.get(CLUSTER_KEY)
    if view is None:
        load = request.app[NODE_KEY].load()
        own = {k: v for k, v in asdict(load).items() if k != "clients"}
        return web.json_response({"node_id": None, "cluster": False, "nodes": [own]})
    nodes = await view.nodes()
    if nodes is None:
        raise ApiError(503, "cluster_unavailable", "Redis does not answer; nodes admit locally.")
    return web.json_response({"node_id": view.node_id, "cluster": True, "nodes": nodes})


async def drain(request: web.Request) -> web.Response:
    request.app[NODE_KEY].stop_admitting()
    view = request.app.get(CLUSTER_KEY)
    if view is not None:
        view.changed()
    return web.json_response({"draining": True}, status=202)


def register_node_routes(app: web.Application, node: LocalNode) -> None:
    app[NODE_KEY] = node
    app.router.add_get("/cluster", cluster)
    app.router.add_post("/admin/drain", drain)
