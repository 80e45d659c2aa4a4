"""A token bucket: a burst of ``capacity`` then ``rate`` per second, for every limit here.

New sessions per client address (``server.http.ratelimit``) and messages per data channel
(``server.sessions.channel_limits``) both spend tokens from one.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], float]


class TokenBucket:
    """``capacity`` tokens, refilled at ``rate`` per second; ``take()`` spends one."""

    def __init__(self, capacity: float, rate: float, clock: Clock = time.monotonic) -> None:
        self.capacity = capacity
        self.rate = rate
        self._clock = clock
        self._tokens = capacity
        self._updated = clock()

    def _refill(self) -> float:
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._updated) * self.rate)
        self._updated = now
        return now

    def take(self) -> bool:
        self._refill()
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def seconds_until_token(self) -> float:
        self._refill()
        return max(0.0, (1 - self._tokens) / self.rate)

    @property
    def last_used(self) -> float:
        return self._updated
