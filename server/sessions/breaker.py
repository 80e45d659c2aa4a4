"""Circuit breakers: an engine that keeps failing stops taking new sessions for a while.

A session whose engine throws is repaired in place (its state is reset), so one bad call
costs that session a short silence. But an engine failing again and again (a corrupt model
file, an exhausted native heap) would make every new session a broken call, so after
``failures`` failures within ``window`` seconds the breaker opens: new sessions for that
engine are refused with a clear 503 until ``cooldown`` has passed. Then it lets sessions
in again ("half-open"); one more failure within the window opens it at once.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

FAILURE_WINDOW_SECONDS = 60.0


class CircuitBreaker:
    """Counts one engine's failures and says whether it may take new sessions."""

    def __init__(
        self,
        failures: int,
        cooldown: float,
        window: float = FAILURE_WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._threshold = failures
        self._cooldown = cooldown
        self._window = window
        self._clock = clock
        self._failures: deque[float] = deque()
        self._open_until = 0.0
        self.times_opened = 0

    def record_failure(self) -> None:
        if self._threshold == 0:
            return  # breaking disabled
        now = self._clock()
        self._failures.append(now)
        while self._failures and self._failures[0] < now - self._window:
            self._failures.popleft()
        if len(self._failures) >= self._threshold and not self.is_open:
            self._open_until = now + self._cooldown
            self.times_opened += 1
            # Half-open afterwards: keep the last failure, so one more re-opens it.
            while len(self._failures) > self._threshold - 1:
                self._failures.popleft()

    @property
    def is_open(self) -> bool:
        return self._clock() < self._open_until

    @property
    def retry_after(self) -> float:
        """Seconds until the breaker lets sessions in again (0 when closed)."""
        return max(0.0, self._open_until - self._clock())


class Breakers:
    """One breaker per engine name, made on first use."""

    def __init__(self, failures: int, cooldown: float) -> None:
        self._failures = failures
        self._cooldown = cooldown
        self._by_engine: dict[str, CircuitBreaker] = {}

    def __getitem__(self, engine: str) -> CircuitBreaker:
        breaker = self._by_engine.get(engine)
        if breaker is None:
            breaker = self._by_engine[engine] = CircuitBreaker(self._failures, self._cooldown)
        return breaker
