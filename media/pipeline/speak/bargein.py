"""Barge-in: hear the caller start talking over our own voice, and not over its echo.

The caller's audio goes through an echo canceller whose reference is what we sent (off
the event loop, a batch of queued frames per call), then Silero VAD, batched across the
worker's speak sessions (``media.pipeline.shared_vad``). Two guards, measured on
simulated loudspeaker calls:

- residual echo: while the canceller converges (or re-converges after the echo path moves)
  some of our own voice leaks through, and the VAD hears speech at any level. Cleaned audio
  only counts when it is within ``ECHO_GATE_DB`` of our loudest recent output.
- double talk: AEC3's suppressor mutes the caller's first words while we speak (the caller
  fell from -25 dBFS to -95 dBFS after cancellation). A raw microphone signal within
  ``DOUBLE_TALK_DB`` of our loudest recent output is louder than any loudspeaker echo of it
  (a loudspeaker returns our voice 10 dB or more below what we sent), so the VAD hears the
  raw signal then (a Geigel double-talk detector).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor

import numpy as np

from media.audio.aec import EchoCanceller
from media.audio.queues import DropOldestQueue
from media.audio.vad import SpeechDetector, SpeechEventKind
from media.pipeline.shared_vad import VadStream
from media.pipeline.speak.stats import SpeakStats

LISTEN_QUEUE_FRAMES = 25  # caller audio waiting for the echo canceller and VAD, at most
ECHO_GATE_DB = 15.0
DOUBLE_TALK_DB = 12.0
SILENT_DB = -120.0
ECHO_GATE_WINDOW_FRAMES = 25  # 500 ms: the longest echo path the canceller handles


def _level_db(samples: np.ndarray) -> float:
    return float(10 * np.log10(np.mean(np.square(samples)) + 10 ** (SILENT_DB / 10)))


class BargeInListener:
    """One session's ears: our output as the echo reference, the caller's input to judge."""

    def __init__(self, vad: VadStream, executor: Executor, stats: SpeakStats) -> None:
        self._vad = vad
        self._executor = executor
        self._stats = stats
        self._detector = SpeechDetector()
        self._aec = EchoCanceller()
        self._reference_levels: deque[float] = deque(maxlen=ECHO_GATE_WINDOW_FRAMES)
        self._heard: DropOldestQueue[tuple[str, np.ndarray]] = DropOldestQueue(
            LISTEN_QUEUE_FRAMES * 2
        )

    def sent(self, samples: np.ndarray) -> None:
        """A frame of ours left: the canceller's reference."""
        self._put("render", samples)

    def heard(self, pcm: np.ndarray) -> None:
        """A frame of the caller's arrived."""
        self._put("capture", pcm)

    def _put(self, kind: str, samples: np.ndarray) -> None:
        if not self._heard.put((kind, samples.copy())):
            self._stats.listen_dropped += 1

    async def listen(self, on_speech: Callable[[], None]) -> None:
        """Call ``on_speech`` each time the caller starts talking; runs until cancelled.

        The echo canceller runs off the loop, a batch of queued frames per call; the VAD
        scores what it leaves in the worker's shared batched model.
        """
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._heard.get()]
            while len(self._heard):
                batch.append(await self._heard.get())
            frames = await loop.run_in_executor(self._executor, self._cancel_echo, batch)
            if not frames:
                continue
            scores = await self._vad.probabilities([samples for samples, _ in frames])
            started = False
            for (_, gated), probabilities in zip(frames, scores, strict=True):
                heard = [0.0] * len(probabilities) if gated else probabilities
                for event in self._detector.update(heard):
                    started |= event.kind is SpeechEventKind.START
            if started:
                on_speech()

    def _cancel_echo(self, batch: list[tuple[str, np.ndarray]]) -> list[tuple[np.ndarray, bool]]:
        """Runs in a worker thread: each caller frame as the VAD should hear it, and whether
        the echo gate keeps it from counting."""
        frames: list[tuple[np.ndarray, bool]] = []
        for kind, samples in batch:
            if kind == "render":
                self._aec.render(samples)
                self._reference_levels.append(_level_db(samples))
                continue
            cleaned = self._aec.capture(samples)
            loudest = self._loudest_reference()
            double_talk = _level_db(samples) >= loudest - DOUBLE_TALK_DB
            gated = not double_talk and _level_db(cleaned) < loudest - ECHO_GATE_DB
            frames.append((samples if double_talk else cleaned, gated))
        return frames

    def _loudest_reference(self) -> float:
        """Our loudest output frame within the echo window (silence when we said nothing)."""
        return max(self._reference_levels, default=SILENT_DB)

    def close(self) -> None:
        self._heard.clear()
        self._vad.close()
