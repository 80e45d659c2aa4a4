"""``cosyvoice-vc``: the caller's voice, converted to another speaker, one phrase at a time.

CosyVoice2 converts voices by reading the caller's speech tokens (``speech_tokenizer_v2``) and
rendering them with the flow and HiFT conditioned on the target speaker. That tokenizer is a
Whisper-style encoder with full self-attention over its input: it is not causal, and the
tokens of a stretch of speech are only right once the whole stretch has been heard. So the
caller's audio is cut into phrases by Silero VAD (with a short pre-roll, so a phrase keeps its
first syllable), and each phrase is converted once it ends (300 ms of quiet) or reaches
``MAX_SEGMENT_SECONDS``. The added latency is therefore the phrase's own length, plus the VAD's
end-of-speech wait, plus the conversion time (measured in tests/cosyvoice/test_vc_call.py).

Conversion runs on the engine's own worker thread, so the session's engine calls stay short
and the caller's audio keeps flowing into the VAD meanwhile. Converted audio is released at the
rate the caller's audio arrives (one chunk out per chunk in), so a long phrase plays at normal
speed instead of overflowing the session's output buffer in one burst.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import soxr

from media.audio.resample import StreamResampler
from media.audio.vad import (
    MODEL_RATE,
    STOP_MS,
    SileroVad,
    SpeechDetector,
    SpeechEventKind,
    VadState,
)
from media.engines.base import Capabilities, EngineKind, OptionSpec, TransformEngine
from media.engines.cosyvoice.flow_window import flow_mel
from media.engines.cosyvoice.modeldir import LoadedModel
from media.engines.cosyvoice.prompts import (
    SpeakerPrompt,
    neutral_prompt,
    prompt_from_clip,
    prompt_from_speaker,
    speech_tokens,
)
from media.engines.cosyvoice.schedule import CHUNK_TOKENS
from media.engines.cosyvoice.vocoder import VocoderCache, vocode

PREROLL_SECONDS = 0.3  # audio kept from before the VAD decided speech had started
MAX_SEGMENT_SECONDS = 8.0  # a phrase longer than this is converted in parts
MIN_SEGMENT_SECONDS = 0.2  # shorter blips are dropped (a token is 40 ms)
NEUTRAL_SPEAKER = "neutral"


@dataclass(eq=False)
class Conversion:
    """One phrase handed to the worker, with its timing (``time.monotonic()``)."""

    seconds: float
    submitted_at: float
    future: Future[np.ndarray]
    done_at: float | None = None


@dataclass(eq=False)
class VcState:
    """One session: VAD, the phrase being heard, conversions in flight and audio to send."""

    prompt: SpeakerPrompt
    vad: VadState
    detector: SpeechDetector = field(default_factory=SpeechDetector)
    preroll: deque[np.ndarray] = field(default_factory=deque)
    preroll_samples: int = 0
    segment: list[np.ndarray] | None = None
    segment_samples: int = 0
    pending: deque[Conversion] = field(default_factory=deque)
    ready: deque[np.ndarray] = field(default_factory=deque)
    ready_samples: int = 0
    finished: list[Conversion] = field(default_factory=list)  # recent, for stats and tests


class CosyVoiceVcEngine(TransformEngine[VcState]):
    """Phrase-by-phrase voice conversion to a built-in or cloned speaker."""

    def __init__(self, model: LoadedModel, vad: SileroVad | None = None) -> None:
        self.model = model
        self._vad = vad if vad is not None else SileroVad()
        self._speakers = {
            name: prompt_from_speaker(speaker) for name, speaker in model.speakers.items()
        } or {NEUTRAL_SPEAKER: neutral_prompt()}
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cosyvoice-vc")
        rate = model.sample_rate
        super().__init__(
            name="cosyvoice-vc",
            kind=EngineKind.TRANSFORM,
            sample_rate=rate,
            hop_size=rate // 50,
            # The fixed part of the delay; each phrase also waits for its own length and its
            # conversion (the speech tokenizer needs the whole phrase).
            delay_ms=STOP_MS,
            description="CosyVoice2 voice conversion, phrase by phrase (VAD-segmented).",
            capabilities=Capabilities(voice_prompt=True),
            option_specs=(
                OptionSpec(
                    "speaker",
                    "string",
                    next(iter(self._speakers)),
                    "Target speaker (a prompt clip set for the session replaces it).",
                    choices=tuple(self._speakers),
                ),
            ),
        )

    def new_state(self, options: Mapping[str, Any]) -> VcState:
        resampler = StreamResampler(self.sample_rate, MODEL_RATE)
        return VcState(prompt=self._speakers[options["speaker"]], vad=VadState(resampler))

    def set_prompt(self, state: VcState, audio: np.ndarray, rate: int, transcript: str) -> None:
        """Convert to the voice of ``audio`` from now on (the transcript is not needed)."""
        state.prompt = prompt_from_clip(self.model, audio, rate, None)

    def process(self, state: VcState, chunk: np.ndarray) -> tuple[np.ndarray, VcState]:
        chunk = np.asarray(chunk, dtype=np.float32)
        events = state.detector.update(self._vad.process(state.vad, chunk))
        if state.segment is not None:
            self._extend(state, chunk)
        for event in events:
            if event.kind is SpeechEventKind.START and state.segment is None:
                state.segment, state.segment_samples = list(state.preroll), state.preroll_samples
                self._extend(state, chunk)
            elif event.kind is SpeechEventKind.END and state.segment is not None:
                self._submit(state)
        if state.segment is None:
            self._remember(state, chunk)
        elif state.segment_samples >= MAX_SEGMENT_SECONDS * self.sample_rate:
            self._submit(state)
            state.segment, state.segment_samples = [], 0  # the phrase goes on
        self._collect(state)
        return self._take(state, len(chunk)), state

    def flush(self, state: VcState) -> np.ndarray:
        if state.segment is not None:
            self._submit(state)
        for conversion in state.pending:
            conversion.future.result()
        self._collect(state)
        return self._take(state, state.ready_samples)

    def close_state(self, state: VcState) -> None:
        for conversion in state.pending:
            conversion.future.cancel()
        state.pending.clear()
        state.ready.clear()
        state.segment = None

    def shutdown(self) -> None:
        self._worker.shutdown(wait=True, cancel_futures=True)

    def _extend(self, state: VcState, chunk: np.ndarray) -> None:
        assert state.segment is not None
        state.segment.append(chunk)
        state.segment_samples += len(chunk)

    def _remember(self, state: VcState, chunk: np.ndarray) -> None:
        state.preroll.append(chunk)
        state.preroll_samples += len(chunk)
        while state.preroll_samples - len(state.preroll[0]) >= PREROLL_SECONDS * self.sample_rate:
            state.preroll_samples -= len(state.preroll.popleft())

    def _submit(self, state: VcState) -> None:
        assert state.segment is not None
        audio = np.concatenate(state.segment) if state.segment else np.zeros(0, np.float32)
        state.segment, state.segment_samples = None, 0
        state.preroll.clear()
        state.preroll_samples = 0
        seconds = len(audio) / self.sample_rate
        if seconds < MIN_SEGMENT_SECONDS:
            return
        future = self._worker.submit(self.convert, state.prompt, audio)
        state.pending.append(Conversion(seconds, time.monotonic(), future))

    def convert(self, prompt: SpeakerPrompt, audio: np.ndarray) -> np.ndarray:
        """One phrase (float32 at the engine rate) in the target voice, same length."""
        audio_16k = soxr.resample(audio, self.sample_rate, MODEL_RATE)
        tokens = speech_tokens(self.model, audio_16k)
        if not len(tokens):
            return np.zeros(0, np.float32)
        # The whole phrase is known, so the flow attends over all of it, as upstream's
        # non-streaming path does.
        with self.model.reduced():
            mel = flow_mel(
                self.model.flow,
                prompt.flow,
                tokens,
                0,
                len(tokens),
                True,
                None,
                CHUNK_TOKENS,
                False,
            ).float()
        return vocode(self.model.hift, VocoderCache(), mel, final=True)

    def _collect(self, state: VcState) -> None:
        """Move finished conversions, in order, to the audio waiting to be sent."""
        while state.pending and state.pending[0].future.done():
            conversion = state.pending.popleft()
            audio = conversion.future.result()  # a failed conversion raises here: state reset
            conversion.done_at = time.monotonic()
            state.finished = [*state.finished[-9:], conversion]
            state.ready.append(audio)
            state.ready_samples += len(audio)

    def _take(self, state: VcState, count: int) -> np.ndarray:
        taken: list[np.ndarray] = []
        while count > 0 and state.ready:
            head = state.ready[0]
            if len(head) <= count:
                taken.append(state.ready.popleft())
            else:
                taken.append(head[:count])
                state.ready[0] = head[count:]
            count -= len(taken[-1])
            state.ready_samples -= len(taken[-1])
        return np.concatenate(taken) if taken else np.zeros(0, np.float32)
