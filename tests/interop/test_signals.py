"""The interop tone check itself: it finds the tone that was sent, and only that tone."""

from __future__ import annotations

import numpy as np

from tests.interop.conftest import TONE_SECONDS
from tests.interop.signals import RATE, best_alignment, stepped_tone, tone_match


def test_stepped_tone_is_found_only_where_it_was_sent() -> None:
    """The check cannot pass on energy or notes alone: a steady tone, or the same notes
    in another order, score far below the bar."""
    sent = stepped_tone(TONE_SECONDS)
    correlation, offset = best_alignment(sent, sent[RATE * 3 : RATE * 4])
    assert correlation > 0.99 and abs(offset - 3.0) < 0.001
    assert tone_match(sent, sent[RATE * 3 : RATE * 9]) > 0.99
    steady = (0.3 * np.sin(2 * np.pi * 440 * np.arange(6 * RATE) / RATE)).astype(np.float32)
    assert tone_match(sent, steady) < 0.6
    for seed in range(8, 14):
        other = stepped_tone(TONE_SECONDS, seed=seed)[RATE * 3 : RATE * 9]
        assert tone_match(sent, other) < 0.7


def cut_every(audio: np.ndarray, every_s: float, cut_s: float) -> np.ndarray:
    """``audio`` with ``cut_s`` left out every ``every_s``, the joins cross-faded over 2 ms:
    the time a receiver's playout sheds by accelerating."""
    fade = RATE // 500
    ramp = np.linspace(0.0, 1.0, fade, dtype=np.float32)
    kept, cut = int(every_s * RATE), int(cut_s * RATE)
    pieces, position = [], 0
    while position + kept + cut + fade <= len(audio):
        piece = audio[position : position + kept].copy()
        after = audio[position + kept + cut : position + kept + cut + fade]
        piece[-fade:] = piece[-fade:] * (1 - ramp) + after * ramp
        pieces.append(piece)
        position += kept + cut + fade
    return np.concatenate(pieces)


def test_a_tone_whose_receiver_stretches_time_still_matches() -> None:
    """Chromium's playout was seen drifting 60 ms in six seconds on a loaded machine: the
    tone came back whole, but shifted within each window. The 10 ms cut every half second
    here is twice that drift; each window still matches, as it does not when the window
    must line up as a whole."""
    sent = stepped_tone(TONE_SECONDS)
    stretched = cut_every(sent[RATE * 2 : RATE * 10], every_s=0.5, cut_s=0.01)
    assert tone_match(sent, stretched) > 0.95
    assert tone_match(sent, stretched, slack_s=0.0) < 0.7
