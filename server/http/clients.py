"""Who a request comes from: the key every per-client limit counts by.

The key is the connection's peer address, IPv4 as is and IPv6 by its /64 (one host usually
gets the whole block). Behind a reverse proxy every request comes from the proxy, so
``--client-address-header`` names the header the proxy writes the client's address into
(``X-Forwarded-For``, ``X-Real-IP``): its last entry is used, the one the nearest proxy
appended; what a client wrote itself sits before it. Off by default: a header the server
does not know a proxy writes would let any client claim any address.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

IPV6_CLIENT_PREFIX = 64
CLIENT_KEY = web.RequestKey("client", str)
# In a cluster, an offer another node placed here arrives from that node, not the client:
# this check (set by ``server.deploy.cluster_routes``) recognises one by its reservation and
# puts the client it was placed for under CLIENT_KEY; the limits then leave it to the node
# that received it from the client.
PlacedCheck = Callable[[web.Request], Awaitable[bool]]
PLACED_CHECK: web.AppKey[PlacedCheck] = web.AppKey("placed_check")


def client_key(address: str | None) -> str:
    """The address a limit is kept for: IPv4 as is, IPv6 by its /64 block."""
    if not address:
        return ""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address  # already a key (an IPv6 block), or not an address at all
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, IPV6_CLIENT_PREFIX), strict=False))
    return str(ip)


def client_address(request: web.BaseRequest, header: str | None) -> str | None:
    """The caller's address: ``header``'s last entry when it holds one, else the peer's."""
    if header:
        value = request.headers.get(header, "")
        last = value.rsplit(",", 1)[-1].strip()
        try:
            return str(ipaddress.ip_address(last))
        except ValueError:
            pass
    return request.remote


def client_middleware(header: str | None) -> Middleware:
    """Set every request's client key (``request[CLIENT_KEY]``) for the limits after it."""

    @web.middleware
    async def identify(request: web.Request, handler: Handler) -> web.StreamResponse:
        request[CLIENT_KEY] = client_key(client_address(request, header))
        return await handler(request)

    return identify


async def placed_by_another_node(request: web.Request) -> bool:
    check = request.app.get(PLACED_CHECK)
    return check is not None and await check(request)


def client_of(request: web.Request) -> str:
    """The key ``client_middleware`` set (the peer address when it did not run)."""
    return request.get(CLIENT_KEY) or client_key(request.remote)
