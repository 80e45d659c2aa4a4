"""Caps on what one session's data channel may send: the size and the rate of messages.

Checked before a message is parsed, so an oversized one costs no JSON work, and a client
sending in a loop cannot keep the event loop busy with one session's control traffic.
A message over the rate is dropped. The first one dropped in a burst is answered with a
``rate_limited`` error; the rest of the burst are dropped without an answer, so a flood
does not make the server flood back. The session itself goes on either way.
"""

from __future__ import annotations

import time

from server.sessions.control import ControlError
from server.sessions.token_bucket import Clock, TokenBucket


class ChannelLimits:
    """``max_bytes`` per message and ``per_second`` messages (with a one-second burst)."""

    def __init__(self, max_bytes: int, per_second: int, clock: Clock = time.monotonic) -> None:
        self.max_bytes = max_bytes
        self.per_second = per_second
        self._bucket = TokenBucket(per_second, per_second, clock)
        self._throttled = False
        self.dropped = 0

    def admit(self, raw: str | bytes) -> bool:
        """True to handle ``raw``, False to drop it quietly; ControlError to refuse it aloud."""
        if not self._bucket.take():
            self.dropped += 1
            if self._throttled:
                return False
            self._throttled = True
            raise ControlError(
                "rate_limited",
                f"More than {self.per_second} messages a second; this one was dropped, "
                "and so are the next until the rate falls.",
            )
        self._throttled = False
        size = len(raw) if isinstance(raw, bytes) else len(raw.encode("utf-8", "surrogatepass"))
        if size > self.max_bytes:
            raise ControlError(
                "message_too_large", f"Messages are limited to {self.max_bytes} bytes."
            )
        return True
