"""Bearer-token access control for the HTTP API (RFC 6750 ``Authorization: Bearer``).

Routes fall in three classes, decided by the route that matched (its canonical path, such
as ``/sessions/{session_id}/events``), never by the raw request path, so a request cannot
reach a protected handler under a path spelled to look public:

- public (``PUBLIC_PATHS`` and the page's files): never ask for a token;
- admin (``ADMIN_PATHS``): need the admin token when one is set, else the normal token;
- everything else: needs the normal token (or the admin token) when one is set.

A CORS preflight (``OPTIONS``) is public too: browsers send it without credentials. It
answers only what any visitor may know; routes that put secrets in an ``OPTIONS`` answer
(WHIP's ICE servers with TURN passwords) check :func:`is_authorized` first.

The token is read from the ``Authorization`` header (or, on a WebSocket upgrade, a
subprotocol entry: see :func:`bearer_token`), never from an ``access_token`` query
parameter (RFC 6750 §2.3): a URL ends up in access logs (aiohttp logs the request
line), proxy logs and browser history. The page needs no such parameter: it receives its
session's events over the data channel, and a browser client of ``GET
/sessions/{id}/events`` can read the stream with ``fetch()``, which sends headers, instead
of ``EventSource``, which cannot. Tokens are compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
from collections.abc import Collection

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from signaling.errors import ApiError

PUBLIC_PATHS: frozenset[str] = frozenset(
    # Twilio's requests carry its signature, not a bearer token: those routes check it.
    {"/", "/healthz", "/readyz", "/openapi.json", "/twilio/voice", "/twilio/media"}
)
ADMIN_PATHS: frozenset[str] = frozenset({"/sessions", "/metrics", "/cluster", "/admin/drain"})
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="cosyrtc"'}
SUBPROTOCOL_TOKEN_PREFIX = "cosyrtc.bearer."
AUTHORIZED: web.RequestKey[bool] = web.RequestKey("authorized", bool)


def _secret(value: str) -> bytes:
    # Header values arrive decoded with surrogateescape; this gets the bytes back exactly.
    return value.encode("utf-8", "surrogateescape")


def bearer_token(request: web.Request) -> str | None:
    """The token of a well-formed ``Bearer`` header, ``None`` when absent or malformed.

    A WebSocket upgrade without the header may carry the token as a subprotocol entry,
    ``cosyrtc.bearer.<token>`` beside ``cosyrtc``: browsers cannot set headers on a
    WebSocket, and a header (unlike a URL) stays out of access logs. The server answers
    with ``cosyrtc`` alone, so the token is never echoed.
    """
    header = request.headers.get("Authorization")
    if header is None:
        return _subprotocol_token(request)
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        return None
    return token


def _subprotocol_token(request: web.Request) -> str | None:
    if request.headers.get("Upgrade", "").lower() != "websocket":
        return None
    offered = request.headers.get("Sec-WebSocket-Protocol", "")
    for entry in offered.split(","):
        name = entry.strip()
        if name.startswith(SUBPROTOCOL_TOKEN_PREFIX) and len(name) > len(SUBPROTOCOL_TOKEN_PREFIX):
            return name[len(SUBPROTOCOL_TOKEN_PREFIX) :]
    return None


def is_authorized(request: web.Request) -> bool:
    """Whether this request carried a token good for the normal routes (or needs none)."""
    return request.get(AUTHORIZED, False)


class TokenCheck:
    """Which tokens open which route class; ``None`` for a token means that class is open."""

    def __init__(self, auth_token: str | None, admin_token: str | None) -> None:
        self._user = _secret(auth_token) if auth_token else None
        self._admin = _secret(admin_token) if admin_token else None

    def _accepted(self, admin: bool) -> list[bytes]:
        """The tokens a route class accepts; empty when it is open."""
        if admin and self._admin is not None:
            return [self._admin]
        if self._user is None:
            return []
        return [self._user] if self._admin is None else [self._user, self._admin]

    def grants(self, token: str | None, admin: bool) -> bool:
        accepted = self._accepted(admin)
        if not accepted:
            return True
        if token is None:
            return False
        presented = _secret(token)
        # Every candidate is compared, so timing does not tell which one was close.
        matches = [hmac.compare_digest(presented, candidate) for candidate in accepted]
        return any(matches)

    def require(self, request: web.Request, admin: bool) -> None:
        """Raise 401 (no usable token) or 403 (a token this route class does not accept)."""
        token = bearer_token(request)
        if self.grants(token, admin):
            return
        if token is None:
            raise ApiError(
                401,
                "unauthorized",
                "Send 'Authorization: Bearer <token>' with this request.",
                headers=CHALLENGE,
            )
        needed = "the admin token" if admin and self._admin is not None else "a valid token"
        raise ApiError(403, "forbidden", f"This route needs {needed}.")


def auth_middleware(
    auth_token: str | None,
    admin_token: str | None,
    public_paths: Collection[str] = PUBLIC_PATHS,
    admin_paths: Collection[str] = ADMIN_PATHS,
) -> Middleware:
    """Refuse requests without the token their route class needs (see the module docstring).

    ``public_paths`` and ``admin_paths`` are canonical route paths. A request that matches
    no route goes on to its 404 or 405: there is nothing behind it to protect.
    """
    check = TokenCheck(auth_token, admin_token)

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        request[AUTHORIZED] = check.grants(bearer_token(request), admin=False)
        match = request.match_info
        if match.http_exception is None and request.method != "OPTIONS":
            path = match.route.resource.canonical if match.route.resource else request.path
            if path not in public_paths:
                check.require(request, admin=path in admin_paths)
        return await handler(request)

    return authenticate
