"""Engines for tests: the real protocols, with faults, delays and hangs injected by option.

``FakeTransform`` returns its input (like ``echo``, but on a worker thread) and
``FakeSpeak`` speaks a tone per sentence. Each session chooses its own faults through its
options, so one call of a test can fail while the others beside it run clean, through the
real sessions, pipelines and recovery path. Neither is installed as an entry point: tests
add them with ``EngineRegistry.load([..., "fake-transform"], extra=[FAKE_TRANSFORM])``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from media.engines.base import (
    BARGE_IN_OPTION,
    Capabilities,
    EngineKind,
    OptionSpec,
    SpeakEngine,
    TransformEngine,
)
from media.engines.plugin import EnginePlugin

FAKE_RATE = 48_000
TONE_HZ = 440.0
SPEECH_SECONDS_PER_CHARACTER = 0.05  # ~what a voice takes per character, for lengths
PROMPT_SECONDS = 0.02  # how long analysing a voice prompt takes


class InjectedFault(RuntimeError):
    """Raised where a test asked for a failure."""


FAULT_OPTIONS = (
    OptionSpec(
        "fail_after",
        "integer",
        -1,
        "Calls that succeed before the failures start (-1: never fail).",
        minimum=-1,
    ),
    OptionSpec("failures", "integer", 0, "How many calls fail in a row, then.", minimum=0),
    OptionSpec("delay_ms", "number", 0.0, "Extra time every call takes.", minimum=0),
    OptionSpec(
        "hang_after",
        "integer",
        -1,
        "Calls before one that blocks for hang_seconds (-1: never).",
        minimum=-1,
    ),
    OptionSpec("hang_seconds", "number", 5.0, "How long the hanging call blocks.", minimum=0),
)


@dataclass(eq=False)
class FaultState:
    """A session's faults and how far it has got."""

    options: dict[str, Any]
    calls: int = 0
    raised: int = 0
    closed: bool = False
    prompts: int = 0
    # Calls that found another call of this state running: the state was shared by threads.
    overlaps: int = 0
    _busy: bool = False

    def step(self) -> None:
        """One engine call: delay, hang or raise as the options say."""
        with self._running():
            index, self.calls = self.calls, self.calls + 1
            if self.options["delay_ms"]:
                time.sleep(self.options["delay_ms"] / 1000)
            if index == self.options["hang_after"]:
                time.sleep(self.options["hang_seconds"])
            start = self.options["fail_after"]
            if start >= 0 and start <= index < start + self.options["failures"]:
                self.raised += 1
                raise InjectedFault(f"injected fault in call {index}")

    def take_prompt(self) -> None:
        with self._running():
            time.sleep(PROMPT_SECONDS)
            self.prompts += 1

    @contextlib.contextmanager
    def _running(self) -> Iterator[None]:
        self.overlaps += self._busy
        self._busy = True
        try:
            yield
        finally:
            self._busy = False


class FakeTransform(TransformEngine[FaultState]):
    """Returns every chunk unchanged, on a worker thread, failing where told to."""

    def __init__(self) -> None:
        super().__init__(
            name="fake-transform",
            kind=EngineKind.TRANSFORM,
            sample_rate=FAKE_RATE,
            hop_size=1,
            delay_ms=0.0,
            description="Test engine: echo with injected faults.",
            option_specs=FAULT_OPTIONS,
            capabilities=Capabilities(voice_prompt=True),
        )

    def new_state(self, options: Mapping[str, Any]) -> FaultState:
        return FaultState(dict(options))

    def reset_state(self, state: FaultState, options: Mapping[str, Any]) -> FaultState:
        """The counts go on across a reset: a test asks for N failures in all, not per state."""
        state.closed = False
        return state

    def process(self, state: FaultState, chunk: np.ndarray) -> tuple[np.ndarray, FaultState]:
        state.step()
        return chunk, state

    def flush(self, state: FaultState) -> np.ndarray:
        return np.zeros(0, np.float32)

    def set_prompt(self, state: FaultState, audio: np.ndarray, rate: int, transcript: str) -> None:
        state.take_prompt()

    def close_state(self, state: FaultState) -> None:
        state.closed = True


class FakeSpeak(SpeakEngine[FaultState]):
    """Speaks each sentence as a tone as long as the sentence would take, in 20 ms chunks."""

    def __init__(self, languages: tuple[str, ...] = ("en",)) -> None:
        super().__init__(
            name="fake-speak",
            kind=EngineKind.SPEAK,
            sample_rate=FAKE_RATE,
            hop_size=FAKE_RATE // 50,
            delay_ms=0.0,
            description="Test engine: a tone per sentence, with injected faults.",
            option_specs=(*FAULT_OPTIONS, BARGE_IN_OPTION),
            capabilities=Capabilities(languages=languages),
        )

    def new_state(self, options: Mapping[str, Any]) -> FaultState:
        return FaultState(dict(options))

    def synthesize(
        self, state: FaultState, text: str, cancel: threading.Event
    ) -> Iterator[np.ndarray]:
        samples = int(len(text) * SPEECH_SECONDS_PER_CHARACTER * FAKE_RATE)
        t = np.arange(samples) / FAKE_RATE
        tone = (0.3 * np.sin(2 * np.pi * TONE_HZ * t)).astype(np.float32)
        for start in range(0, samples, self.hop_size):
            if cancel.is_set():
                return
            state.step()
            yield tone[start : start + self.hop_size]

    def close_state(self, state: FaultState) -> None:
        state.closed = True


FAKE_TRANSFORM = EnginePlugin("fake-transform", lambda settings: FakeTransform())
FAKE_SPEAK = EnginePlugin("fake-speak", lambda settings: FakeSpeak())
