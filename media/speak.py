"""The audio path of one speak session: text in, paced speech out, barge-in on the caller.

    speak / speak_delta / flush -> Utterance queue (FIFO)
      -> synthesis thread: engine.synthesize(state, sentence, cancel) chunk by chunk
      -> resample to 48 kHz -> OutboundAudio (speech is never dropped, only interrupted)
    caller RTP -> AudioReceivePath -> listener: echo canceller (reference: what was sent)
      -> VAD -> speech start while speaking and barge_in on -> interrupt

Each utterance is cut into sentences as its text arrives (``media.text``), so the first
sentence is synthesised and playing while later text is still streaming in. Events follow
the audio actually sent on the track: ``speech_started`` when an utterance's first sample
leaves, ``speech_finished`` when its last one has (or when it is interrupted, with the
position reached).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from media.aec import EchoCanceller
from media.engines.base import SpeakEngine
from media.events import SYNTHESIS_FAILED, EventSink
from media.frames import RTC_RATE
from media.opus import OpusEncoder
from media.outbound import FADE_SECONDS, OutboundAudio
from media.queues import DropOldestQueue
from media.receive import AudioReceivePath, ReceiveStats, install
from media.resample import StreamResampler
from media.stages import SpeakStages, timed_resample
from media.text import SentenceSplitter
from media.tracks import OutboundAudioTrack
from media.vad import SileroVad, SpeechDetector, SpeechEventKind

log = logging.getLogger(__name__)


OUTPUT_BUFFER_SECONDS = 120.0
# Synthesis pauses once this much speech is waiting to be played: a long text costs memory
# in proportion to what is ahead, not to its length, and an interrupt discards little work.
MAX_AHEAD_SECONDS = 20.0
RECENT = 200  # latency samples kept for stats
LISTEN_QUEUE_FRAMES = 25  # caller audio waiting for the echo canceller and VAD, at most
# Utterances waiting to be spoken, at most: with 4000 characters each, minutes of speech
# and a bounded amount of memory, however fast a client sends.
MAX_QUEUED_UTTERANCES = 64
# Barge-in decides on the echo-cancelled caller audio, with two guards measured on
# simulated loudspeaker calls:
# - residual echo: while the canceller converges (or re-converges after the echo path moves)
#   some of our own voice leaks through, and the VAD hears speech at any level. Cleaned audio
#   only counts when it is within ECHO_GATE_DB of our loudest recent output.
# - double talk: AEC3's suppressor mutes the caller's first words while we speak (the caller
#   fell from -25 dBFS to -95 dBFS after cancellation). A raw microphone signal within
#   DOUBLE_TALK_DB of our loudest recent output is louder than any loudspeaker echo of it
#   (a loudspeaker returns our voice 10 dB or more below what we sent), so the VAD hears the
#   raw signal then (a Geigel double-talk detector).
ECHO_GATE_DB = 15.0
DOUBLE_TALK_DB = 12.0
SILENT_DB = -120.0
ECHO_GATE_WINDOW_FRAMES = 25  # 500 ms: the longest echo path the canceller handles


def _level_db(samples: np.ndarray) -> float:
    return float(10 * np.log10(np.mean(np.square(samples)) + 10 ** (SILENT_DB / 10)))


class SpeechQueueFull(Exception):
    """A new utterance found ``MAX_QUEUED_UTTERANCES`` already waiting."""


@dataclass(eq=False)
class Utterance:
    """One thing to say: complete (``speak``) or growing piece by piece (``speak_delta``)."""

    id: str
    splitter: SentenceSplitter = field(default_factory=SentenceSplitter)
    sentences: deque[str] = field(default_factory=deque)
    closed: bool = False  # no more text will come
    more: asyncio.Event = field(default_factory=asyncio.Event)
    streamed: bool = False  # made of speak_delta pieces
    queued_at: float = 0.0  # loop time the first text arrived
    start: int | None = None  # output stream position of the first sample
    end: int | None = None  # set once synthesis is complete
    started: bool = False
    finished: bool = False

    def add(self, text: str) -> None:
        self.sentences.extend(self.splitter.feed(text))
        self.more.set()

    def close(self) -> None:
        self.sentences.extend(self.splitter.flush())
        self.closed = True
        self.more.set()

    async def next_sentence(self) -> str | None:
        """The next sentence to synthesise, waiting for text; None once closed and drained."""
        while not self.sentences:
            if self.closed:
                return None
            self.more.clear()
            await self.more.wait()
        return self.sentences.popleft()


@dataclass
class SpeakStats:
    utterances: int = 0
    interrupted: int = 0
    barge_ins: int = 0
    sentences: int = 0
    synthesis_errors: int = 0
    listen_dropped: int = 0
    synthesis_seconds: float = 0.0  # engine time, excluding waits for room in the buffer
    synthesised_seconds: float = 0.0  # audio produced
    # Recent latencies: text arrived -> its first frame left; interrupt -> track silent.
    first_audio_ms: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))
    interrupt_ms: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))

    @property
    def real_time_factor(self) -> float | None:
        if not self.synthesised_seconds:
            return None
        return self.synthesis_seconds / self.synthesised_seconds

    def describe(self) -> dict[str, Any]:
        return {
            **{k: v for k, v in vars(self).items() if not isinstance(v, deque)},
            "real_time_factor": self.real_time_factor,
            "first_audio_ms": list(self.first_audio_ms),
            "interrupt_ms": list(self.interrupt_ms),
        }


class SpeakPipeline:
    """Speaks queued text on the session's track and stops the moment it is told to."""

    def __init__(
        self,
        engine: SpeakEngine[Any],
        options: Mapping[str, Any],
        state: Any,
        executor: Executor,
        encoder: OpusEncoder,
        emit: EventSink,
        session_id: str = "",
        vad: SileroVad | None = None,
    ) -> None:
        self.engine = engine
        self.options = dict(options)
        self._state = state
        self._executor = executor
        self._emit = emit
        self._session_id = session_id
        self._to_output = StreamResampler(engine.sample_rate, RTC_RATE)
        self.output = OutboundAudio(
            encoder, OUTPUT_BUFFER_SECONDS, max_backlog=None, on_frame=self._on_frame_sent
        )
        self._queue: deque[Utterance] = deque()
        self._queued = asyncio.Event()
        self._open_delta: Utterance | None = None
        self._current: Utterance | None = None
        self._playing: deque[Utterance] = deque()  # synthesised, not yet fully sent
        self._cancel = threading.Event()
        self._room = threading.Event()
        self._room.set()
        self._next_id = 0
        self.stats = SpeakStats()
        self.stages = SpeakStages()
        self._listen: DropOldestQueue[tuple[str, np.ndarray]] = DropOldestQueue(
            LISTEN_QUEUE_FRAMES * 2
        )
        self._vad = vad
        self._vad_state = vad.new_state() if vad is not None else None
        self._detector = SpeechDetector()
        self._aec = EchoCanceller()
        self._reference_levels: deque[float] = deque(maxlen=ECHO_GATE_WINDOW_FRAMES)
        self._receive: AudioReceivePath | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._clock = asyncio.get_running_loop().time
        self._interrupted_at: float | None = None
        # Interrupt to silence on the track, for the last interrupt: the time until the faded
        # frame left plus the fade itself (or until plain silence left, if nothing was queued).
        self.last_interrupt_ms: float | None = None

    @property
    def state(self) -> Any:
        """The engine's state for this session, for engine-specific calls (a voice prompt)."""
        return self._state

    @classmethod
    async def create(
        cls,
        engine: SpeakEngine[Any],
        options: Mapping[str, Any],
        executor: Executor,
        encoder: OpusEncoder,
        emit: EventSink,
        session_id: str = "",
        vad: SileroVad | None = None,
    ) -> SpeakPipeline:
        loop = asyncio.get_running_loop()
        state = await loop.run_in_executor(executor, engine.new_state, options)
        pipeline = cls(engine, options, state, executor, encoder, emit, session_id, vad)
        pipeline._tasks.append(asyncio.create_task(pipeline._speak_loop()))
        return pipeline

    # --- text in -------------------------------------------------------------------------

    def _new_id(self, requested: str | None) -> str:
        if requested is not None:
            return requested
        self._next_id += 1
        return f"u{self._next_id}"

    def speak(self, text: str, utterance_id: str | None = None) -> str:
        """Queue a complete utterance (spoken in full even without final punctuation)."""
        utterance = Utterance(self._new_id(utterance_id))
        utterance.add(text)
        utterance.close()
        self._enqueue(utterance)
        return utterance.id

    def speak_delta(self, piece: str, utterance_id: str | None = None) -> str:
        """Add a streamed piece; sentences are spoken as soon as their boundary arrives."""
        utterance = self._open_delta
        if utterance is None or (utterance_id is not None and utterance_id != utterance.id):
            if utterance is not None:
                utterance.close()
            utterance = Utterance(self._new_id(utterance_id), streamed=True)
            self._enqueue(utterance)
            self._open_delta = utterance
        utterance.add(piece)
        return utterance.id

    def flush(self, utterance_id: str | None = None) -> str | None:
        """Speak the rest of the streamed utterance; returns its id (None if there was none)."""
        utterance = self._open_delta
        if utterance is None or (utterance_id is not None and utterance_id != utterance.id):
            return None
        utterance.close()
        self._open_delta = None
        return utterance.id

    def _enqueue(self, utterance: Utterance) -> None:
        if len(self._queue) >= MAX_QUEUED_UTTERANCES:
            raise SpeechQueueFull(f"{MAX_QUEUED_UTTERANCES} utterances are already waiting")
        utterance.queued_at = self._clock()
        self.stats.utterances += 1
        self._queue.append(utterance)
        self._queued.set()

    # --- synthesis -----------------------------------------------------------------------

    async def _speak_loop(self) -> None:
        while True:
            while not self._queue:
                self._queued.clear()
                await self._queued.wait()
            utterance = self._queue.popleft()
            self._current = utterance
            self._cancel.clear()
            await self._synthesise(utterance)
            self._current = None

    async def _synthesise(self, utterance: Utterance) -> None:
        loop = asyncio.get_running_loop()
        try:
            if utterance.streamed and self.engine.incremental_text:
                await loop.run_in_executor(
                    self._executor, self._synthesise_streamed, loop, utterance
                )
            else:
                while not self._cancel.is_set():
                    sentence = await utterance.next_sentence()
                    if sentence is None or self._cancel.is_set():
                        break
                    await loop.run_in_executor(
                        self._executor, self._synthesise_sentence, loop, utterance, sentence
                    )
        except Exception as exc:
            log.exception("session %s: synthesis failed", self._session_id)
            self.stats.synthesis_errors += 1
            self._emit(
                {
                    "type": "error",
                    "error": SYNTHESIS_FAILED,
                    "message": f"Speech synthesis failed ({type(exc).__name__}); the "
                    "utterance was cut short and the voice state reset.",
                    "id": utterance.id,
                }
            )
            self._state = await loop.run_in_executor(self._executor, self._fresh_state)
        if self._cancel.is_set() or utterance.finished:
            return
        self._output_tail()
        utterance.end = self.output.buffer.written
        if utterance.start is None:  # nothing was spoken (empty text)
            utterance.start = utterance.end
            self._playing.append(utterance)
        self._advance_events()

    def _fresh_state(self) -> Any:
        """Runs in a worker thread: a failed call may have left the state half-updated."""
        self.engine.close_state(self._state)
        return self.engine.new_state(self.options)

    def _synthesise_sentence(
        self, loop: asyncio.AbstractEventLoop, utterance: Utterance, sentence: str
    ) -> None:
        """Runs in a worker thread: one sentence, chunk by chunk."""
        self.stats.sentences += 1
        chunks = self.engine.synthesize(self._state, sentence, self._cancel)
        self._stream_chunks(loop, utterance, chunks)

    def _synthesise_streamed(self, loop: asyncio.AbstractEventLoop, utterance: Utterance) -> None:
        """Runs in a worker thread: a streamed utterance in one model context.

        The thread waits for text as well as for the model, so only engines that read text
        incrementally take this path; others get one sentence at a time.
        """
        sentences = self._sentences_as_they_come(loop, utterance)
        self.stats.sentences += 1
        self._stream_chunks(
            loop, utterance, self.engine.synthesize_pieces(self._state, sentences, self._cancel)
        )

    def _sentences_as_they_come(
        self, loop: asyncio.AbstractEventLoop, utterance: Utterance
    ) -> Iterator[str]:
        """Runs in a worker thread: blocks for each sentence the loop's splitter completes."""
        while not self._cancel.is_set():
            sentence = asyncio.run_coroutine_threadsafe(utterance.next_sentence(), loop).result()
            if sentence is None or self._cancel.is_set():
                return
            yield sentence

    def _stream_chunks(
        self, loop: asyncio.AbstractEventLoop, utterance: Utterance, chunks: Iterator[np.ndarray]
    ) -> None:
        """Hand chunks to the loop as they come, pausing when far ahead; stop on cancel."""
        while True:
            began = time.perf_counter()
            chunk = next(chunks, None)
            spent = time.perf_counter() - began
            self.stats.synthesis_seconds += spent
            if chunk is None or self._cancel.is_set():
                return
            self.stats.synthesised_seconds += len(chunk) / self.engine.sample_rate
            loop.call_soon_threadsafe(self._accept_chunk, utterance, chunk, spent)
            while not self._room.wait(timeout=0.5):
                if self._cancel.is_set():
                    return

    def _accept_chunk(self, utterance: Utterance, chunk: np.ndarray, synthesis: float) -> None:
        if self._cancel.is_set() or utterance.finished or self._closed:
            return
        samples, resample = timed_resample(self._to_output, np.asarray(chunk, dtype=np.float32))
        if utterance.start is None:
            utterance.start = self.output.buffer.written
            self._playing.append(utterance)
        self.output.write(samples)
        self.stages.synthesised(self.output.buffer.written, synthesis, resample, self._clock())
        if self.output.buffered_seconds > MAX_AHEAD_SECONDS:
            self._room.clear()

    def _output_tail(self) -> None:
        """Drain the resampler at the end of an utterance so its last samples are played."""
        tail = self._to_output.process(np.zeros(0, np.float32), last=True)
        self.output.write(tail)
        self.output.complete_frame()
        self.stages.padded(self.output.buffer.written, self._clock())
        self._to_output.reset()

    # --- events follow the audio actually sent ------------------------------------------

    def _on_frame_sent(self, samples: np.ndarray, is_silence: bool) -> None:
        if self._interrupted_at is not None:
            fade = 0.0 if is_silence else FADE_SECONDS
            self.last_interrupt_ms = 1000 * (self._clock() - self._interrupted_at + fade)
            self.stats.interrupt_ms.append(round(self.last_interrupt_ms, 2))
            self.stages.interrupt_to_silence.observe(self.last_interrupt_ms / 1000)
            self._interrupted_at = None
        if not self._room.is_set() and self.output.buffered_seconds < MAX_AHEAD_SECONDS / 2:
            self._room.set()
        if not is_silence:
            pacer = self.output.pacer
            sent, end = self._clock(), self.output.buffer.consumed
            self.stages.departed(end, pacer.ready_at, pacer.taken_at, sent)
        if self._vad is not None:
            self._listen_put("render", samples)
        self._advance_events()

    def _advance_events(self) -> None:
        sent = self.output.buffer.consumed
        while self._playing:
            utterance = self._playing[0]
            assert utterance.start is not None
            silent = utterance.end == utterance.start
            if not utterance.started and (sent > utterance.start or silent):
                utterance.started = True
                self._emit({"type": "speech_started", "id": utterance.id})
                if not silent:
                    first_audio = 1000 * (self._clock() - utterance.queued_at)
                    self.stats.first_audio_ms.append(round(first_audio, 2))
                    self.stages.first_audio.observe(first_audio / 1000)
            if utterance.end is None or sent < utterance.end:
                return
            self._playing.popleft()
            self._finish(utterance, interrupted=False, position=utterance.end - utterance.start)

    def _finish(self, utterance: Utterance, interrupted: bool, position: int) -> None:
        utterance.finished = True
        self._emit(
            {
                "type": "speech_finished",
                "id": utterance.id,
                "position_ms": round(1000 * max(0, position) / RTC_RATE, 1),
                "interrupted": interrupted,
            }
        )

    @property
    def speaking(self) -> bool:
        return bool(self._playing) or self._current is not None

    def interrupt(self) -> int:
        """Stop speaking now: fade out, cancel synthesis, drop everything queued.

        Returns how many utterances were cut or dropped.
        """
        self._cancel.set()
        self._room.set()  # wake a synthesis thread waiting for room, so it sees the cancel
        self._interrupted_at = self._clock()
        sent = self.output.buffer.consumed
        self.output.fade_out()
        self.stages.cleared()
        self._to_output.reset()
        cut = 0
        for utterance in self._playing:
            start = utterance.start if utterance.start is not None else sent
            self._finish(utterance, interrupted=True, position=sent - start)
            cut += 1
        self._playing.clear()
        current, self._current = self._current, None
        if current is not None:
            current.close()  # wakes a synthesis thread waiting for more streamed text
        if current is not None and not current.finished:
            self._finish(current, interrupted=True, position=0)
            cut += 1
        for utterance in self._queue:
            self._finish(utterance, interrupted=True, position=0)
            cut += 1
        self._queue.clear()
        if self._open_delta is not None and not self._open_delta.finished:
            self._finish(self._open_delta, interrupted=True, position=0)
            cut += 1
        self._open_delta = None
        if cut:
            self.stats.interrupted += 1
        return cut

    # --- the caller's audio: barge-in ----------------------------------------------------

    @property
    def track(self) -> OutboundAudioTrack:
        """The current connection's outgoing track."""
        return self.output.track

    def attach(self, receiver: Any) -> OutboundAudioTrack:
        """Listen to the caller (for barge-in); return the track to speak on.

        A resumed session attaches again: queued speech and its position carry on.
        """
        first = self._receive is None
        if self._receive is not None:
            self._receive.close()
        self._receive = AudioReceivePath(self._on_caller_frame)
        install(receiver, self._receive)
        if first and self._vad is not None:
            self._tasks.append(asyncio.create_task(self._listen_loop()))
        return self.output.new_track()

    @property
    def receive_stats(self) -> ReceiveStats:
        return self._receive.stats if self._receive is not None else ReceiveStats()

    def _on_caller_frame(self, pcm: np.ndarray) -> None:
        if self._vad is not None:
            self._listen_put("capture", pcm)

    def _listen_put(self, kind: str, samples: np.ndarray) -> None:
        if not self._listen.put((kind, samples.copy())):
            self.stats.listen_dropped += 1

    async def _listen_loop(self) -> None:
        """Echo-cancel and run the VAD off the loop, a batch of queued frames per call."""
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._listen.get()]
            while len(self._listen):
                batch.append(await self._listen.get())
            started = await loop.run_in_executor(self._executor, self._detect_speech, batch)
            if started and self.options.get("barge_in", True) and self.speaking:
                self.stats.barge_ins += 1
                self._emit({"type": "barge_in"})
                self.interrupt()

    def _detect_speech(self, batch: list[tuple[str, np.ndarray]]) -> bool:
        """Runs in a worker thread; True when the caller started talking in this batch."""
        assert self._vad is not None and self._vad_state is not None
        started = False
        for kind, samples in batch:
            if kind == "render":
                self._aec.render(samples)
                self._reference_levels.append(_level_db(samples))
                continue
            cleaned = self._aec.capture(samples)
            loudest = self._loudest_reference()
            double_talk = _level_db(samples) >= loudest - DOUBLE_TALK_DB
            probabilities = self._vad.process(self._vad_state, samples if double_talk else cleaned)
            if not double_talk and _level_db(cleaned) < loudest - ECHO_GATE_DB:
                probabilities = [0.0] * len(probabilities)
            for event in self._detector.update(probabilities):
                started |= event.kind is SpeechEventKind.START
        return started

    def _loudest_reference(self) -> float:
        """Our loudest output frame within the echo window (silence when we said nothing)."""
        return max(self._reference_levels, default=SILENT_DB)

    # --- lifecycle -----------------------------------------------------------------------

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._cancel.set()
        self._room.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        self.output.close()
        if self._receive is not None:
            self._receive.close()
        self._listen.clear()
        self._queue.clear()
        self._playing.clear()
        self.engine.close_state(self._state)
