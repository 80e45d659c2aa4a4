"""The HTTP guards both entry points install (a single-process server, and the front).

In order, after ``json_errors`` (so every refusal is a JSON error): preflights answered
without credentials, the token check, then the per-address limit on new sessions (only
requests with a good token spend it). The CORS headers go on every answer.
"""

from __future__ import annotations

from collections.abc import Collection

from aiohttp import web

from server.config import Settings
from server.http.auth import PUBLIC_PATHS, auth_middleware
from server.http.clients import client_middleware
from server.http.cors import CorsPolicy, preflight_middleware
from server.http.ratelimit import AddressLimiter, session_rate_middleware


def protect(app: web.Application, settings: Settings, page_paths: Collection[str]) -> None:
    """Add the guards to ``app``, whose ``page_paths`` (the page's files) stay public."""
    app.middlewares.append(client_middleware(settings.client_address_header))
    app.middlewares.append(preflight_middleware())
    public = PUBLIC_PATHS | frozenset(page_paths)
    app.middlewares.append(auth_middleware(settings.auth_token, settings.admin_token, public))
    if settings.rate_limit > 0:
        limiter = AddressLimiter(settings.rate_limit)
        app.middlewares.append(session_rate_middleware(limiter))
    CorsPolicy(settings.cors_origins).install(app)
