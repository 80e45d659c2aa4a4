"""``pitch``: a streaming pitch shifter, as a cosyrtc engine plugin.

The classic delay-line shifter: the output reads the input through a delay that sweeps
across one window at the rate the pitch ratio asks for (a delay shrinking by ``r - 1``
samples per sample plays the audio ``r`` times as fast, so ``r`` times as high), through
two taps half a window apart whose gains cross-fade, so the wrap of one tap is silent
while the other plays. Everything a stream needs (the recent input, where the delay is)
lives in the session's :class:`PitchState`; the engine holds only its settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from media.engines.base import EngineKind, OptionSpec, TransformEngine
from media.engines.plugin import EnginePlugin, EngineSetting

RATE = 48_000
DEFAULT_WINDOW_MS = 40.0
MAX_SEMITONES = 12.0


@dataclass(eq=False)
class PitchState:
    ratio: float
    history: np.ndarray  # the last window (+ 2 samples for interpolation) of input
    delay: float  # the first tap's delay in samples, within [0, window)


class PitchShiftEngine(TransformEngine[PitchState]):
    def __init__(self, window_ms: float = DEFAULT_WINDOW_MS) -> None:
        self.window = int(RATE * window_ms / 1000)
        super().__init__(
            name="pitch",
            kind=EngineKind.TRANSFORM,
            sample_rate=RATE,
            hop_size=1,
            delay_ms=window_ms / 2,
            description="Shifts the caller's voice up or down (a plugin: cosyrtc-pitch).",
            option_specs=(
                OptionSpec(
                    "semitones",
                    "number",
                    4.0,
                    "Pitch shift in semitones (12: an octave up).",
                    minimum=-MAX_SEMITONES,
                    maximum=MAX_SEMITONES,
                ),
            ),
        )

    def new_state(self, options: Mapping[str, Any]) -> PitchState:
        return PitchState(
            ratio=2.0 ** (options["semitones"] / 12),
            history=np.zeros(self.window + 2, np.float32),
            delay=self.window / 2,
        )

    def process(self, state: PitchState, chunk: np.ndarray) -> tuple[np.ndarray, PitchState]:
        chunk = np.asarray(chunk, np.float32)
        n = len(chunk)
        if n == 0:
            return chunk, state
        window = self.window
        signal = np.concatenate([state.history, chunk])
        now = len(state.history) + np.arange(n)  # each output sample's index in ``signal``
        delays = (state.delay + (1.0 - state.ratio) * np.arange(n)) % window
        second = (delays + window / 2) % window
        phase = delays / window
        # Triangular cross-fade: a tap is silent where its delay wraps (phase 0 or 1).
        gain = 1.0 - np.abs(2.0 * phase - 1.0)
        out = gain * _tap(signal, now - delays) + (1.0 - gain) * _tap(signal, now - second)
        state.delay = float((state.delay + (1.0 - state.ratio) * n) % window)
        state.history = signal[-len(state.history) :].copy()
        return out.astype(np.float32), state

    def flush(self, state: PitchState) -> np.ndarray:
        return np.zeros(0, np.float32)


def _tap(signal: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``signal`` read at fractional ``positions``, linearly interpolated."""
    base = np.floor(positions).astype(np.int64)
    frac = positions - base
    return (1.0 - frac) * signal[base] + frac * signal[base + 1]


def _window_ms(raw: str) -> float:
    value = float(raw)
    if not 10.0 <= value <= 100.0:
        raise ValueError("the window is 10-100 ms")
    return value


PLUGIN = EnginePlugin(
    "pitch",
    load=lambda settings: PitchShiftEngine(settings["window_ms"]),
    settings=(
        EngineSetting("window_ms", "grain length in ms (10-100)", DEFAULT_WINDOW_MS, _window_ms),
    ),
)
