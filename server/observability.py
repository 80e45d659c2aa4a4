"""What an operator sees, wired into an app: metrics, session list, readiness, API description.

``register`` serves a process that owns sessions (a single server, or a worker behind a
front); ``register_front`` serves the front, which answers for all its workers. Both add
the offer-counting middleware just inside ``json_errors`` (so it sees every refusal, the
token and rate-limit guards' included, as the ``ApiError`` it is) and tag log lines with
the session a request concerns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.typedefs import Middleware

from server import openapi
from server.admin_routes import AdminRoutes
from server.config import Settings
from server.front_admin import FrontAdminRoutes
from server.logs import session_context
from server.metrics import ProcessMetrics, adopt_created
from server.sessions import SessionManager
from signaling.errors import json_errors

if TYPE_CHECKING:
    from server.front import Front

METRICS_KEY: web.AppKey[ProcessMetrics] = web.AppKey("metrics", ProcessMetrics)


def _add_middlewares(app: web.Application, counter: Middleware) -> None:
    app.middlewares.insert(app.middlewares.index(json_errors) + 1, counter)
    app.middlewares.insert(0, session_context)


def _run_metrics(app: web.Application, metrics: ProcessMetrics) -> None:
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
    _add_middlewares(app, metrics.offer_counter(adopt_created(manager, metrics.sessions)))
    app.router.add_get("/metrics", metrics.handle)
    AdminRoutes(manager, settings).register(app)
    openapi.register(app)
    _run_metrics(app, metrics)
    return metrics


def register_front(app: web.Application, front: Front) -> ProcessMetrics:
    """The same routes on the front, answered for every worker together.

    Only the front's own refusals are counted here (at capacity, rate limited, a worker
    that did not answer); a worker's refusals are counted, and reported, by that worker.
    """
    metrics = ProcessMetrics()
    app[METRICS_KEY] = metrics
    _add_middlewares(app, metrics.offer_counter(None))
    FrontAdminRoutes(front, metrics).register(app)
    openapi.register(app)
    _run_metrics(app, metrics)
    return metrics
