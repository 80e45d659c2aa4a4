"""Token buckets: new sessions per client address, and messages per data channel.

A session costs a peer connection, an engine state and ICE work before it is even known to
be wanted, so session creation is the request worth limiting. Each client address has a
bucket of ``per_minute`` tokens (the burst) refilled at ``per_minute / 60`` per second;
an offer with no token left gets 429 and ``Retry-After`` (seconds until the next token).

Memory stays bounded: a bucket left alone long enough to refill is the same as a new one
and is dropped, and past ``MAX_TRACKED_ADDRESSES`` the least recently seen goes first.
IPv6 clients are counted per /64, the block one host usually gets: its 2^64 addresses
would otherwise each get a full bucket (``server.http.clients.client_key``).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Collection

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from server.http.clients import client_key, client_of, placed_by_another_node
from server.sessions.token_bucket import Clock, TokenBucket
from signaling.errors import ApiError

MAX_TRACKED_ADDRESSES = 100_000
SESSION_CREATING_PATHS: frozenset[str] = frozenset({"/offer", "/whip", "/whip/{engine}"})
# Sockets that open a session: the upgrade is a GET.
SESSION_CREATING_SOCKETS: frozenset[str] = frozenset({"/ws"})


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
    """Apply ``limiter`` to ``POST`` on the session-creating routes and to the upgrades of
    session-creating sockets, keyed by client (``server.http.clients``: the peer address,
    or the trusted proxy header's)."""

    @web.middleware
    async def limit(request: web.Request, handler: Handler) -> web.StreamResponse:
        match = request.match_info
        resource = match.route.resource
        if (
            match.http_exception is None
            and resource is not None
            and (
                (request.method == "POST" and resource.canonical in paths)
                or (request.method == "GET" and resource.canonical in SESSION_CREATING_SOCKETS)
            )
            and not await placed_by_another_node(request)
        ):
            limiter.check(client_of(request))
        return await handler(request)

    return limit
