"""Request bodies read whole but never past a route's cap (413 ``payload_too_large``).

One reader for every route that takes a body, because the two obvious ones each fall
short: ``request.read()`` is capped by the application's ``client_max_size`` only (one
value for all routes, where a voice clip needs more than an offer), and
``request.content.read(n)`` returns what has arrived so far, which for a body sent in
several pieces is only the start of it.
"""

from __future__ import annotations

from aiohttp import web

from signaling.errors import ApiError

READ_CHUNK_BYTES = 64 * 1024
# The body once read: a cluster node reads an offer to place it, then the handler reads it.
BODY_KEY = web.RequestKey("body", bytes)


def too_large(limit: int) -> ApiError:
    return ApiError(413, "payload_too_large", f"The body is over the {limit}-byte limit.")


async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole body, refused as soon as it is known to be over ``limit`` bytes.

    An announced ``Content-Length`` over the cap is refused before anything is read; a
    chunked body is refused at its first chunk past the cap.
    """
    cached = request.get(BODY_KEY)
    if cached is not None:
        if len(cached) > limit:
            raise too_large(limit)
        return cached
    if request.content_length is not None and request.content_length > limit:
        raise too_large(limit)
    body = bytearray()
    async for chunk in request.content.iter_chunked(READ_CHUNK_BYTES):
        body += chunk
        if len(body) > limit:
            raise too_large(limit)
    request[BODY_KEY] = bytes(body)
    return request[BODY_KEY]
