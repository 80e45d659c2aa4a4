"""What an operator sees, wired into an app: metrics, session list, readiness, API description.

``register`` serves a process that owns sessions (a single server, or a worker behind a
front); ``server.deploy.front_admin`` serves the front, which answers for all its workers,
with the helpers here. Both add
the offer-counting middleware just inside ``json_errors`` (so it sees every refusal, the
token and rate-limit guards' included, as the ``ApiError`` it is) and tag log lines with
the session a request concerns.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Middleware

from server.config import Settings
from server.http.admin_routes import AdminRoutes
from server.http.errors import json_errors
from server.ops import openapi
from server.ops.logs import session_context
from server.ops.metrics import ProcessMetrics, adopt_created
from server.sessions.manager import SessionManager

METRICS_KEY: web.AppKey[ProcessMetrics] = web.AppKey("metrics", ProcessMetrics)


def add_middlewares(app: web.Application, counter: Middleware) -> None:
    app.middlewares.insert(app.middlewares.index(json_errors) + 1, counter)
    app.middlewares.insert(0, session_context)


def run_metrics(app: web.Application, metrics: ProcessMetrics) -> None:
    async def start(app: web.Application) -> None:
        metrics.start()

    async def stop(app: web.Application) -> None:
        await metrics.stop()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)


def register(app: web.Application, manager: SessionManager, settings: Settings) -> ProcessMetrics:
    """``/metrics``, ``/sessions``, ``/readyz`` and ``/openapi.json`` for this process."""
    metrics = ProcessMetrics(manager)
    assert metrics.sessions is not None
    app[METRICS_KEY] = metrics
    add_middlewares(app, metrics.offer_counter(adopt_created(manager, metrics.sessions)))
    app.router.add_get("/metrics", metrics.handle)
    AdminRoutes(manager, settings).register(app)
    openapi.register(app)
    run_metrics(app, metrics)
    return metrics
