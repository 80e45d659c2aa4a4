"""In-to-out latency of a transform: from a sample's arrival to its departure, per frame.

An engine returns as many samples as it is given (its algorithmic delay is inside the
signal, reported separately as the engine's ``delay_ms``), so output sample ``q`` is input
sample ``q`` plus whatever input was dropped before reaching the engine. Each departing
frame is matched with the arrival time of the packet that brought its last sample.

A drop shifts only the frames after it: the queue drops its oldest chunk, which is later
than everything the engine had already taken, so audio already past the queue keeps its
position. Counting every drop against every later departure would match a frame sitting in
the output buffer with a later packet, and under overload report less than the real delay.
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
        self._drops: deque[tuple[int, int]] = deque()  # (input taken by then, samples)
        self.recent: deque[float] = deque(maxlen=RECENT_FRAMES)

    def arrived(self, samples: int, at: float) -> None:
        self._received += samples
        self._arrivals.append((self._received, at))

    def dropped(self, samples: int, taken: int) -> None:
        """Input that will never come out (dropped before the engine), shifting positions.

        ``taken`` is how much input the engine had taken when it was dropped: the positions
        from there on shift, those before do not.
        """
        self._drops.append((taken, samples))

    def departed(self, end_position: int, at: float) -> float | None:
        """A frame whose last output sample is ``end_position - 1`` left at ``at``."""
        while self._drops and self._drops[0][0] < end_position:
            self._dropped += self._drops.popleft()[1]
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
