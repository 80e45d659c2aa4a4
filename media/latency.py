"""In-to-out latency of a transform: from a sample's arrival to its departure, per frame.

An engine returns as many samples as it is given (its algorithmic delay is inside the
signal, reported separately as the engine's ``delay_ms``), so output sample ``q`` is input
sample ``q`` plus whatever input was dropped before reaching the engine. Each departing
frame is matched with the arrival time of the packet that brought its last sample.
"""

from __future__ import annotations

from collections import deque

import numpy as np

RECENT_FRAMES = 50  # one second of 20 ms frames


class InToOutMeter:
    """Stream positions in and out, and the recent latencies they imply."""

    def __init__(self) -> None:
        self._arrivals: deque[tuple[int, float]] = deque()  # (end position, time)
        self._received = 0
        self._dropped = 0
        self.recent: deque[float] = deque(maxlen=RECENT_FRAMES)

    def arrived(self, samples: int, at: float) -> None:
        self._received += samples
        self._arrivals.append((self._received, at))

    def dropped(self, samples: int) -> None:
        """Input that will never come out (dropped before the engine), shifting positions."""
        self._dropped += samples

    def departed(self, end_position: int, at: float) -> float | None:
        """A frame whose last output sample is ``end_position - 1`` left at ``at``."""
        wanted = end_position + self._dropped
        while self._arrivals and self._arrivals[0][0] < wanted:
            self._arrivals.popleft()
        if not self._arrivals:
            return None
        latency = at - self._arrivals[0][1]
        self.recent.append(latency)
        return latency

    def summary_ms(self) -> dict[str, float | None]:
        if not self.recent:
            return {"in_to_out_ms": None, "in_to_out_ms_p95": None}
        values = np.asarray(self.recent) * 1000
        return {
            "in_to_out_ms": round(float(np.median(values)), 2),
            "in_to_out_ms_p95": round(float(np.percentile(values, 95)), 2),
        }
