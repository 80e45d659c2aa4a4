"""Every error an app raises, rendered as the API's JSON error shape.

Handlers raise :class:`~signaling.errors.ApiError`; the middleware turns it (and aiohttp's
own HTTP errors, such as 404 for an unknown route or 413 for an oversized body) into
``{"error": code, "message": sentence}``.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler

from signaling.errors import ApiError

_CODES_FOR_STATUS = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


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
