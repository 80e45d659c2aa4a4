"""The audio path of one transform session, from incoming RTP to the outgoing track.

    RTP -> AudioReceivePath (reorder, conceal, decode to float32 mono) -> feed()
      -> resample to the engine rate -> DropOldestQueue
      -> engine worker (thread pool, or inline for trivial engines)
      -> resample to 48 kHz -> RingBuffer -> FramePacer -> OutboundAudioTrack (Opus)

Frames enter synchronously from the receive path, so the only place backlog can build is
the bounded queue, where it is dropped and counted. One worker task per session calls the
engine sequentially: the state is never touched by two threads at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from media.engines.base import TransformEngine
from media.events import ENGINE_FAILED, EventSink
from media.frames import FRAME_SAMPLES, RTC_RATE
from media.latency import InToOutMeter
from media.opus import OpusEncoder
from media.outbound import OutboundAudio
from media.queues import DropOldestQueue
from media.receive import AudioReceivePath, ReceiveStats, install
from media.resample import StreamResampler
from media.stages import TransformStages, timed_resample
from media.tracks import OutboundAudioTrack

log = logging.getLogger(__name__)

INPUT_QUEUE_FRAMES = 8  # 160 ms of input waiting for the engine, at most
OUTPUT_BUFFER_SECONDS = 2.0
# A transform may hold at most this much audio beyond the frame being sent; more means the
# input arrived in a burst after a stall, and playing it late is worse than dropping it.
TRANSFORM_BACKLOG_FRAMES = 2


@dataclass
class PipelineStats:
    frames_in: int = 0
    input_dropped: int = 0
    engine_calls: int = 0
    engine_errors: int = 0
    frames_out: int = 0
    underruns: int = 0
    backlog_dropped_ms: float = 0.0


class TransformPipeline:
    """Runs one session's audio through a transform engine and paces the result out."""

    def __init__(
        self,
        engine: TransformEngine[Any],
        options: Mapping[str, Any],
        state: Any,
        executor: Executor,
        encoder: OpusEncoder,
        session_id: str = "",
        emit: EventSink | None = None,
    ) -> None:
        self.engine = engine
        self._emit = emit
        self.options = dict(options)
        self._state = state
        self._executor = executor
        self._session_id = session_id
        self._to_engine = StreamResampler(RTC_RATE, engine.sample_rate)
        self._from_engine = StreamResampler(engine.sample_rate, RTC_RATE)
        self._input: DropOldestQueue[np.ndarray] = DropOldestQueue(INPUT_QUEUE_FRAMES)
        hop_at_48k = int(np.ceil(engine.hop_size * RTC_RATE / engine.sample_rate))
        self.output = OutboundAudio(
            encoder,
            capacity_seconds=OUTPUT_BUFFER_SECONDS,
            max_backlog=max(TRANSFORM_BACKLOG_FRAMES * FRAME_SAMPLES, hop_at_48k + FRAME_SAMPLES),
            on_frame=self._on_frame_sent,
        )
        self.latency = InToOutMeter()
        self.stages = TransformStages()
        self._clock = asyncio.get_running_loop().time
        self.pacer = self.output.pacer
        self._receive: AudioReceivePath | None = None
        self._frames_in = 0
        self._engine_calls = 0
        self._engine_errors = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._inflight: Future[tuple[np.ndarray, Any]] | None = None
        self._closed = False

    @property
    def state(self) -> Any:
        """The engine's state for this session, for engine-specific calls (a voice prompt)."""
        return self._state

    @classmethod
    async def create(
        cls,
        engine: TransformEngine[Any],
        options: Mapping[str, Any],
        executor: Executor,
        encoder: OpusEncoder,
        session_id: str = "",
        emit: EventSink | None = None,
    ) -> TransformPipeline:
        """Build a pipeline; the state is made off the loop (a cold state can take ~0.5 s)."""
        loop = asyncio.get_running_loop()
        state = await loop.run_in_executor(executor, engine.new_state, options)
        return cls(engine, options, state, executor, encoder, session_id, emit)

    @property
    def track(self) -> OutboundAudioTrack:
        """The current connection's outgoing track."""
        return self.output.track

    def attach(self, receiver: Any) -> OutboundAudioTrack:
        """Take the audio of an aiortc ``RTCRtpReceiver``; return the track to send back.

        A resumed session attaches again, to its new connection: the engine state, queues
        and output buffer carry on; only the receive path and the track are new.
        """
        if self._receive is not None:
            self._receive.close()
        self._receive = AudioReceivePath(self.feed)
        install(receiver, self._receive)
        if not self._tasks:
            name = f"engine-{self._session_id[:8]}"
            self._tasks = [asyncio.create_task(self._work(), name=name)]
        return self.output.new_track()

    def feed(self, pcm: np.ndarray) -> None:
        """One decoded frame (48 kHz float32 mono) from the receive path."""
        self._frames_in += 1
        fed = self._clock()
        arrived = self._receive.arrived_at if self._receive is not None else fed
        self.latency.arrived(len(pcm), arrived)
        chunk, resample = timed_resample(self._to_engine, pcm)
        evicted = self._input.push(chunk)
        self.stages.pushed(len(pcm), arrived, fed, resample, self._clock())
        if evicted is not None:
            self.latency.dropped(self.stages.evicted(), taken=self.stages.taken)

    def _on_frame_sent(self, samples: np.ndarray, is_silence: bool) -> None:
        if not is_silence:
            sent, end = self._clock(), self.output.buffer.consumed
            in_to_out = self.latency.departed(end, sent)
            self.stages.departed(end, self.pacer.ready_at, self.pacer.taken_at, sent, in_to_out)

    @property
    def receive_stats(self) -> ReceiveStats:
        return self._receive.stats if self._receive is not None else ReceiveStats()

    @property
    def stats(self) -> PipelineStats:
        return PipelineStats(
            frames_in=self._frames_in,
            input_dropped=self._input.dropped,
            engine_calls=self._engine_calls,
            engine_errors=self._engine_errors,
            frames_out=self.output.frames_sent,
            underruns=self.pacer.underruns,
            backlog_dropped_ms=1000 * self.pacer.backlog_dropped / RTC_RATE,
        )

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            chunk = await self._input.get()
            self.stages.dequeued(self._clock())
            try:
                if self.engine.runs_inline:
                    out, self._state = self.engine.process(self._state, chunk)
                else:
                    self._inflight = self._executor.submit(self.engine.process, self._state, chunk)
                    out, self._state = await asyncio.wrap_future(self._inflight)
            except Exception as exc:
                log.exception("session %s: engine %s failed", self._session_id, self.engine.name)
                self._engine_errors += 1
                await self._recover(loop, chunk, exc)
                self._stage_produced(self._clock(), 0.0)
                continue
            done = self._clock()
            self._engine_calls += 1
            resample = 0.0
            if len(out):
                samples, resample = timed_resample(self._from_engine, out)
                self.output.write(samples)
            self._stage_produced(done, resample)

    def _stage_produced(self, done: float, resample: float) -> None:
        self.stages.produced(done, resample, self.output.buffer.written, self._clock())

    async def _recover(
        self, loop: asyncio.AbstractEventLoop, chunk: np.ndarray, error: Exception
    ) -> None:
        """Replace a failed state, play silence for the lost chunk, and say so; go on.

        The silence keeps the output's timing (the listener hears a short gap, not a skip),
        and the event lets the client and the circuit breaker know.
        """
        silence = round(len(chunk) * RTC_RATE / self.engine.sample_rate)
        self.output.write(np.zeros(silence, np.float32))
        if self._emit is not None:
            self._emit(
                {
                    "type": "error",
                    "error": ENGINE_FAILED,
                    "message": f"Engine '{self.engine.name}' failed ({type(error).__name__}); "
                    "its state was reset and the call goes on.",
                }
            )
        self._state = await loop.run_in_executor(
            self._executor, self.engine.reset_state, self._state, self.options
        )
        self._from_engine.reset()

    async def _finish_inflight_call(self) -> None:
        """Wait out an engine call that a cancelled worker left running in a thread.

        Cancelling the worker task does not stop the thread, and freeing the state under a
        running native call would corrupt memory.
        """
        inflight, self._inflight = self._inflight, None
        if inflight is None or inflight.cancelled():
            return
        try:
            _, self._state = await asyncio.wrap_future(inflight)
        except Exception:  # the call's own failure no longer matters: the state is going
            log.debug("session %s: engine call failed during close", self._session_id)

    async def close(self) -> None:
        """Stop the tasks, end the track and release the engine state and buffers."""
        if self._closed:
            return
        self._closed = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self._finish_inflight_call()
        self.output.close()
        if self._receive is not None:
            self._receive.close()
        self._input.clear()
        self.engine.close_state(self._state)
        self._state = None
