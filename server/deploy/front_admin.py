"""The front's operator routes, answered for the whole server: metrics, sessions, readiness.

Each worker serves ``/metrics`` and ``/sessions`` for its own sessions; the front asks every
live worker over its Unix socket at once and merges the answers (see
``server.ops.metrics_merge``). ``/readyz`` is the front's own judgement: every worker alive,
the server's total below ``--max-sessions``, and not draining.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import Counter
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from server.deploy.workers import Front, Worker
from server.http.admin_routes import readiness
from server.http.observability import METRICS_KEY, add_middlewares, run_metrics
from server.ops import openapi
from server.ops.metrics import ProcessMetrics
from server.ops.metrics_merge import merge_expositions

WORKER_ANSWER_TIMEOUT_S = 2.0


def _credentials(request: web.Request) -> dict[str, str]:
    """The caller's ``Authorization``, passed on: workers check the same admin token."""
    value = request.headers.get("Authorization")
    return {"Authorization": value} if value else {}


class FrontAdminRoutes:
    def __init__(self, front: Front, metrics: ProcessMetrics) -> None:
        self._front = front
        self._metrics = metrics

    def register(self, app: web.Application) -> None:
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/sessions", self.sessions)
        app.router.add_get("/readyz", self.readyz)

    async def _ask(self, worker: Worker, path: str, headers: dict[str, str]) -> Any | None:
        """A worker's answer to ``GET path`` (text or JSON), or None when it gives none."""
        if not worker.alive or worker.http is None:
            return None
        timeout = aiohttp.ClientTimeout(total=WORKER_ANSWER_TIMEOUT_S)
        try:
            async with worker.http.get(
                f"http://worker{path}", headers=headers, timeout=timeout
            ) as response:
                if response.status != 200:
                    return None
                if response.content_type == "application/json":
                    return await response.json()
                return await response.text()
        except (aiohttp.ClientError, TimeoutError):
            return None

    async def _ask_all(self, path: str, request: web.Request) -> list[tuple[Worker, Any]]:
        workers = self._front.workers
        headers = _credentials(request)
        answers = await asyncio.gather(*(self._ask(w, path, headers) for w in workers))
        return list(zip(workers, answers, strict=True))

    async def metrics(self, request: web.Request) -> web.Response:
        answers = await self._ask_all("/metrics", request)
        texts = {str(w.index): a if isinstance(a, str) else None for w, a in answers}
        body = await asyncio.to_thread(merge_expositions, texts, self._metrics.registry)
        response = web.Response(body=body)
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def sessions(self, request: web.Request) -> web.Response:
        answers = await self._ask_all("/sessions", request)
        merged: list[dict[str, Any]] = []
        unreachable: list[int] = []
        for worker, answer in answers:
            if isinstance(answer, dict):
                merged.extend(answer.get("sessions", []))
            else:
                unreachable.append(worker.index)
        return web.json_response({"sessions": merged, "unreachable_workers": unreachable})

    async def readyz(self, request: web.Request) -> web.Response:
        """Ready while at least one worker serves (with the capacity the serving ones give),
        below that capacity and not draining: a worker that died is replaced, and a load
        balancer need not drop the whole node meanwhile."""
        front = self._front
        serving = len(front.serving)
        reasons = []
        if not serving:
            reasons.append("worker_down")
        if front.draining:
            reasons.append("draining")
        if front.load >= front.capacity:
            reasons.append("at_capacity")
        if front.host_down:
            reasons.append("host_down")
        return readiness(
            reasons,
            sessions=front.load,
            max_sessions=front.settings.max_sessions,
            capacity=front.capacity,
            workers_serving=serving,
            workers_configured=front.settings.workers,
            worker_restarts=front.restarts,
            model_host=None
            if front.host is None
            else {
                "pid": front.host.pid,
                "serving": not front.host_down,
                "restarts": front.host_restarts,
            },
        )


def register_front_admin(app: web.Application, front: Front) -> ProcessMetrics:
    """The operator routes on the front, answered for every worker together.

    Only the front's own refusals are counted here (at capacity, rate limited, a worker
    that did not answer); a worker's refusals are counted, and reported, by that worker.
    """
    metrics = ProcessMetrics()
    app[METRICS_KEY] = metrics
    restarts = Counter(
        "cosyrtc_worker_restarts",
        "Worker processes that exited and were replaced.",
        registry=metrics.registry,
    )
    front.on_restart = restarts.inc
    add_middlewares(app, metrics.offer_counter(None))
    FrontAdminRoutes(front, metrics).register(app)
    openapi.register(app)
    run_metrics(app, metrics)
    return metrics
