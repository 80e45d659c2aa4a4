"""A speak engine whose model runs in the model host: the worker keeps no weights.

It has the shape of the remote ``cosyvoice-triton`` engine: its own compute (the synthesis
thread only waits), audio streamed back and handed out 20 ms at a time, a cancel that
reaches the host within one frame. Its name, options and capabilities are the host's
engine's, read from the host's hello, so a session cannot tell a hosted engine from a
local one, except that it reads whole sentences (CosyVoice's incremental text is an
in-process path) and that a host that goes away ends its utterance with an ``error``.

A session's state on the host is opened on its first use (``synthesize`` or
``set_prompt``, which run on the pipeline's threads, never on the server's loop) and
again after the host restarted (a new link generation), with the session's voice prompt
sent again, so a call that outlived a host restart speaks its next utterance as before.

Flow control: the host sends an utterance's audio while it is less than the host's credit
ahead of what this worker has taken (``took`` reports, every ``CREDIT_REPORT_S``); a
session whose output is full stops taking frames, so the host stops computing for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from media.engines.base import Capabilities, EngineKind, EngineUnavailable, SpeakEngine
from media.engines.hosted.description import option_spec
from media.engines.hosted.link import HostLink, HostRefused
from media.engines.streamed_frames import FrameQueue

FRAME_MS = 20
# Audio a worker reports having taken at least this often (its credit at the host).
CREDIT_REPORT_S = 0.5
# The frame queue's bound, above the host's credit: the host never sends past it.
MAX_BUFFERED_S = 16.0
REQUEST_TIMEOUT_S = 30.0


@dataclass(eq=False)
class HostedState:
    """One session: its options and voice, and its state on the host (per generation)."""

    options: dict[str, Any]
    host_state: int | None = None
    generation: int = 0  # the link generation ``host_state`` belongs to
    prompt: tuple[np.ndarray, int, str] | None = None
    first_frame_s: float | None = None  # the last utterance's (stats, tests)


class HostedSpeakEngine(SpeakEngine[HostedState]):
    """A speak engine of the model host, served in this worker over ``link``."""

    def __init__(self, link: HostLink, described: Mapping[str, Any], chunk_timeout: float) -> None:
        self.link = link
        self.chunk_timeout = chunk_timeout
        rate = int(described["sample_rate"])
        self._frame = rate * FRAME_MS // 1000
        super().__init__(
            name=str(described["name"]),
            kind=EngineKind.SPEAK,
            sample_rate=rate,
            hop_size=int(described["hop_size"]),
            delay_ms=float(described["delay_ms"]),
            description=str(described["description"]),
            option_specs=tuple(option_spec(option) for option in described["options"]),
            capabilities=Capabilities(
                voice_prompt=bool(described["voice_prompt"]),
                languages=tuple(described["languages"]),
                own_compute=True,
            ),
        )

    @property
    def unavailable_reason(self) -> str | None:
        return self.link.unavailable_reason

    def new_state(self, options: Mapping[str, Any]) -> HostedState:
        return HostedState(dict(options))

    def _open(self, state: HostedState) -> None:
        """Make sure the state exists on the host of the link's current generation."""
        if state.host_state is not None and state.generation == self.link.generation:
            return
        request = {"t": "open", "engine": self.name, "options": state.options}
        reply, generation = self.link.request(request, timeout=REQUEST_TIMEOUT_S)
        state.host_state, state.generation = int(reply["state"]), generation
        if state.prompt is not None:
            self._send_prompt(state, *state.prompt)

    def _send_prompt(self, state: HostedState, audio: np.ndarray, rate: int, text: str) -> None:
        header = {"t": "prompt", "state": state.host_state, "rate": rate, "transcript": text}
        payload = np.ascontiguousarray(audio, np.float32).tobytes()
        try:
            self.link.request(header, payload, timeout=REQUEST_TIMEOUT_S)
        except HostRefused as exc:
            raise ValueError(str(exc)) from exc

    def set_prompt(self, state: HostedState, audio: np.ndarray, rate: int, transcript: str) -> None:
        """Clone the voice of ``audio`` on the host; ``ValueError`` with the host's reason for
        a clip it refuses."""
        if not self.capabilities.voice_prompt:
            super().set_prompt(state, audio, rate, transcript)
        self._open(state)
        self._send_prompt(state, audio, rate, transcript)
        state.prompt = (np.array(audio, np.float32), rate, transcript)

    def synthesize(
        self, state: HostedState, text: str, cancel: threading.Event
    ) -> Iterator[np.ndarray]:
        if not text.strip() or cancel.is_set():
            return
        reason = self.link.unavailable_reason
        if reason is not None:
            raise EngineUnavailable(reason)
        self._open(state)
        frames = FrameQueue(self._frame, int(MAX_BUFFERED_S * self.sample_rate), self.link.loop)
        header = {"t": "speak", "state": state.host_state, "text": text}
        stream = self.link.open_stream(header, frames, state.generation)
        report = int(CREDIT_REPORT_S * self.sample_rate)
        taken = reported = 0
        started, state.first_frame_s = time.monotonic(), None
        try:
            while (frame := frames.take(cancel, self.chunk_timeout)) is not None:
                if state.first_frame_s is None:
                    state.first_frame_s = time.monotonic() - started
                taken += len(frame)
                if taken - reported >= report:
                    self.link.took(stream, taken)
                    reported = taken
                yield frame
        finally:
            self.link.end_stream(stream)

    def close_state(self, state: HostedState) -> None:
        if state.host_state is not None and state.generation == self.link.generation:
            self.link.send({"t": "close", "state": state.host_state})

    def close(self) -> None:
        self.link.close()
