"""The audio path of one speak session: text in, paced speech out, barge-in on the caller.

speak / speak_delta / flush -> UtteranceQueue (FIFO)
  -> SynthesisBridge: engine.synthesize(state, sentence, cancel) chunk by chunk, on the
     session's engine queue
  -> resample to 48 kHz -> OutboundAudio (speech is never dropped, only interrupted); an
     utterance starts playing once its pre-buffer is ready (``PreBuffer``: sized from the
     engine's measured real-time factor, so a slow engine does not stutter mid-sentence),
     and a chunk late all the same is bridged by expanding the speech before it (counted)
  -> SpeechTimeline: events as the audio leaves
caller audio -> BargeInListener: echo canceller (reference: what was sent) -> VAD
  -> speech start while speaking and barge_in on -> interrupt
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from concurrent.futures import Executor
from typing import Any

import numpy as np

from media.audio.frames import RTC_RATE
from media.audio.languages import foreign_scripts
from media.audio.opus import OpusEncoder
from media.audio.resample import StreamResampler
from media.engines.base import SpeakEngine
from media.pipeline.base import Pipeline, PipelineCounters
from media.pipeline.events import SYNTHESIS_FAILED, EventSink
from media.pipeline.outbound import FADE_SECONDS, OutboundAudio
from media.pipeline.pacing import OutputCushion
from media.pipeline.shared_vad import SharedVad
from media.pipeline.speak.bargein import BargeInListener
from media.pipeline.speak.prebuffer import PreBuffer
from media.pipeline.speak.stats import SpeakStats
from media.pipeline.speak.synthesis import SynthesisBridge
from media.pipeline.speak.timeline import SpeechTimeline
from media.pipeline.speak.utterances import Utterance, UtteranceQueue
from media.pipeline.stages import DurationHistogram, SpeakStages, timed_resample

log = logging.getLogger(__name__)

OUTPUT_BUFFER_SECONDS = 120.0
# Synthesis pauses once this much speech is waiting to be played: a long text costs memory
# in proportion to what is ahead, not to its length, and an interrupt discards little work.
MAX_AHEAD_SECONDS = 20.0


class UnsupportedLanguage(Exception):
    """Text in a script the engine's declared languages are not written in."""

    def __init__(self, engine: str, languages: tuple[str, ...], scripts: list[str]) -> None:
        super().__init__(f"engine {engine!r} speaks {', '.join(languages)}")
        self.engine = engine
        self.languages = languages
        self.scripts = scripts


class SpeakPipeline(Pipeline):
    """Speaks queued text on the session's output and stops the moment it is told to."""

    engine: SpeakEngine[Any]
    stages: SpeakStages

    def __init__(
        self,
        engine: SpeakEngine[Any],
        options: Mapping[str, Any],
        state: Any,
        executor: Executor,
        encoder: OpusEncoder,
        emit: EventSink,
        session_id: str = "",
        vad: SharedVad | None = None,
    ) -> None:
        cushion = OutputCushion(adaptive=False, expecting=self._mid_utterance)
        output = OutboundAudio(
            encoder,
            OUTPUT_BUFFER_SECONDS,
            max_backlog=None,
            on_frame=self._on_frame_sent,
            cushion=cushion,
        )
        super().__init__(engine, options, state, executor, emit, session_id, output)
        self._cushion = cushion
        self._to_output = StreamResampler(engine.sample_rate, RTC_RATE)
        self.stats = SpeakStats()
        self.stages = SpeakStages()
        self._utterances = UtteranceQueue(self._clock)
        self._current: Utterance | None = None
        self._timeline = SpeechTimeline(emit, self._clock, self.stats, self.stages)
        self._synthesis = SynthesisBridge(
            engine, self._engine_calls, self.stats, self._accept, self._waiting_to_play
        )
        self._listener = (
            BargeInListener(vad.open(), executor, self.stats) if vad is not None else None
        )
        self._prebuffer = PreBuffer(engine, self.stats)
        self._interrupted_at: float | None = None
        # Interrupt to silence on the track, for the last interrupt: the time until the faded
        # frame left plus the fade itself (or until plain silence left, if nothing was queued).
        self.last_interrupt_ms: float | None = None

    def _started(self) -> None:
        self._tasks.append(asyncio.create_task(self._speak_loop()))

    # --- text in -------------------------------------------------------------------------

    def speak(self, text: str, utterance_id: str | None = None) -> str:
        """Queue a complete utterance (spoken in full even without final punctuation)."""
        self._check_language(text)
        return self._counted(self._utterances.speak(text, utterance_id))

    def speak_delta(self, piece: str, utterance_id: str | None = None) -> str:
        """Add a streamed piece; sentences are spoken as soon as their boundary arrives."""
        self._check_language(piece)
        return self._counted(self._utterances.speak_delta(piece, utterance_id))

    def _check_language(self, text: str) -> None:
        """Refuse text the engine cannot speak, rather than read it out as noise."""
        languages = self.engine.capabilities.languages
        scripts = foreign_scripts(text, languages)
        if scripts:
            raise UnsupportedLanguage(self.engine.name, languages, scripts)

    def flush(self, utterance_id: str | None = None) -> str | None:
        """Speak the rest of the streamed utterance; returns its id (None if there was none)."""
        return self._utterances.flush(utterance_id)

    def _counted(self, utterance_id: str) -> str:
        self.stats.utterances = self._utterances.added
        return utterance_id

    # --- synthesis -----------------------------------------------------------------------

    async def _speak_loop(self) -> None:
        while True:
            utterance = await self._utterances.next()
            self._current = utterance
            self._synthesis.cancel.clear()
            await self._synthesise(utterance)
            self._current = None

    async def _synthesise(self, utterance: Utterance) -> None:
        loop = asyncio.get_running_loop()
        try:
            await self._synthesis.speak(utterance, self._state)
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
            self._state = await loop.run_in_executor(self._engine_calls, self._fresh_state)
        if self._synthesis.cancel.is_set() or utterance.finished:
            return
        self.output.pacer.release()  # all of it is there: nothing left to wait for
        self._output_tail()
        utterance.end = self.output.buffer.written
        if utterance.start is None:  # nothing was spoken (empty text)
            self._timeline.begins_at(utterance, utterance.end)
        self._timeline.advance(self.output.buffer.consumed)

    def _fresh_state(self) -> Any:
        """Runs in a worker thread: a failed call may have left the state half-updated."""
        self.engine.close_state(self._state)
        return self.engine.new_state(self.options)

    def _accept(self, utterance: Utterance, chunk: np.ndarray, synthesis: float) -> None:
        """One synthesised chunk goes to the output, unless it is too late."""
        if self._synthesis.cancel.is_set() or utterance.finished or self._closed:
            return
        samples, resample = timed_resample(self._to_output, np.asarray(chunk, dtype=np.float32))
        first = utterance.start is None
        if first:
            self._timeline.begins_at(utterance, self.output.buffer.written)
        assert utterance.start is not None
        utterance.synthesised += len(chunk) / self.engine.sample_rate
        needed = self._prebuffer.needed(utterance, len(chunk) / self.engine.sample_rate)
        pacer = self.output.pacer
        if first or pacer.holding:
            buffered = self.output.buffer.written + len(samples) - utterance.start
            if needed > buffered:
                pacer.hold(utterance.start, utterance.start + needed)
            else:
                pacer.release()
        self.output.write(samples)
        self.stages.synthesised(self.output.buffer.written, synthesis, resample, self._clock())
        if self.output.buffered_seconds > MAX_AHEAD_SECONDS:
            self._synthesis.room.clear()

    def _waiting_to_play(self, utterance: Utterance) -> bool:
        """Nothing of ``utterance`` is made yet, or its pre-buffer holds it back: the
        listener waits for these chunks (first audio), not for later ones."""
        pacer = self.output.pacer
        return utterance.start is None or (pacer.holding and pacer.held_at == utterance.start)

    def _output_tail(self) -> None:
        """Drain the resampler at the end of an utterance so its last samples are played."""
        tail = self._to_output.process(np.zeros(0, np.float32), last=True)
        self.output.write(tail)
        self.output.end_stream()
        self.stages.padded(self.output.buffer.written, self._clock())
        self._to_output.reset()

    # --- audio out -----------------------------------------------------------------------

    def _mid_utterance(self) -> bool:
        """An utterance is being played and more of it is still being made."""
        current = self._current
        return (
            current is not None
            and current.start is not None
            and self.output.buffer.consumed > current.start
            and not self._synthesis.cancel.is_set()
        )

    def _on_frame_sent(self, samples: np.ndarray, is_silence: bool) -> None:
        self.stats.underruns = self._cushion.late_slots
        if self._interrupted_at is not None:
            # Silent at the listener once the fade (if this frame had any audio) and the
            # encoder's lookahead, which carries the end of the last audio, are through.
            fade = FADE_SECONDS if np.any(samples) else 0.0
            lookahead = self.output.encoder.lookahead_samples / RTC_RATE
            self.last_interrupt_ms = 1000 * (
                self._clock() - self._interrupted_at + fade + lookahead
            )
            self.stats.interrupt_ms.append(round(self.last_interrupt_ms, 2))
            self.stages.interrupt_to_silence.observe(self.last_interrupt_ms / 1000)
            self._interrupted_at = None
        room = self._synthesis.room
        if not room.is_set() and self.output.buffered_seconds < MAX_AHEAD_SECONDS / 2:
            room.set()
        if not is_silence:
            pacer = self.output.pacer
            sent, end = self._clock(), self.output.buffer.consumed
            self.stages.departed(end, pacer.ready_at, pacer.taken_at, sent)
        if self._listener is not None:
            self._listener.sent(samples)
        self._timeline.advance(self.output.buffer.consumed)

    @property
    def speaking(self) -> bool:
        return self._timeline.busy or self._current is not None

    def interrupt(self) -> int:
        """Stop speaking now: fade out, cancel synthesis, drop everything queued.

        Returns how many utterances were cut or dropped.
        """
        self._synthesis.stop()
        self._interrupted_at = self._clock()
        sent = self.output.buffer.consumed
        self.output.fade_out()
        self.stages.cleared()
        self._to_output.reset()
        cut = self._timeline.cut(sent)
        current, self._current = self._current, None
        if current is not None:
            current.close()  # wakes a synthesis thread waiting for more streamed text
        if current is not None and not current.finished:
            self._timeline.finish(current, interrupted=True, position=0)
            cut += 1
        for utterance in self._utterances.drop_all():
            self._timeline.finish(utterance, interrupted=True, position=0)
            cut += 1
        if cut:
            self.stats.interrupted += 1
        return cut

    # --- the caller's audio: barge-in ----------------------------------------------------

    def _on_attach(self, first: bool) -> None:
        if first and self._listener is not None:
            self._tasks.append(asyncio.create_task(self._listener.listen(self._barge_in)))

    def feed(self, pcm: np.ndarray) -> None:
        if self._listener is not None:
            self._listener.heard(pcm)

    def _barge_in(self) -> None:
        if self.options.get("barge_in", True) and self.speaking:
            self.stats.barge_ins += 1
            self._emit({"type": "barge_in"})
            self.interrupt()

    # --- what the server reads -----------------------------------------------------------

    @property
    def text_input(self) -> SpeakPipeline:
        return self

    def counters(self) -> PipelineCounters:
        return PipelineCounters(
            input_dropped=0,
            engine_errors=self.stats.synthesis_errors,
            in_to_out_recent_ms=None,
            input_queued=None,
        )

    def stats_fields(self) -> dict[str, Any]:
        first_audio = self.stats.first_audio_ms
        return {
            "in_to_out_ms": None,
            "frames_in": self.receive_stats.frames,
            "first_audio_ms": first_audio[-1] if first_audio else None,
        }

    def describe(self) -> dict[str, Any]:
        return {"speak": self.stats.describe()}

    def histograms(self) -> dict[str, DurationHistogram]:
        return {
            "engine_call_seconds": self.stages.synthesis,
            "tts_first_audio_seconds": self.stages.first_audio,
            "tts_interrupt_to_silence_seconds": self.stages.interrupt_to_silence,
        }

    # --- the end -------------------------------------------------------------------------

    def _stopping(self) -> None:
        self._synthesis.stop()

    def _release(self) -> None:
        if self._listener is not None:
            self._listener.close()
        self._utterances.clear()
        self._timeline.clear()
