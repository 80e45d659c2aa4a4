"""The cosyvoice-vc engine without a call: phrases in, converted phrases out, in order."""

from __future__ import annotations

import numpy as np

from media.engines.cosyvoice.vc import CosyVoiceVcEngine
from peer.speech import espeak

RATE = 24_000
FRAME = RATE // 50


def feed(engine: CosyVoiceVcEngine, state, audio: np.ndarray) -> np.ndarray:
    out = [engine.process(state, audio[i : i + FRAME])[0] for i in range(0, len(audio), FRAME)]
    return np.concatenate([*out, engine.flush(state)])


def test_each_phrase_comes_back_converted_and_as_long_as_it_was(vc_engine: CosyVoiceVcEngine):
    """Two phrases with a pause: two conversions, each about as long as its phrase."""
    state = vc_engine.new_state(vc_engine.validate_options({"speaker": "tiny-a"}))
    clip = espeak("My voice should be used from now on.", rate=16_000)
    vc_engine.set_prompt(state, clip, 16_000, "")
    assert state.prompt.flow.length > 0 and state.prompt.text.size == 0
    pause = np.zeros(RATE, np.float32)
    phrases = [0.6 * espeak(text, rate=RATE) for text in ("Good morning.", "How are you today?")]
    out = feed(vc_engine, state, np.concatenate([pause, phrases[0], pause, phrases[1], pause]))
    assert len(state.finished) == 2
    for conversion, phrase in zip(state.finished, phrases, strict=True):
        assert abs(conversion.seconds - len(phrase) / RATE) < 0.8  # pre-roll and VAD tails
    assert abs(np.count_nonzero(out) / RATE - sum(c.seconds for c in state.finished)) < 0.1
    vc_engine.close_state(state)
