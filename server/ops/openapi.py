"""``GET /openapi.json``: the hand-written OpenAPI 3.1 description of the HTTP API.

The description is a file (``server/openapi.json``) kept by hand next to the routes, not
generated from them: it says what clients may rely on, including error codes and headers
the code does not declare anywhere. Tests hold the two together both ways (every route is
described, every described operation exists) and check real responses against it.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

OPENAPI_PATH = Path(__file__).resolve().parent / "openapi.json"


def register(app: web.Application) -> None:
    """Serve the description, read once (it is part of the installed code)."""
    body = OPENAPI_PATH.read_bytes()

    async def openapi(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app.router.add_get("/openapi.json", openapi)
