"""The crossfade at chunk joins, on sinusoids: no swell, no step."""

from __future__ import annotations

import numpy as np

from media.engines.cosyvoice.crossfade import crossfade, fade_in
from media.engines.cosyvoice.vocoder import OVERLAP_SAMPLES

RATE = 24_000


def tone(frequency: float, samples: int, phase: float = 0.0, start: int = 0) -> np.ndarray:
    t = (start + np.arange(samples)) / RATE
    return (0.5 * np.sin(2 * np.pi * frequency * t + phase)).astype(np.float32)


def test_gains_are_complementary_and_monotonic():
    rising = fade_in(OVERLAP_SAMPLES)
    assert np.all(np.diff(rising) > 0)
    assert rising[0] < 1e-4 and rising[-1] > 1 - 1e-4
    assert np.allclose(rising + rising[::-1], 1.0, atol=1e-6)


def test_two_in_phase_renderings_join_into_the_same_sinusoid():
    """The vocoder re-renders the overlap in phase: the join must equal the tone itself.

    Upstream's Hamming halves sum to ~1.08 there, an audible swell at every chunk join.
    """
    overlap = tone(220.0, OVERLAP_SAMPLES)
    joined = crossfade(overlap, overlap.copy())
    assert np.max(np.abs(joined - overlap)) < 1e-6
    hamming = np.hamming(2 * OVERLAP_SAMPLES)
    assert np.max(hamming[:OVERLAP_SAMPLES] + hamming[OVERLAP_SAMPLES:][::-1]) > 1.05


def test_a_join_between_slightly_different_renderings_has_no_step():
    """Chunk A's tail and chunk B's head disagree a little (phase and level): still no click.

    The stream is: A up to the overlap, crossfade(A's tail, B's head), then B. The largest
    sample-to-sample step must stay within that of the tones themselves (plus 5 %).
    """
    before = 2 * OVERLAP_SAMPLES
    a = tone(300.0, before + OVERLAP_SAMPLES)
    b = 0.9 * tone(300.0, OVERLAP_SAMPLES + before, phase=0.3, start=before)
    joined = np.concatenate(
        [a[:before], crossfade(a[before:], b[:OVERLAP_SAMPLES]), b[OVERLAP_SAMPLES:]]
    )
    natural_step = max(np.abs(np.diff(a)).max(), np.abs(np.diff(b)).max())
    assert np.abs(np.diff(joined)).max() <= 1.05 * natural_step
    hard_cut = np.concatenate([a[: before + OVERLAP_SAMPLES // 2], b[OVERLAP_SAMPLES // 2 :]])
    assert np.abs(np.diff(hard_cut)).max() > 1.5 * natural_step
