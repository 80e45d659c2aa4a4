"""The pitch engine on its own: the right pitch comes out, and chunking changes nothing."""

from __future__ import annotations

import numpy as np
import pytest
from cosyrtc_pitch import PLUGIN, RATE, PitchShiftEngine

from media.engines.plugin import EngineSettingsError


def tone(hz: float, seconds: float = 1.0) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * hz * np.arange(int(seconds * RATE)) / RATE)).astype(np.float32)


def dominant_hz(audio: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(audio * np.hanning(len(audio))))
    return float(np.argmax(spectrum) * RATE / len(audio))


@pytest.mark.parametrize(("semitones", "expected"), [(12, 880.0), (-12, 220.0), (7, 659.3)])
def test_a_tone_comes_out_shifted_by_the_semitones_asked_for(semitones, expected):
    engine = PitchShiftEngine()
    state = engine.new_state(engine.validate_options({"semitones": semitones}))
    out, _ = engine.process(state, tone(440.0))
    # The cross-fading taps modulate the level at the window rate (12-50 Hz), which puts
    # sidebands beside the tone: within 3 % is the shifted tone, an unshifted one is 50 % off.
    assert abs(dominant_hz(out[RATE // 4 :]) - expected) < 0.03 * expected


def test_any_chunking_gives_the_same_stream():
    engine = PitchShiftEngine()
    options = engine.validate_options({"semitones": 5})
    whole, _ = engine.process(engine.new_state(options), tone(300.0))
    state = engine.new_state(options)
    pieces = []
    for start in range(0, RATE, 333):  # odd chunk sizes, as a receive path may hand them
        piece, state = engine.process(state, tone(300.0)[start : start + 333])
        pieces.append(piece)
    np.testing.assert_allclose(np.concatenate(pieces), whole, atol=1e-4)


def test_sessions_do_not_share_state():
    engine = PitchShiftEngine()
    up = engine.new_state(engine.validate_options({"semitones": 12}))
    down = engine.new_state(engine.validate_options({"semitones": -12}))
    high, _ = engine.process(up, tone(440.0))
    low, _ = engine.process(down, tone(440.0))
    assert dominant_hz(high[RATE // 4 :]) > 800 and dominant_hz(low[RATE // 4 :]) < 250


def test_the_window_setting_is_checked():
    assert PLUGIN.parse_settings({"window_ms": "30"}) == {"window_ms": 30.0}
    with pytest.raises(EngineSettingsError, match="10-100"):
        PLUGIN.parse_settings({"window_ms": "500"})
