"""``cosyvoice``: CosyVoice2 text to speech, streamed chunk by chunk, one voice per session.

A session speaks with a built-in speaker (``spk2info.pt``, option ``speaker``) or with a voice
cloned from a prompt clip and its transcript (``set_prompt``, analysed once per session).
Each utterance runs the LLM in a worker thread and turns its tokens into audio as each hop of
the session's own schedule completes (``synthesis.py``); cancelling stops the worker within
one token and drops the utterance's caches.

Streaming text: today the speak pipeline cuts ``speak_delta`` pieces into sentences and
clauses (``media.audio.text``) and calls ``synthesize`` once per piece, so the LLM starts on the
first clause while the rest is still arriving, each clause in a fresh LLM context.
``synthesize_pieces`` is the bistream path (``bistream.py``): one LLM context fed the
pieces as they come, speech starting after the first five text tokens, prosody continuing
across pieces. To use it, the pipeline would hand an utterance's pieces to it through a
blocking iterator (ended by ``flush`` or ``interrupt``) instead of splitting sentences.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from media.engines.base import (
    BARGE_IN_OPTION,
    Capabilities,
    EngineKind,
    OptionSpec,
    SpeakEngine,
)
from media.engines.cosyvoice.batcher import CosyVoiceBatcher, Utterance
from media.engines.cosyvoice.bistream import generate_bistream
from media.engines.cosyvoice.loop_process import LoopProcess, RemoteUtterance
from media.engines.cosyvoice.modeldir import LoadedModel
from media.engines.cosyvoice.prompts import (
    SpeakerPrompt,
    neutral_prompt,
    prompt_from_clip,
    prompt_from_speaker,
    text_ids,
)
from media.engines.cosyvoice.sampling import new_generator
from media.engines.cosyvoice.schedule import (
    FIRST_HOP_MIN_TOKENS,
    MAX_HOP_CHUNKS,
    HopSchedule,
)
from media.engines.cosyvoice.synthesis import UtteranceStream, stream_speech
from media.engines.cosyvoice.tokens import LlmFailed, LlmRequest, TokenStream, generate_tokens
from media.engines.cosyvoice.vocoder import SAMPLES_PER_FRAME

log = logging.getLogger(__name__)

NEUTRAL_SPEAKER = "neutral"  # offered when spk2info.pt has no speakers
PROMPT_SPEAKER = "prompt"  # what ``speaker`` reads after a prompt clip was set
SAMPLES_PER_TOKEN = 2 * SAMPLES_PER_FRAME
RANDOM_SEED = -1


@dataclass(eq=False)
class CosyVoiceState:
    """One session: its voice, its random generator, and the utterance in progress."""

    speaker: str
    prompt: SpeakerPrompt
    generator: torch.Generator
    first_hop_tokens: int
    stream: UtteranceStream | None = None  # the utterance in progress, sequential path
    batched: Utterance | RemoteUtterance | None = None  # the utterance in progress, batched
    # The last utterance, for stats and tests: hops taken, when its first chunk was ready
    # and when synthesis ended (time.monotonic()).
    last_hops: tuple[int, ...] = ()
    first_chunk_at: float | None = None
    finished_at: float | None = None


# What CosyVoice2 was trained to speak: Chinese, English, Japanese, Korean and Cantonese.
COSYVOICE_LANGUAGES = ("zh", "en", "ja", "ko", "yue")


class CosyVoiceEngine(SpeakEngine[CosyVoiceState]):
    """Streaming CosyVoice2 synthesis over a shared, read-only model."""

    def __init__(
        self,
        model: LoadedModel,
        context_tokens: int | None,
        chunk: int,
        batcher: CosyVoiceBatcher | None = None,
    ) -> None:
        self.model = model
        self.context_tokens = context_tokens
        self.chunk = chunk
        self.batcher = batcher
        self.loop_processes: list[LoopProcess] = []  # further batch loops (loop_process.py)
        self._replacing: list[LoopProcess] = []  # dead loops whose replacements are starting
        self._shut = False
        self._speakers = {
            name: prompt_from_speaker(speaker) for name, speaker in model.speakers.items()
        } or {NEUTRAL_SPEAKER: neutral_prompt()}
        self._lock = threading.Lock()
        self._streams = 0
        super().__init__(
            name="cosyvoice",
            kind=EngineKind.SPEAK,
            sample_rate=model.sample_rate,
            hop_size=chunk * MAX_HOP_CHUNKS * SAMPLES_PER_TOKEN,
            delay_ms=0.0,
            description="CosyVoice2 text to speech with zero-shot voice cloning, streamed.",
            capabilities=Capabilities(
                incremental_text=True,
                voice_prompt=True,
                languages=COSYVOICE_LANGUAGES,
                # The batch worker computes the sentences; on a CPU it shares the cores with
                # the engine threads, whose count then also caps the utterances in the batch
                # in a media worker: 8 callers on 2 cores all in the batch at once (tiny
                # model, bench.fairness) slowed each to a real-time factor near 1, their
                # pre-buffers grew to ~1.8 s and first audio went from p50 0.4 s to 1.4-2.5 s.
                own_compute=batcher is not None,
                compute_on_cpu=str(model.device).startswith("cpu"),
            ),
            option_specs=(
                OptionSpec(
                    "speaker",
                    "string",
                    next(iter(self._speakers)),
                    "Built-in speaker (a prompt clip set for the session replaces it).",
                    choices=tuple(self._speakers),
                ),
                OptionSpec(
                    "seed",
                    "integer",
                    RANDOM_SEED,
                    "Seed of the session's token sampling (-1: random), for repeatable speech.",
                    minimum=RANDOM_SEED,
                    maximum=2**31 - 1,
                ),
                OptionSpec(
                    "first_hop_tokens",
                    "integer",
                    FIRST_HOP_MIN_TOKENS,
                    "Speech tokens (40 ms each) the first chunk needs at least: lower is "
                    "sooner, higher gives the first chunk more context.",
                    minimum=4,
                    maximum=4 * chunk,
                ),
                BARGE_IN_OPTION,
            ),
        )

    @property
    def active_streams(self) -> int:
        """Utterances being synthesised right now, across sessions."""
        with self._lock:
            return self._streams

    def add_loops(self, loops: list[LoopProcess]) -> None:
        """Place utterances on ``loops`` too (each a batch loop in a process of its own)."""
        self.loop_processes.extend(loops)

    def _least_loaded(self) -> CosyVoiceBatcher | LoopProcess:
        """The batch loop with the fewest utterances (this process's own on a tie)."""
        assert self.batcher is not None
        loops: list[CosyVoiceBatcher | LoopProcess] = [self.batcher]
        for loop in list(self.loop_processes):
            if loop.alive:
                loops.append(loop)
            else:
                self._replace(loop)
        return min(loops, key=lambda loop: loop.active)

    def _replace(self, dead: LoopProcess) -> None:
        """Start a loop process in place of ``dead``, once; the other loops serve meanwhile."""
        with self._lock:
            if self._shut or dead in self._replacing:
                return
            self._replacing.append(dead)
        threading.Thread(
            target=self._start_replacement, args=(dead,), name="cosyvoice-loop-start", daemon=True
        ).start()

    def _start_replacement(self, dead: LoopProcess) -> None:
        try:
            fresh = LoopProcess(dead.values)
            fresh.wait_ready()
        except (LlmFailed, OSError) as exc:  # tried again at a later placement
            log.warning("a CosyVoice loop process could not be replaced: %s", exc)
            with self._lock:
                self._replacing.remove(dead)
            return
        with self._lock:
            self._replacing.remove(dead)
            shut = self._shut
            if not shut:
                self.loop_processes[self.loop_processes.index(dead)] = fresh
        (fresh if shut else dead).close()
        if not shut:
            log.info("a CosyVoice loop process (pid %d) replaces pid %d", fresh.pid, dead.pid)

    def new_state(self, options: Mapping[str, Any]) -> CosyVoiceState:
        seed = options["seed"]
        return CosyVoiceState(
            speaker=options["speaker"],
            prompt=self._speakers[options["speaker"]],
            generator=new_generator(None if seed == RANDOM_SEED else seed),
            first_hop_tokens=options["first_hop_tokens"],
        )

    def set_prompt(
        self, state: CosyVoiceState, audio: np.ndarray, rate: int, transcript: str
    ) -> None:
        """Clone the voice of ``audio`` (float32 mono at ``rate``) for this session's speech.

        Runs the two front-end models once (~tens of ms per second of audio); raises
        ``PromptError`` for a clip that is too short or long or a missing transcript.
        """
        state.prompt = prompt_from_clip(self.model, audio, rate, transcript)
        state.speaker = PROMPT_SPEAKER

    def synthesize(
        self, state: CosyVoiceState, text: str, cancel: threading.Event
    ) -> Iterator[np.ndarray]:
        ids = text_ids(self.model, text)
        if not len(ids) or cancel.is_set():
            return
        prompt = state.prompt
        request = LlmRequest(text=ids, prompt_text=prompt.text, prompt_tokens=prompt.tokens)
        if self.batcher is not None:
            yield from self._batched(state, request, cancel)
            return
        produce = partial(generate_tokens, self.model.llm, request, state.generator)
        yield from self._stream(state, prompt, produce, cancel)

    def synthesize_pieces(
        self, state: CosyVoiceState, pieces: Iterable[str], cancel: threading.Event
    ) -> Iterator[np.ndarray]:
        """Speak text that is still arriving, in one LLM context (CosyVoice2's bistream).

        ``pieces`` is read by the LLM worker as it needs text and may block between pieces;
        it must end when ``cancel`` is set. Audio starts once the first five text tokens (and
        the prompt, if any) are in.
        """
        if cancel.is_set():
            return
        prompt = state.prompt
        ids = (text_ids(self.model, piece) for piece in pieces)
        produce = partial(
            generate_bistream, self.model.llm, ids, prompt.text, prompt.tokens, state.generator
        )
        yield from self._stream(state, prompt, produce, cancel)

    def _stream(
        self,
        state: CosyVoiceState,
        prompt: SpeakerPrompt,
        produce: Callable[[Callable[[], bool]], Iterator[int]],
        cancel: threading.Event,
    ) -> Iterator[np.ndarray]:
        """Run one utterance: the LLM worker, the hop schedule and the vocoder caches."""
        stream = UtteranceStream(
            tokens=TokenStream(produce, cancel),
            schedule=HopSchedule(self.chunk, prompt.flow.length, state.first_hop_tokens),
        )
        state.stream, state.first_chunk_at, state.finished_at = stream, None, None
        with self._lock:
            self._streams += 1
        stream.tokens.start()
        try:
            for audio in stream_speech(self.model, prompt, stream, self.context_tokens, self.chunk):
                if state.first_chunk_at is None:
                    state.first_chunk_at = time.monotonic()
                yield audio
        finally:
            stream.tokens.close()
            state.last_hops = tuple(stream.schedule.taken)
            state.finished_at = time.monotonic()
            state.stream = None
            with self._lock:
                self._streams -= 1

    def _batched(
        self, state: CosyVoiceState, request: LlmRequest, cancel: threading.Event
    ) -> Iterator[np.ndarray]:
        """Run one utterance in the least-loaded batch loop (``batcher.py``)."""
        schedule = HopSchedule(self.chunk, state.prompt.flow.length, state.first_hop_tokens)
        loop = self._least_loaded()
        utterance = loop.speak(request, state.prompt, state.generator, schedule, cancel)
        state.batched, state.first_chunk_at, state.finished_at = utterance, None, None
        with self._lock:
            self._streams += 1
        try:
            for audio in utterance.audio():
                if state.first_chunk_at is None:
                    state.first_chunk_at = time.monotonic()
                yield audio
        finally:
            utterance.left.set()
            state.last_hops = tuple(schedule.taken)
            state.finished_at = time.monotonic()
            state.batched = None
            with self._lock:
                self._streams -= 1

    def close_state(self, state: CosyVoiceState) -> None:
        stream = state.stream
        if stream is not None:
            stream.tokens.close()
        batched = state.batched
        if batched is not None:
            batched.left.set()

    def shutdown(self) -> None:
        """Stop the batch loops, if any (the model itself is released by the loader)."""
        with self._lock:
            self._shut = True
        if self.batcher is not None:
            self.batcher.close()
        for loop in self.loop_processes:
            loop.close()
