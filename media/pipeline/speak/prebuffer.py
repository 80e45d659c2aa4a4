"""How much of an utterance must be ready before it starts playing: the pre-buffer.

Playback runs at real time; synthesis runs at the engine's real-time factor ``r`` (engine
seconds per second of audio) and delivers its audio in chunks. ``r`` is the steady pace,
without each sentence's first chunk and its fixed costs (``media.pipeline.speak.pace``):
this session's own once it has measured ``OWN_PACE_AFTER_S`` of audio, the engine's (all
its sessions here) before that, and this session's first chunk only when the engine has
measured nothing yet. Once playing, the buffer must never run dry
before the next chunk comes, or the listener hears the voice stutter mid-sentence. A fast
engine (Piper: ``r`` ~0.1) needs nothing beyond its first chunk; a slow one (CosyVoice on
a busy machine: ``r`` near or above 1) needs seconds. The rule, re-checked at every chunk
until playback starts:

- the next chunk must be made while what is buffered plays: at least ``r * SAFETY`` times
  the next chunk's length (chunks grow: twice the last one, up to the engine's hop size);
- when ``r * SAFETY`` is above 1, synthesis falls behind by that much per second of what
  remains (estimated from the text, ``SECONDS_PER_CHARACTER``), and the buffer must hold
  that deficit from the start.

The whole is capped at ``MAX_PREBUFFER_S``; an utterance whose synthesis has ended plays
whatever it has.
"""

from __future__ import annotations

from typing import Any

from media.audio.frames import RTC_RATE
from media.engines.base import SpeakEngine
from media.pipeline.speak.pace import engine_pace
from media.pipeline.speak.stats import SpeakStats
from media.pipeline.speak.utterances import Utterance

SAFETY = 1.25
SECONDS_PER_CHARACTER = 0.07  # English at a normal pace, a little on the long side
MAX_PREBUFFER_S = 10.0
OWN_PACE_AFTER_S = 1.0


class PreBuffer:
    """The pre-buffer of a session's utterances, from its engine's measured speed."""

    def __init__(self, engine: SpeakEngine[Any], stats: SpeakStats) -> None:
        self._longest_chunk = engine.hop_size / engine.sample_rate
        self._stats = stats
        self._engine_pace = engine_pace(engine)

    @property
    def real_time_factor(self) -> float | None:
        """The pace to plan with (see the module's docstring)."""
        stats = self._stats
        if stats.steady_synthesised_seconds >= OWN_PACE_AFTER_S:
            return stats.steady_factor
        return self._engine_pace.factor or stats.steady_factor or stats.real_time_factor

    def needed(self, utterance: Utterance, last_chunk: float) -> int:
        """Samples (48 kHz) of ``utterance`` to buffer before it plays, after a chunk of
        ``last_chunk`` seconds."""
        rate = self.real_time_factor
        if not rate:
            return 0
        pace = rate * SAFETY
        next_chunk = min(2 * last_chunk, max(self._longest_chunk, last_chunk))
        seconds = pace * next_chunk
        if pace > 1:
            remaining = utterance.characters * SECONDS_PER_CHARACTER - utterance.synthesised
            seconds += (pace - 1) * max(0.0, remaining)
        seconds = min(seconds, MAX_PREBUFFER_S)
        self._stats.prebuffered_ms = round(1000 * seconds, 1)
        return round(seconds * RTC_RATE)
