"""The audio path of one transform session, from incoming RTP to the outgoing track.

    transport input (RTP: reorder, conceal, decode to float32 mono) -> feed()
      -> resample to the engine rate -> DropOldestQueue
      -> engine worker: the session's serial queue on the pool, inline for trivial engines,
         or the engine's tick scheduler for batched ones (one model call for all sessions)
      -> resample to 48 kHz -> OutboundAudio (ring buffer, pacer with a cushion, Opus)
      -> transport

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
from statistics import fmean
from typing import Any

import numpy as np

from media.audio.frames import FRAME_SAMPLES, RTC_RATE
from media.audio.opus import OpusEncoder
from media.audio.queues import DropOldestQueue
from media.audio.resample import StreamResampler
from media.engines.base import BatchedTransformEngine, TransformEngine
from media.pipeline.base import Pipeline, PipelineCounters
from media.pipeline.events import ENGINE_FAILED, EventSink
from media.pipeline.latency import InToOutMeter
from media.pipeline.outbound import OutboundAudio
from media.pipeline.pacing import InputStall, OutputCushion
from media.pipeline.stages import DurationHistogram, TransformStages, timed_resample

log = logging.getLogger(__name__)

# Input waiting for the engine, at most: 320 ms, what a relayed stall releases at once.
INPUT_QUEUE_FRAMES = 16
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


class TransformPipeline(Pipeline):
    """Runs one session's audio through a transform engine and paces the result out."""

    engine: TransformEngine[Any]
    stages: TransformStages

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
        hop_at_48k = int(np.ceil(engine.hop_size * RTC_RATE / engine.sample_rate))
        output = OutboundAudio(
            encoder,
            capacity_seconds=OUTPUT_BUFFER_SECONDS,
            max_backlog=max(TRANSFORM_BACKLOG_FRAMES * FRAME_SAMPLES, hop_at_48k + FRAME_SAMPLES),
            on_frame=self._on_frame_sent,
            # A late hop is expanded, not a silent slot, and the cushion it leaves is shed
            # by acceleration; the cushion is small (pacing.CUSHION_CEILING_S), since the
            # receive path before it already absorbs the network's jitter.
            cushion=OutputCushion(),
        )
        super().__init__(engine, options, state, executor, emit or _ignore, session_id, output)
        self._to_engine = StreamResampler(RTC_RATE, engine.sample_rate)
        self._from_engine = StreamResampler(engine.sample_rate, RTC_RATE)
        self._input_queue: DropOldestQueue[np.ndarray] = DropOldestQueue(INPUT_QUEUE_FRAMES)
        self.latency = InToOutMeter()
        self.stages = TransformStages()
        self.pacer = self.output.pacer
        self._frames_in = 0
        self._engine_calls_done = 0
        self._engine_errors = 0
        self._inflight: Future[tuple[np.ndarray, Any]] | None = None
        # An inline engine's recovery from a failed call, while it runs (see _run_inline).
        self._recovering: asyncio.Task[None] | None = None

    def _on_attach(self, first: bool) -> None:
        self.pacer.input_stall(InputStall.GIVEN_UP)  # the replaced input's stall is not waited for
        if not self._tasks and not self.engine.runs_inline:
            name = f"engine-{self._session_id[:8]}"
            self._tasks = [asyncio.create_task(self._work(), name=name)]

    def feed(self, pcm: np.ndarray) -> None:
        """One decoded frame (48 kHz float32 mono) from the receive path."""
        self._frames_in += 1
        fed = self._clock()
        arrived = self._arrived_at if self._input is not None else fed
        self.latency.arrived(len(pcm), arrived)
        chunk, resample = timed_resample(self._to_engine, pcm)
        evicted = self._input_queue.push(chunk)
        self.stages.pushed(len(pcm), arrived, fed, resample, self._clock())
        if evicted is not None:
            self.latency.dropped(self.stages.evicted(), taken=self.stages.taken)
        if self.engine.runs_inline and self._recovering is None:
            self._run_inline()

    relays_input_stalls = True

    def input_stalled(self, edge: InputStall) -> None:
        """The pacer waits with the input: the stall reaches the listener, not a fill."""
        super().input_stalled(edge)
        self.pacer.input_stall(edge)

    def _on_frame_sent(self, samples: np.ndarray, is_silence: bool) -> None:
        if not is_silence:
            sent, end = self._clock(), self.output.buffer.consumed
            in_to_out = self.latency.departed(end, sent)
            self.stages.departed(end, self.pacer.ready_at, self.pacer.taken_at, sent, in_to_out)

    # --- what the server reads -----------------------------------------------------------

    @property
    def stats(self) -> PipelineStats:
        return PipelineStats(
            frames_in=self._frames_in,
            input_dropped=self._input_queue.dropped,
            engine_calls=self._engine_calls_done,
            engine_errors=self._engine_errors,
            frames_out=self.output.frames_sent,
            underruns=self.pacer.underruns,
            backlog_dropped_ms=1000 * self.pacer.backlog_dropped / RTC_RATE,
        )

    def counters(self) -> PipelineCounters:
        recent = self.latency.recent
        return PipelineCounters(
            input_dropped=self._input_queue.dropped,
            engine_errors=self._engine_errors,
            # The last second's mean: a list of many sessions cannot afford a median each.
            in_to_out_recent_ms=round(1000 * fmean(recent), 2) if recent else None,
            input_queued=self.stages.queued,
        )

    def stats_fields(self) -> dict[str, Any]:
        stats = self.stats
        return {
            **self.latency.summary_ms(),
            "frames_in": stats.frames_in,
            "input_dropped": stats.input_dropped,
            "backlog_dropped_ms": stats.backlog_dropped_ms,
            "engine_errors": stats.engine_errors,
        }

    def describe(self) -> dict[str, Any]:
        return {"pipeline": vars(self.stats)}

    def histograms(self) -> dict[str, DurationHistogram]:
        return {
            "engine_call_seconds": self.stages.engine_calls,
            "in_to_out_seconds": self.stages.in_to_out,
        }

    # --- the engine ----------------------------------------------------------------------

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            chunk = await self._input_queue.get()
            self.stages.dequeued(self._clock())
            try:
                if isinstance(self.engine, BatchedTransformEngine):
                    # The engine's scheduler thread runs it with other sessions' hops.
                    out = await asyncio.wrap_future(self.engine.submit(self._state, chunk))
                else:
                    self._inflight = self._engine_calls.submit(
                        self.engine.process, self._state, chunk
                    )
                    out, self._state = await asyncio.wrap_future(self._inflight)
                    self._inflight = None
            except Exception as exc:
                self._count_failure()
                await self._recover(loop, chunk, exc)
                self._stage_produced(self._clock(), 0.0)
                continue
            self._produced(out)

    def _run_inline(self) -> None:
        """Run an inline engine on what is queued, in the callback that fed it.

        The frame goes on to the output at once, where a worker task would be woken for
        every frame. A failed call's recovery resets the state off the loop, as a task;
        the chunks that come meanwhile wait for it in the queue, in order.
        """
        while self._input_queue:
            chunk = self._input_queue.pop()
            self.stages.dequeued(self._clock())
            try:
                out, self._state = self.engine.process(self._state, chunk)
            except Exception as exc:
                self._count_failure()
                self._recovering = asyncio.create_task(self._recover_inline(chunk, exc))
                self._tasks.append(self._recovering)
                return
            self._produced(out)

    async def _recover_inline(self, chunk: np.ndarray, error: Exception) -> None:
        try:
            await self._recover(asyncio.get_running_loop(), chunk, error)
            self._stage_produced(self._clock(), 0.0)
        finally:
            if self._recovering in self._tasks:
                self._tasks.remove(self._recovering)
            self._recovering = None
        self._run_inline()

    def _count_failure(self) -> None:
        log.exception("session %s: engine %s failed", self._session_id, self.engine.name)
        self._engine_errors += 1

    def _produced(self, out: np.ndarray) -> None:
        done = self._clock()
        self._engine_calls_done += 1
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
        self._inflight = None
        silence = round(len(chunk) * RTC_RATE / self.engine.sample_rate)
        self.output.write(np.zeros(silence, np.float32))
        self._emit(
            {
                "type": "error",
                "error": ENGINE_FAILED,
                "message": f"Engine '{self.engine.name}' failed ({type(error).__name__}); "
                "its state was reset and the call goes on.",
            }
        )
        self._state = await loop.run_in_executor(
            self._engine_calls, self.engine.reset_state, self._state, self.options
        )
        self._from_engine.reset()

    async def _finish_engine_work(self) -> None:
        """Keep the state an engine call left running by the cancelled worker returns."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None and not inflight.cancelled():
            try:
                _, self._state = await asyncio.wrap_future(inflight)
            except Exception:  # the call's own failure no longer matters: the state is going
                log.debug("session %s: engine call failed during close", self._session_id)
        await super()._finish_engine_work()

    def _release(self) -> None:
        self._input_queue.clear()


def _ignore(event: dict[str, Any]) -> None:
    """The event sink of a pipeline nobody listens to (benchmarks, tests)."""
