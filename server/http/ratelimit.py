"""Token buckets: new sessions per client address, and messages per data channel.

A session costs a peer connection, an engine state and ICE work before it is even known to
be wanted, so session creation is the request worth limiting. Each client address has a
bucket of ``per_minute`` tokens (the burst) refilled at ``per_minute / 60`` per second;
an offer with no token left gets 429 and ``Retry-After`` (seconds until the next token).

Memory stays bounded: a bucket left alone long enough to refill is the same as a new one
and is dropped, and past ``MAX_TRACKED_ADDRESSES`` the least recently seen goes first.
IPv6 clients are counted per /64, the block one host usually gets: its 2^64 addresses
would otherwise each get a full bucket.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Collection

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from server.sessions.token_bucket import Clock, TokenBucket
from signaling.errors import ApiError

MAX_TRACKED_ADDRESSES = 100_000
IPV6_CLIENT_PREFIX = 64
SESSION_CREATING_PATHS: frozenset[str] = frozenset({"/offer", "/whip", "/whip/{engine}"})


def client_key(address: str | None) -> str:
    """The address a bucket is kept for: IPv4 as is, IPv6 by its /64 block."""
    if not address:
        return ""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, IPV6_CLIENT_PREFIX), strict=False))
    return str(ip)


class AddressLimiter:
    """One bucket per client address, the idle ones forgotten (see the module docstring)."""

    def __init__(
        self,
        per_minute: int,
        clock: Clock = time.monotonic,
        max_addresses: int = MAX_TRACKED_ADDRESSES,
    ) -> None:
        self._capacity = float(per_minute)
        self._rate = per_minute / 60.0
        self._refill_seconds = 60.0
        self._clock = clock
        self._max = max_addresses
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def _evict(self) -> None:
        idle_since = self._clock() - self._refill_seconds
        while self._buckets:
            oldest = next(iter(self._buckets.values()))
            if oldest.last_used > idle_since and len(self._buckets) < self._max:
                break
            self._buckets.popitem(last=False)

    def check(self, address: str | None) -> None:
        """Spend one of ``address``'s tokens, or raise 429 ``rate_limited``."""
        self._evict()
        key = client_key(address)
        bucket = self._buckets.pop(key, None)
        if bucket is None:
            bucket = TokenBucket(self._capacity, self._rate, self._clock)
        self._buckets[key] = bucket  # most recently seen last
        if bucket.take():
            return
        wait = max(1, math.ceil(bucket.seconds_until_token()))
        raise ApiError(
            429,
            "rate_limited",
            f"Too many new sessions from your address; retry in {wait} s.",
            headers={"Retry-After": str(wait)},
        )


def session_rate_middleware(
    limiter: AddressLimiter, paths: Collection[str] = SESSION_CREATING_PATHS
) -> Middleware:
    """Apply ``limiter`` to ``POST`` on the session-creating routes, keyed by peer address.

    The address is the connection's: behind a reverse proxy every client shares the
    proxy's, so there the proxy is the place to limit.
    """

    @web.middleware
    async def limit(request: web.Request, handler: Handler) -> web.StreamResponse:
        match = request.match_info
        resource = match.route.resource
        if (
            request.method == "POST"
            and match.http_exception is None
            and resource is not None
            and resource.canonical in paths
        ):
            limiter.check(request.remote)
        return await handler(request)

    return limit
