"""What a speak session counts and times."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

RECENT = 200  # latency samples kept for stats


@dataclass
class SpeakStats:
    utterances: int = 0
    interrupted: int = 0
    barge_ins: int = 0
    sentences: int = 0
    synthesis_errors: int = 0
    listen_dropped: int = 0
    underruns: int = 0  # slots found empty mid-utterance (the engine was late)
    prebuffered_ms: float = 0.0  # the last utterance's pre-buffer
    synthesis_seconds: float = 0.0  # engine time, excluding waits for room in the buffer
    synthesised_seconds: float = 0.0  # audio produced
    # The same for chunks that are not a sentence's first (see ``media.pipeline.speak.pace``).
    steady_synthesis_seconds: float = 0.0
    steady_synthesised_seconds: float = 0.0
    # Recent latencies: text arrived -> its first frame left; interrupt -> track silent.
    first_audio_ms: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))
    interrupt_ms: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))

    @property
    def real_time_factor(self) -> float | None:
        if not self.synthesised_seconds:
            return None
        return self.synthesis_seconds / self.synthesised_seconds

    @property
    def steady_factor(self) -> float | None:
        if not self.steady_synthesised_seconds:
            return None
        return self.steady_synthesis_seconds / self.steady_synthesised_seconds

    def describe(self) -> dict[str, Any]:
        return {
            **{k: v for k, v in vars(self).items() if not isinstance(v, deque)},
            "real_time_factor": self.real_time_factor,
            "steady_real_time_factor": self.steady_factor,
            "first_audio_ms": list(self.first_audio_ms),
            "interrupt_ms": list(self.interrupt_ms),
        }
