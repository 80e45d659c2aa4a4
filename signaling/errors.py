"""HTTP errors as JSON: ``{"error": code, "message": sentence}`` with the right status.

Handlers raise :class:`ApiError`; the middleware turns it (and aiohttp's own HTTP errors,
such as 404 for an unknown route or 413 for an oversized body) into that shape, so a client
always gets a code it can branch on and a sentence a person can read.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_CODES_FOR_STATUS = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


class ApiError(Exception):
    """An error response with a stable machine-readable ``code``."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})

    def response(self) -> web.Response:
        return web.json_response(
            {"error": self.code, "message": self.message},
            status=self.status,
            headers=self.headers,
        )


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Render every error the app raises as the JSON error shape."""
    try:
        return await handler(request)
    except ApiError as exc:
        return exc.response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = _CODES_FOR_STATUS.get(exc.status, "http_error")
        message = exc.text if exc.text and not exc.text.startswith(str(exc.status)) else exc.reason
        headers = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")}
        return ApiError(exc.status, code, message, headers).response()
