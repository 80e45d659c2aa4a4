"""Joining two renderings of the same audio: a crossfade whose gains always sum to one.

At each chunk join the vocoder renders the last few frames twice: once at the end of the
previous chunk (without right context) and once at the start of the next (with it, and with
the same excitation signal, so both renderings are in phase). Fading one into the other over
the overlap hides the difference.

Upstream fades with the two halves of a Hamming window. Those halves sum to ~1.08 across the
overlap, not 1 (a Hamming window does not reach zero at its ends), so every join of in-phase
audio gets an 8 % swell. The halves of a Hann window sum to exactly one.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np


@lru_cache(maxsize=8)
def fade_in(length: int) -> np.ndarray:
    """Gains rising from 0 towards 1 over ``length`` samples; ``1 - fade_in`` falls."""
    position = (np.arange(length, dtype=np.float64) + 0.5) / length
    gains = 0.5 - 0.5 * np.cos(np.pi * position)
    gains.setflags(write=False)
    return gains.astype(np.float32)


def crossfade(previous_tail: np.ndarray, next_head: np.ndarray) -> np.ndarray:
    """Blend the end of the previous chunk into the start of the next, sample for sample."""
    if previous_tail.shape != next_head.shape:
        raise ValueError(f"overlaps differ: {previous_tail.shape} and {next_head.shape}")
    rising = fade_in(len(next_head))
    return previous_tail * (1.0 - rising) + next_head * rising
