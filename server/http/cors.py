"""Cross-origin access (CORS) to the API, driven by one setting: the allowed origins.

``*`` lets a page on any origin call the API. That stays safe with a token set: a bearer
token is not a cookie, a browser never attaches it by itself, so another site's script can
only use a token it was given. A list of origins answers only those: the request's
``Origin`` is echoed back when listed, and every answer says ``Vary: Origin`` so a cache
never hands one origin's answer to another.

The headers are added in ``on_response_prepare``, so they reach every answer: errors,
files, and event streams that are sent before their handler returns. Preflights
(``OPTIONS``) are answered here for every route that has no ``OPTIONS`` handler of its own;
WHIP's own ``OPTIONS`` handler adds what RFC 9725 asks for (``Accept-Post``, ICE servers).
"""

from __future__ import annotations

from collections.abc import Collection

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from multidict import CIMultiDict

ALLOWED_HEADERS = "Content-Type, Authorization, If-Match"
EXPOSED_HEADERS = "Location, ETag, Link, Accept-Post, Retry-After, WWW-Authenticate"
PREFLIGHT_MAX_AGE_SECONDS = 600
# A route that takes any method (the front forwarding a session's requests) advertises these.
ANY_ROUTE_METHODS = ("GET", "POST", "PATCH", "DELETE")


def preflight_headers(methods: Collection[str]) -> dict[str, str]:
    """What a preflight answer says besides the origin: methods, headers, cache time."""
    listed = ", ".join(sorted({*methods, "OPTIONS"}))
    return {
        "Allow": listed,
        "Access-Control-Allow-Methods": listed,
        "Access-Control-Allow-Headers": ALLOWED_HEADERS,
        "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_SECONDS),
    }


def _add_vary(headers: CIMultiDict[str], name: str) -> None:
    present = {
        part.strip().lower() for value in headers.getall("Vary", ()) for part in value.split(",")
    }
    if name.lower() not in present:
        headers.add("Vary", name)


class CorsPolicy:
    """Which origins may read the API's answers."""

    def __init__(self, origins: Collection[str]) -> None:
        self._any = "*" in origins
        self._origins = frozenset(origins)

    def allowed_origin(self, origin: str | None) -> str | None:
        """The ``Access-Control-Allow-Origin`` value for a request from ``origin``, if any."""
        if self._any:
            return "*"
        return origin if origin in self._origins else None

    async def on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """Set (not add) the headers: a forwarded answer may carry a worker's copy already."""
        allowed = self.allowed_origin(request.headers.get("Origin"))
        if not self._any:
            _add_vary(response.headers, "Origin")
        if allowed is None:
            response.headers.popall("Access-Control-Allow-Origin", None)
            response.headers.popall("Access-Control-Expose-Headers", None)
            return
        response.headers["Access-Control-Allow-Origin"] = allowed
        response.headers["Access-Control-Expose-Headers"] = EXPOSED_HEADERS

    def install(self, app: web.Application) -> None:
        app.on_response_prepare.append(self.on_prepare)


def preflight_middleware() -> Middleware:
    """Answer ``OPTIONS`` on routes that do not handle it themselves, without credentials."""

    @web.middleware
    async def preflight(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method != "OPTIONS":
            return await handler(request)
        match = request.match_info
        refused = match.http_exception
        if isinstance(refused, web.HTTPMethodNotAllowed):
            return web.Response(status=204, headers=preflight_headers(refused.allowed_methods))
        if refused is None and match.route.method == "*":
            return web.Response(status=204, headers=preflight_headers(ANY_ROUTE_METHODS))
        return await handler(request)  # a route's own OPTIONS handler, or a 404

    return preflight
