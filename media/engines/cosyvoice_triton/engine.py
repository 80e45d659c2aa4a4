"""``cosyvoice-triton``: CosyVoice2 spoken by a Triton server running the official runtime.

Each call of ``synthesize`` (one sentence or clause of an utterance, as the speak pipeline
hands them over) is one request on its own gRPC stream (``stream.py``): the text, and the
session's voice as the runtime's reference inputs (``voices.py``). The 24 kHz chunks the
server sends are handed out 20 ms at a time, so the pipeline checks its cancel and its room
at every frame as it does for a local engine, and a cancel closes the stream.

Threads: ``synthesize`` runs in the pipeline's engine threads and blocks only on the
utterance's frame queue; all gRPC work runs on the link's own loop thread (``link.py``).

While the server cannot be reached, ``unavailable_reason`` says why and ``synthesize``
raises ``EngineUnavailable`` at once, which the speak pipeline reports as an ``error``
event; the link reconnects with backoff and the engine serves again when the server is back.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from media.engines.base import (
    BARGE_IN_OPTION,
    Capabilities,
    EngineError,
    EngineKind,
    EngineUnavailable,
    OptionSpec,
    SpeakEngine,
)
from media.engines.cosyvoice_triton.contract import OUTPUT_RATE, Reference, build_request
from media.engines.cosyvoice_triton.link import TritonLink
from media.engines.cosyvoice_triton.stream import RemoteStream
from media.engines.cosyvoice_triton.voices import (
    CACHED_SPEAKER,
    PROMPT_SPEAKER,
    reference_from_clip,
)

FRAME_MS = 20
FRAME_SAMPLES = OUTPUT_RATE * FRAME_MS // 1000
# Received audio one utterance may hold before its reader stops reading the stream.
MAX_BUFFERED_S = 8.0
# What CosyVoice2 was trained to speak: Chinese, English, Japanese, Korean and Cantonese.
LANGUAGES = ("zh", "en", "ja", "ko", "yue")


@dataclass(eq=False)
class TritonSpeakState:
    """One session: its voice and the stream of the utterance in progress."""

    speaker: str
    reference: Reference | None  # None: the runtime's cached speaker
    stream: RemoteStream | None = None
    # The last utterance, for stats and tests: its request id and seconds to its first frame.
    last_request: str | None = None
    first_frame_s: float | None = None


class CosyVoiceTritonEngine(SpeakEngine[TritonSpeakState]):
    """Speech from a remote CosyVoice2 runtime; nothing of the model lives in this process."""

    def __init__(
        self, link: TritonLink, speakers: Mapping[str, Reference], chunk_timeout: float
    ) -> None:
        self.link = link
        self.chunk_timeout = chunk_timeout
        self._speakers = dict(speakers)
        self._lock = threading.Lock()
        self._streams = 0
        super().__init__(
            name="cosyvoice-triton",
            kind=EngineKind.SPEAK,
            sample_rate=OUTPUT_RATE,
            hop_size=FRAME_SAMPLES,
            delay_ms=0.0,
            description="CosyVoice2 on a Triton server (the official runtime), streamed over "
            "gRPC, with zero-shot voice cloning.",
            capabilities=Capabilities(voice_prompt=True, languages=LANGUAGES, own_compute=True),
            option_specs=(
                OptionSpec(
                    "speaker",
                    "string",
                    CACHED_SPEAKER,
                    f"Voice: '{CACHED_SPEAKER}' is the server's cached speaker, the others "
                    "are the operator's reference clips (a prompt clip set for the session "
                    "replaces it).",
                    choices=(CACHED_SPEAKER, *self._speakers),
                ),
                BARGE_IN_OPTION,
            ),
        )

    @property
    def unavailable_reason(self) -> str | None:
        """None while the server takes new streams; otherwise a sentence saying why not."""
        return self.link.unavailable_reason

    def wait_until_available(self, timeout: float) -> bool:
        return self.link.wait_until_ready(timeout)

    @property
    def active_streams(self) -> int:
        """Utterances streaming from the server right now, across sessions."""
        with self._lock:
            return self._streams

    def new_state(self, options: Mapping[str, Any]) -> TritonSpeakState:
        speaker = options["speaker"]
        return TritonSpeakState(speaker=speaker, reference=self._speakers.get(speaker))

    def set_prompt(
        self, state: TritonSpeakState, audio: np.ndarray, rate: int, transcript: str
    ) -> None:
        """Speak in the voice of ``audio`` (float32 mono at ``rate``, 0.5-30 s) from the next
        utterance on; raises ``PromptError`` for a clip the runtime cannot clone."""
        state.reference = reference_from_clip(audio, rate, transcript)
        state.speaker = PROMPT_SPEAKER

    def synthesize(
        self, state: TritonSpeakState, text: str, cancel: threading.Event
    ) -> Iterator[np.ndarray]:
        if not text.strip() or cancel.is_set():
            return
        reason = self.link.unavailable_reason
        served = self.link.served
        if reason is not None or served is None:
            raise EngineUnavailable(reason or "the Triton server has not answered yet")
        if state.reference is None and not served.references_optional:
            raise EngineError(
                f"model '{self.link.settings.model}' requires a reference clip: upload a voice "
                "prompt, or choose one of the operator's speakers"
            )
        request_id = uuid.uuid4().hex
        request = build_request(self.link.settings.model, request_id, text, state.reference, served)
        limit = int(MAX_BUFFERED_S * OUTPUT_RATE)
        stream = RemoteStream.open(self.link, request, cancel, FRAME_SAMPLES, limit)
        state.stream, state.last_request, state.first_frame_s = stream, request_id, None
        started = time.monotonic()
        with self._lock:
            self._streams += 1
        try:
            while (frame := stream.next_frame(self.chunk_timeout)) is not None:
                if state.first_frame_s is None:
                    state.first_frame_s = time.monotonic() - started
                yield frame
        finally:
            stream.close()
            state.stream = None
            with self._lock:
                self._streams -= 1

    def close_state(self, state: TritonSpeakState) -> None:
        stream = state.stream
        if stream is not None:
            stream.close()

    def close(self) -> None:
        self.link.close()
