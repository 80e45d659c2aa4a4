"""Passing an HTTP request on to another process and its answer back, event streams included.

The front relays to its workers over their Unix sockets; a cluster node relays to the node
that owns (or is chosen for) a session. Hop-by-hop headers stay behind; the caller adds
what the next hop must know (who asked, the reservation it was placed with).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import aiohttp
from aiohttp import web

from signaling.errors import ApiError

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "upgrade", "host", "content-length"}
)


def passed_headers(request: web.Request, dropped: frozenset[str] = frozenset()) -> dict[str, str]:
    """The request's end-to-end headers, without ``dropped`` (lower-case names)."""
    return {
        k: v
        for k, v in request.headers.items()
        if k.lower() not in HOP_BY_HOP and k.lower() not in dropped
    }


async def relay(
    request: web.Request,
    http: aiohttp.ClientSession,
    url: str,
    body: bytes | None,
    headers: Mapping[str, str],
    unavailable: ApiError,
) -> web.StreamResponse:
    """Send the request to ``url`` and answer with what comes back; ``unavailable`` when the
    other side does not answer at all."""
    try:
        upstream = await http.request(request.method, url, headers=dict(headers), data=body)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise unavailable from exc
    async with upstream:
        reply_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
        if upstream.content_type == "text/event-stream":
            response = web.StreamResponse(status=upstream.status, headers=reply_headers)
            await response.prepare(request)
            with contextlib.suppress(ConnectionResetError, aiohttp.ClientPayloadError):
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
            return response
        return web.Response(
            status=upstream.status, body=await upstream.read(), headers=reply_headers
        )
