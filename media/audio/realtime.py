"""A sender's allowance of media: real time, plus a bounded burst.

Whatever carries a caller's audio (RTP, a WebSocket) must not let the caller deliver more
than real time: media beyond it costs decode and engine time that other sessions need, and
grows this session's latency.
"""

from __future__ import annotations


class RealTimeBudget:
    """How much media a sender may still deliver: real time, plus a burst allowance.

    A caller cannot buy more than real time: media beyond it would cost decode and engine
    time that other sessions need, and grow this session's latency. The budget fills at
    one second per second up to ``allowance_s``; each packet spends its duration.
    """

    def __init__(self, allowance_s: float, now: float) -> None:
        self._allowance = allowance_s
        self._available = allowance_s
        self._updated = now

    def spend(self, seconds: float, now: float) -> bool:
        elapsed = max(0.0, now - self._updated)
        self._available = min(self._allowance, self._available + elapsed)
        self._updated = now
        if self._available < seconds:
            return False
        self._available -= seconds
        return True
