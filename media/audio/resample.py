"""A streaming resampler kept for the life of a stream.

Re-creating a resampler per chunk resets its filter history and puts a click at every join;
one ``soxr.ResampleStream`` per direction per session keeps the signal continuous. Between
equal rates it is a pass-through, so echo and 48 kHz engines pay nothing.
"""

from __future__ import annotations

import numpy as np
import soxr

# "HQ" keeps speech transparent with a group delay of a few milliseconds; the very-high
# settings add delay for differences nobody hears on a voice call.
QUALITY = "HQ"


class StreamResampler:
    """Float32 mono from ``in_rate`` to ``out_rate``, continuous across chunks."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._stream = (
            None
            if in_rate == out_rate
            else soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality=QUALITY)
        )

    @property
    def passthrough(self) -> bool:
        return self._stream is None

    def process(self, chunk: np.ndarray, last: bool = False) -> np.ndarray:
        """Resample the next chunk; ``last=True`` drains the filter at the end of a stream."""
        if self._stream is None:
            return chunk
        return self._stream.resample_chunk(chunk, last=last)

    def reset(self) -> None:
        """Forget the history (after an engine reset the old tail no longer belongs)."""
        if self._stream is not None:
            self._stream.clear()
