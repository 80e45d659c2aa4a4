"""How fast an engine makes speech once a sentence is under way, across its sessions.

A sentence's first chunk carries the sentence's fixed costs (Piper's text encoder runs on
the whole sentence, ~60 ms for twelve words, before the first 186 ms of audio); the chunks
after it cost only their own audio. Sized from the first chunk, a pre-buffer takes an
engine at several times its real pace: one run measured Piper's first chunk at a real-time
factor near 0.5 alone and above 1 with eight callers at once, so each caller held its first
audio back for seconds of speech it did not need. A session's first utterance has measured
nothing else yet, so the steady pace is kept per engine (shared by its sessions in this
process) and a session uses its own once it has enough of it.
"""

from __future__ import annotations

import weakref
from typing import Any

from media.engines.base import SpeakEngine

# Each chunk weighs on the engine's pace with this share, so ~50 chunks (a few sentences,
# across whichever sessions made them) make up what it says: it follows the machine's load.
PACE_WEIGHT = 0.02


class SynthesisPace:
    """Engine seconds per second of audio, over chunks that are not a sentence's first."""

    def __init__(self) -> None:
        self._engine_seconds = 0.0
        self._audio_seconds = 0.0

    def observe(self, engine_seconds: float, audio_seconds: float) -> None:
        keep = 1.0 - PACE_WEIGHT
        self._engine_seconds = keep * self._engine_seconds + engine_seconds
        self._audio_seconds = keep * self._audio_seconds + audio_seconds

    @property
    def factor(self) -> float | None:
        if not self._audio_seconds:
            return None
        return self._engine_seconds / self._audio_seconds


_paces: dict[int, SynthesisPace] = {}  # by id() of the loaded engine, while it lives


def engine_pace(engine: SpeakEngine[Any]) -> SynthesisPace:
    """The steady pace of this loaded ``engine`` (made on first use, forgotten with the
    engine; engines compare by value, so they are told apart by identity). Read and
    updated on the event loop's thread only."""
    key = id(engine)
    pace = _paces.get(key)
    if pace is None:
        pace = _paces[key] = SynthesisPace()
        weakref.finalize(engine, _paces.pop, key, None)
    return pace
