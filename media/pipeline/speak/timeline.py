"""A speak session's events, following the audio actually sent, not the synthesis.

``speech_started`` goes out when an utterance's first sample leaves on the track,
``speech_finished`` when its last one has, or when it is interrupted, with the position
reached: a client that shows captions or waits for the end hears what it is told.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from media.audio.frames import RTC_RATE
from media.pipeline.events import EventSink
from media.pipeline.speak.stats import SpeakStats
from media.pipeline.speak.utterances import Utterance
from media.pipeline.stages import SpeakStages


class SpeechTimeline:
    """Utterances synthesised and not yet fully sent, in output order."""

    def __init__(
        self, emit: EventSink, clock: Callable[[], float], stats: SpeakStats, stages: SpeakStages
    ) -> None:
        self._emit = emit
        self._clock = clock
        self._stats = stats
        self._stages = stages
        self._playing: deque[Utterance] = deque()

    @property
    def busy(self) -> bool:
        return bool(self._playing)

    def begins_at(self, utterance: Utterance, position: int) -> None:
        """``utterance``'s first sample is written at output stream ``position``."""
        utterance.start = position
        self._playing.append(utterance)

    def advance(self, sent: int) -> None:
        """The output has sent everything before stream position ``sent``."""
        while self._playing:
            utterance = self._playing[0]
            assert utterance.start is not None
            silent = utterance.end == utterance.start
            if not utterance.started and (sent > utterance.start or silent):
                utterance.started = True
                self._emit({"type": "speech_started", "id": utterance.id})
                if not silent:
                    first_audio = 1000 * (self._clock() - utterance.queued_at)
                    self._stats.first_audio_ms.append(round(first_audio, 2))
                    self._stages.first_audio.observe(first_audio / 1000)
            if utterance.end is None or sent < utterance.end:
                return
            self._playing.popleft()
            self.finish(utterance, interrupted=False, position=utterance.end - utterance.start)

    def finish(self, utterance: Utterance, interrupted: bool, position: int) -> None:
        utterance.finished = True
        self._emit(
            {
                "type": "speech_finished",
                "id": utterance.id,
                "position_ms": round(1000 * max(0, position) / RTC_RATE, 1),
                "interrupted": interrupted,
            }
        )

    def cut(self, sent: int) -> int:
        """Interrupted at stream position ``sent``: finish everything playing; how many."""
        for utterance in self._playing:
            start = utterance.start if utterance.start is not None else sent
            self.finish(utterance, interrupted=True, position=sent - start)
        cut = len(self._playing)
        self._playing.clear()
        return cut

    def clear(self) -> None:
        self._playing.clear()
