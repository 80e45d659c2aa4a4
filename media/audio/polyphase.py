"""A low-latency streaming resampler for rates in integer ratio (48 kHz to 8, 16 or 24 kHz).

``soxr``'s streaming resampler works in internal blocks: fed 20 ms at a time, 48 -> 8 kHz
returns nothing for seven calls and then 140 ms at once (16 kHz: 40 ms steps), which on a
phone call is 140 ms of delay each way. Telephone and speech-backend rates are integer
divisors of 48 kHz, where a polyphase FIR filter needs no blocks: every 20 ms in gives
exactly 20 ms out, for a delay of half the filter (~1.5 ms here).

The filter is a Kaiser-windowed sinc, cut a little below the lower rate's Nyquist
frequency, about 70 dB down in its stop band. Each call computes only the output samples
it keeps (one matrix product per polyphase branch over a window of the input history).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from media.audio.resample import StreamResampler

TAPS_PER_PHASE = 48  # filter length per branch: sharpness against cost
KAISER_BETA = 7.0  # ~70 dB stop band
PASSBAND = 0.9  # cutoff, as a share of the lower rate's Nyquist frequency


def is_integer_ratio(in_rate: int, out_rate: int) -> bool:
    high, low = max(in_rate, out_rate), min(in_rate, out_rate)
    return in_rate != out_rate and high % low == 0


def lowpass(factor: int) -> np.ndarray:
    """The anti-alias (and anti-image) filter for a ``factor`` change at the higher rate."""
    taps = TAPS_PER_PHASE * factor
    cutoff = PASSBAND / (2 * factor)  # cycles per sample at the higher rate
    n = np.arange(taps) - (taps - 1) / 2
    h = 2 * cutoff * np.sinc(2 * cutoff * n) * np.kaiser(taps, KAISER_BETA)
    return (h / h.sum()).astype(np.float32)


class PolyphaseResampler:
    """Float32 mono from ``in_rate`` to ``out_rate`` (one a multiple of the other), chunk
    by chunk with no block delay; chunks of any length (a multiple of the ratio when
    decimating keeps every output on the same grid, and any length works)."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        if not is_integer_ratio(in_rate, out_rate):
            raise ValueError(f"{in_rate} -> {out_rate} Hz is not an integer ratio")
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._up = max(1, out_rate // in_rate)
        self._down = max(1, in_rate // out_rate)
        factor = max(self._up, self._down)
        h = lowpass(factor)
        if self._up > 1:
            # Branch p makes output samples p, p + up, ...: taps p, p + up, ... of the
            # filter, reversed to run over the input history oldest first.
            self._branches = [(self._up * h[p :: self._up])[::-1].copy() for p in range(self._up)]
            self._history = np.zeros(TAPS_PER_PHASE - 1, np.float32)
        else:
            self._kernel = h[::-1].copy()
            self._history = np.zeros(len(h) - 1, np.float32)
            self._phase = 0  # where in the next chunk the next kept output falls

    def process(self, chunk: np.ndarray) -> np.ndarray:
        chunk = np.asarray(chunk, np.float32)
        if not len(chunk):
            return chunk
        signal = np.concatenate([self._history, chunk])
        self._history = signal[len(signal) - len(self._history) :]
        if self._up > 1:
            windows = sliding_window_view(signal, TAPS_PER_PHASE)
            out = np.empty(len(chunk) * self._up, np.float32)
            for p, branch in enumerate(self._branches):
                out[p :: self._up] = windows @ branch
            return out
        windows = sliding_window_view(signal, len(self._kernel))[self._phase :: self._down]
        self._phase = (self._phase - len(chunk)) % self._down
        return (windows @ self._kernel).astype(np.float32, copy=False)

    def reset(self) -> None:
        self._history[:] = 0
        if self._up == 1:
            self._phase = 0


class Resampler(Protocol):
    def process(self, chunk: np.ndarray) -> np.ndarray: ...


def streaming_resampler(in_rate: int, out_rate: int) -> Resampler:
    """The lowest-delay streaming resampler for the pair: polyphase for integer ratios."""
    if is_integer_ratio(in_rate, out_rate):
        return PolyphaseResampler(in_rate, out_rate)
    return StreamResampler(in_rate, out_rate)
