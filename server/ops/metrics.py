"""Prometheus metrics of one server process, and the ``GET /metrics`` route.

A process's registry holds the session metrics (``server.ops.session_metrics``), refused offers
by reason, the event loop's lag, and the process's CPU and memory. Reading is split in two:
the session sums are taken on the event loop (plain attribute reads, a few at a time), the
text is formatted in a thread (formatting hundreds of samples, and reading ``/proc`` for
the process metrics, would hold the loop too long).

Offers are counted by a middleware on the session-creating routes, not inside the session
manager: a refused offer raises :class:`ApiError`, whose code is the rejection reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from server.ops.session_metrics import PREFIX, SessionCollector
from server.sessions.manager import SessionManager
from signaling.errors import ApiError

SESSION_CREATING_ROUTES = frozenset({"/offer", "/whip", "/whip/{engine}"})
LOOP_LAG_INTERVAL_SECONDS = 0.1
LOOP_LAG_RECENT = 100  # ten seconds of readings for the recent maximum
LOOP_LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)


class LoopLagMonitor:
    """How late the event loop wakes a coroutine that sleeps 100 ms: the loop's own latency.

    Anything that holds the loop (a slow callback, a blocking call) delays every packet and
    frame of every session in this process by as much; this shows it.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._histogram = Histogram(
            f"{PREFIX}_event_loop_lag_seconds",
            "How late a 100 ms sleep on the event loop wakes up.",
            buckets=LOOP_LAG_BUCKETS,
            registry=registry,
        )
        recent_max = Gauge(
            f"{PREFIX}_event_loop_lag_max_seconds",
            "The largest event-loop lag of the last ten seconds.",
            registry=registry,
        )
        self._recent: list[float] = []
        recent_max.set_function(lambda: max(self._recent, default=0.0))

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            began = loop.time()
            await asyncio.sleep(LOOP_LAG_INTERVAL_SECONDS)
            lag = max(0.0, loop.time() - began - LOOP_LAG_INTERVAL_SECONDS)
            self._histogram.observe(lag)
            self._recent = [*self._recent[-(LOOP_LAG_RECENT - 1) :], lag]


class ProcessMetrics:
    """The metrics registry of one process (a worker, a single server, or the front).

    Each process has its own registry rather than the library's global one, so several
    servers in one process (tests) never share or collide.
    """

    def __init__(self, manager: SessionManager | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        self.rejected = Counter(
            f"{PREFIX}_sessions_rejected",
            "Offers refused, by reason (the error code the client got).",
            labelnames=["reason"],
            registry=self.registry,
        )
        self.loop_lag = LoopLagMonitor(self.registry)
        self.sessions = SessionCollector(manager) if manager is not None else None
        if self.sessions is not None:
            self.registry.register(self.sessions)
        self._running: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._running.append(asyncio.create_task(self.loop_lag.run(), name="loop-lag"))
        if self.sessions is not None:
            self._running.append(asyncio.create_task(self.sessions.run(), name="metrics"))

    async def stop(self) -> None:
        for running in self._running:
            running.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
        self._running.clear()

    async def exposition(self) -> bytes:
        """The text format, summed on the loop and formatted in a thread."""
        if self.sessions is not None:
            await self.sessions.refresh()
        return await asyncio.to_thread(generate_latest, self.registry)

    async def handle(self, request: web.Request) -> web.Response:
        """``GET /metrics``."""
        response = web.Response(body=await self.exposition())
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    def offer_counter(
        self, on_created: Callable[[web.Request, web.StreamResponse], None] | None
    ) -> Middleware:
        """A middleware counting refused offers by code, and calling ``on_created`` on 2xx.

        It must sit inside ``json_errors``: it sees the ``ApiError`` a refusal raises (from
        the handler or from any middleware inside it) and re-raises it for rendering.
        """

        @web.middleware
        async def count_offers(request: web.Request, handler: Handler) -> web.StreamResponse:
            if request.method != "POST" or _route(request) not in SESSION_CREATING_ROUTES:
                return await handler(request)
            try:
                response = await handler(request)
            except ApiError as exc:
                self.rejected.labels(exc.code).inc()
                raise
            except web.HTTPException as exc:
                if exc.status >= 400:
                    self.rejected.labels(f"http_{exc.status}").inc()
                raise
            if on_created is not None and 200 <= response.status < 300:
                on_created(request, response)
            return response

        return count_offers


def _route(request: web.Request) -> str | None:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else None


def created_session_id(response: web.StreamResponse) -> str | None:
    """The id of the session an offer created: WHIP's ``Location``, or the JSON answer's."""
    location = response.headers.get("Location")
    if location:
        return location.rstrip("/").rsplit("/", 1)[-1]
    body = getattr(response, "body", None)
    if not isinstance(body, bytes):
        return None
    with contextlib.suppress(ValueError):
        payload = json.loads(body)
        if isinstance(payload, dict) and isinstance(payload.get("session_id"), str):
            return payload["session_id"]
    return None


def adopt_created(
    manager: SessionManager, collector: SessionCollector
) -> Callable[[web.Request, web.StreamResponse], None]:
    """``on_created`` for a process that owns sessions: count the new one from now on."""

    def on_created(request: web.Request, response: web.StreamResponse) -> None:
        session_id = created_session_id(response)
        if session_id is None:
            return
        with contextlib.suppress(ApiError):  # closed already: reconcile never sees it
            collector.adopt(manager.get(session_id))

    return on_created
