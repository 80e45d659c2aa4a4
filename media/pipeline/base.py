"""What every session's audio path is, whatever its kind: the ``Pipeline`` base.

A pipeline owns one engine state, the session's output (``OutboundAudio``) and the tasks
that move audio between them. Transports attach to it: each connection brings an input
(``AudioInput``, e.g. the RTP receive path) that calls :meth:`Pipeline.feed` with decoded
frames, and reads the paced, encoded output. A session survives its connections: a resumed
one attaches again, and the state, queues and output carry on.

The server sees pipelines only through this class: it attaches, reads a snapshot of
counters, asks for the kind's own description, and closes. What differs between the kinds
(``TransformPipeline``, ``SpeakPipeline``) lives in their modules.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from media.audio.frames import RTC_RATE
from media.engines.base import Engine, EngineError
from media.pipeline.events import EventSink
from media.pipeline.executor import SerialExecutor
from media.pipeline.outbound import OutboundAudio
from media.pipeline.pacing import InputStall
from media.pipeline.stages import DurationHistogram, StageWindow

log = logging.getLogger(__name__)

PipelineT = TypeVar("PipelineT", bound="Pipeline")


@dataclass
class ReceiveStats:
    """What a connection's input counted: packets, decoded frames, and how it coped."""

    packets: int = 0
    frames: int = 0
    late_dropped: int = 0
    duplicates: int = 0
    concealed: int = 0
    recovered_fec: int = 0
    skipped: int = 0
    over_real_time: int = 0  # packets beyond real time, dropped before decoding
    margin_ms: float = 0.0  # the playout delay the target asks for (beyond one frame)
    jitter_ms: float = 0.0
    undecodable: int = 0  # packets that were not decodable audio (concealed as lost)
    target_ms: float = 0.0  # the target playout delay, from the arrival statistics
    delay_ms: float = 0.0  # the playout delay now (behind the earliest expected arrival)
    expanded_ms: float = 0.0  # audio made up by expansion while packets were late or lost
    accelerated_ms: float = 0.0  # audio cut by acceleration to shed delay
    preemptive_ms: float = 0.0  # audio repeated by preemptive expansion to add delay
    dropped_ms: float = 0.0  # decoded audio dropped beyond the buffer's bound
    skipped_slots: int = 0  # output slots lost to a held-up event loop
    relayed_stalls: int = 0  # link stalls passed on to the listener, not concealed here


class AudioInput(Protocol):
    """A transport's receive path for one connection, feeding a pipeline."""

    stats: ReceiveStats
    # When the packet behind the frame being fed arrived (loop time): the latency meters'
    # starting point, read during ``feed``.
    arrived_at: float

    def close(self) -> None: ...


@dataclass(frozen=True)
class PipelineCounters:
    """A session's cumulative counts beyond its input's, for metrics and the session list."""

    input_dropped: int  # input frames dropped from a full queue
    engine_errors: int  # engine calls or syntheses that failed
    in_to_out_recent_ms: float | None  # mean of the last second; None for speech
    input_queued: int | None  # input frames waiting for the engine; None: no input queue


class StageTimings(Protocol):
    """A kind's per-stage timing: its window of recent frames is what the page shows."""

    @property
    def window(self) -> StageWindow: ...


class VoicePromptUnsupported(EngineError):
    """The session's engine takes no voice prompt."""


class TextInput(Protocol):
    """What a session that speaks takes from its client: text to say, and interrupts."""

    def speak(self, text: str, utterance_id: str | None = None) -> str: ...
    def speak_delta(self, piece: str, utterance_id: str | None = None) -> str: ...
    def flush(self, utterance_id: str | None = None) -> str | None: ...
    def interrupt(self) -> int: ...


class Pipeline(ABC):
    """One session's audio path; subclasses say what runs the engine and what comes out."""

    stages: StageTimings

    def __init__(
        self,
        engine: Engine[Any],
        options: Mapping[str, Any],
        state: Any,
        executor: Executor,
        emit: EventSink,
        session_id: str,
        output: OutboundAudio,
    ) -> None:
        self.engine = engine
        self.options = dict(options)
        self._state = state
        self._pool = executor
        self._engine_calls = SerialExecutor(executor)
        self._emit = emit
        self._session_id = session_id
        self.output = output
        self._input: AudioInput | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._clock = asyncio.get_running_loop().time

    @classmethod
    async def create(
        cls: type[PipelineT],
        engine: Engine[Any],
        options: Mapping[str, Any],
        executor: Executor,
        *args: Any,
        **kwargs: Any,
    ) -> PipelineT:
        """Build a pipeline; the state is made off the loop (a cold state can take ~0.5 s)."""
        loop = asyncio.get_running_loop()
        state = await loop.run_in_executor(executor, engine.new_state, options)
        pipeline = cls(engine, options, state, executor, *args, **kwargs)
        pipeline._started()
        return pipeline

    def _started(self) -> None:
        """Start what runs from creation on, before any connection (nothing by default)."""
        return

    # --- transports ----------------------------------------------------------------------

    def attach(self, source: AudioInput) -> None:
        """Take a new connection's input; the previous one (a resumed session's) is closed.

        The output's slot schedule restarts for the new connection; the engine state,
        queues and what is waiting in the output carry on.
        """
        first = self._input is None
        if self._input is not None:
            self._input.close()
        self._input = source
        self.output.restart()
        self._on_attach(first)

    def detach(self) -> None:
        """The connection went: its input stops, its counters stay readable until the next."""
        if self._input is not None:
            self._input.close()

    @abstractmethod
    def _on_attach(self, first: bool) -> None:
        """Start what needs an input (``first``: this is the session's first connection)."""

    @abstractmethod
    def feed(self, pcm: np.ndarray) -> None:
        """One decoded frame (48 kHz float32 mono) from the attached input."""

    # Whether the input should pass a network stall on rather than conceal it
    # (``media.rtc.receive``'s ``relay_stalls``): a pipeline whose output follows its input
    # frame for frame, so the listener's buffer can hold the stall once for both legs.
    relays_input_stalls = False

    def input_stalled(self, edge: InputStall) -> None:
        """The attached input waits out a network stall, or is done with one."""
        log.debug("session %s: input stall %s", self._session_id, edge.value)

    def input_failed(self, code: str, message: str) -> None:
        """The attached input reports a fault the call survives (e.g. undecodable audio).

        It reaches the client as an ``error`` event, the way an engine failure does; the
        session and its connection go on.
        """
        log.warning("session %s: %s: %s", self._session_id, code, message)
        self._emit({"type": "error", "error": code, "message": message})

    @property
    def _arrived_at(self) -> float:
        return self._input.arrived_at if self._input is not None else self._clock()

    # --- what the server reads -----------------------------------------------------------

    @property
    def state(self) -> Any:
        """The engine's state for this session (tests and engine-specific checks)."""
        return self._state

    @property
    def receive_stats(self) -> ReceiveStats:
        return self._input.stats if self._input is not None else ReceiveStats()

    @property
    def underruns(self) -> int:
        return self.output.pacer.underruns

    @property
    def backlog_dropped_seconds(self) -> float:
        return self.output.pacer.backlog_dropped / RTC_RATE

    @property
    def text_input(self) -> TextInput | None:
        """Where text to speak goes, for a session that speaks; None for a transform."""
        return None

    def stage_summary_ms(self) -> dict[str, Any]:
        """The per-stage latency of the last seconds (``stages_ms`` of the ``stats`` event)."""
        return self.stages.window.summary_ms()

    @abstractmethod
    def counters(self) -> PipelineCounters:
        """This kind's cumulative counts."""

    @abstractmethod
    def stats_fields(self) -> dict[str, Any]:
        """This kind's fields of the ``stats`` event (the page charts them)."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """This kind's part of ``GET /sessions/{id}``."""

    @abstractmethod
    def histograms(self) -> dict[str, DurationHistogram]:
        """This kind's cumulative timings, by the name metrics expose them under."""

    # --- the engine ----------------------------------------------------------------------

    async def set_voice_prompt(self, audio: np.ndarray, rate: int, transcript: str) -> None:
        """Give the session's state a voice to speak (or convert) in, from its next audio.

        Runs among the session's engine calls, never beside one. The engine's own
        ``PromptError`` (a ``ValueError``) says what is wrong with the clip.
        """
        if not self.engine.capabilities.voice_prompt:
            raise VoicePromptUnsupported(f"Engine '{self.engine.name}' takes no voice prompt.")
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(
            self._engine_calls, self.engine.set_prompt, self._state, audio, rate, transcript
        )

    # --- the end -------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop the tasks, end the output and release the engine state and buffers."""
        if self._closed:
            return
        self._closed = True
        self._stopping()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self._finish_engine_work()
        self.output.close()
        if self._input is not None:
            self._input.close()
        self._release()
        self.engine.close_state(self._state)
        self._state = None

    def _stopping(self) -> None:
        """Tell running work to stop, before the tasks are cancelled (nothing by default)."""
        return

    async def _finish_engine_work(self) -> None:
        """Wait out engine calls a cancelled task left running in a thread.

        Cancelling a task does not stop its thread, and freeing the state under a running
        native call would corrupt memory: the session's serial queue is drained first.
        """
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._engine_calls, lambda: None)
        except Exception:  # pragma: no cover - a no-op cannot fail
            log.debug("session %s: engine queue failed to drain", self._session_id)

    def _release(self) -> None:
        """Drop this kind's queues and buffers (nothing by default)."""
        return
