"""Where a session's latency goes: per-stage timings of every departing frame.

A transform frame's in-to-out time is spent, in order, in these stages, each measured by
its own timestamps:

- ``receive``: the packet's arrival at the receive path until its audio is handed on
  (the jitter margin held for a missing packet, and the decode);
- ``resample``: the two resampler calls, to the engine's rate and back (their own durations);
- ``queue``: pushed into the input queue until the engine worker takes it;
- ``engine``: taken by the worker until the engine's output covering it is back on the loop
  (the call itself, the thread hop, and any audio the engine holds between calls);
- ``output_buffer``: written to the ring buffer until its frame is ready for its slot;
- ``pacing``: ready until taken (waiting for the slot to start);
- ``encode``: taken until the encoded packet leaves for the sender.

Samples are traced by stream position, the way :class:`media.pipeline.latency.InToOutMeter` does: an
engine returns as many samples as it is given, so output sample ``q`` is the ``q``-th input
sample that reached the engine. Each departing frame is attributed to the input chunk and
the output chunk that hold its last sample. Chunks dropped from the input queue never reach
the engine, so they take no positions; a chunk an engine failed on is replaced by as much
silence, so it keeps its positions.

A speak frame has ``synthesis`` (the engine time that produced its chunk), ``resample``,
``output_buffer``, ``pacing`` and ``encode``; its audio is ahead of real time, so the output
buffer holds most of its time.

Everything here runs on the event loop, a few microseconds per frame; summaries (means and
medians over the recent window) are computed only when asked for, about once a second.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np

from media.audio.resample import StreamResampler

RECENT_FRAMES = 100  # two seconds of 20 ms frames
TRANSFORM_STAGES = (
    "receive",
    "resample",
    "queue",
    "engine",
    "output_buffer",
    "pacing",
    "encode",
)
SPEAK_STAGES = ("synthesis", "resample", "output_buffer", "pacing", "encode")
# Seconds; fine at the bottom for engine calls (~0.1-2 ms), up to seconds for first audio.
LATENCY_BUCKETS = (
    0.00025,
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
)


class DurationHistogram:
    """A cumulative histogram of durations: a bucket index and two additions per sample.

    Sessions keep their own and a metrics collector adds them up when scraped, so the media
    path never takes a lock or touches a metrics library.
    """

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds

    @property
    def count(self) -> int:
        return sum(self.counts)

    def add(self, other: DurationHistogram) -> None:
        """Add ``other``'s samples to this one (same bounds)."""
        if other.bounds != self.bounds:
            raise ValueError("histograms with different buckets cannot be added")
        self.counts = [
            mine + theirs for mine, theirs in zip(self.counts, other.counts, strict=True)
        ]
        self.sum += other.sum

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, samples at or below it)`` pairs, ending with ``(inf, count)``."""
        pairs, total = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += count
            pairs.append((bound, total))
        return pairs


class StageWindow:
    """The recent frames' stage timings (seconds), one row per frame, summarised on demand."""

    def __init__(self, names: Sequence[str], extra: Sequence[str] = ()) -> None:
        self.names = tuple(names)
        self.extra = tuple(extra)
        self.rows: deque[tuple[float, ...]] = deque(maxlen=RECENT_FRAMES)

    def summary_ms(self) -> dict[str, Any]:
        """``{"frames": n, stage: {"mean", "p50"} in ms, ...}`` over the window.

        Stages are ``None`` until a frame has been measured.
        """
        columns = (*self.names, *self.extra)
        if not self.rows:
            return {"frames": 0, **dict.fromkeys(columns)}
        count, width = len(self.rows), len(columns)
        # fromiter and partition: a quarter of the time of asarray and median, here.
        flat = np.fromiter(chain.from_iterable(self.rows), float, count * width)
        values = flat.reshape(count, width) * 1000.0
        middle = count // 2
        halves = np.partition(values, [max(middle - 1, 0), middle], axis=0)
        medians = halves[middle] if count % 2 else (halves[middle - 1] + halves[middle]) / 2
        means = values.mean(axis=0)
        summary: dict[str, Any] = {"frames": len(self.rows)}
        for name, mean, median in zip(columns, means.tolist(), medians.tolist(), strict=True):
            summary[name] = {"mean": round(mean, 3), "p50": round(median, 3)}
        return summary


class _Chunk:
    """One input chunk on its way through a transform (times in seconds, loop clock)."""

    __slots__ = (
        "arrived",
        "dequeued",
        "done",
        "end",
        "fed",
        "out_end",
        "pushed",
        "resample_in",
        "resample_out",
        "samples",
        "written",
    )

    def __init__(
        self, samples: int, arrived: float, fed: float, resample: float, pushed: float
    ) -> None:
        self.samples = samples  # at 48 kHz
        self.arrived = arrived
        self.fed = fed
        self.resample_in = resample
        self.pushed = pushed
        self.dequeued = 0.0
        self.end = 0  # input stream position after its last sample, once it reached the engine
        # Set when the engine call on this chunk wrote output (to ring-buffer position out_end).
        self.out_end = 0
        self.done = 0.0
        self.resample_out = 0.0
        self.written = 0.0


class _Speech:
    """One synthesised chunk in a speak session's ring buffer."""

    __slots__ = ("end", "resample", "synthesis", "written")

    def __init__(self, end: int, synthesis: float, resample: float, written: float) -> None:
        self.end = end  # ring-buffer stream position after its last sample
        self.synthesis = synthesis
        self.resample = resample
        self.written = written


class TransformStages:
    """Stage timings of one transform session, fed by its pipeline at each hand-over."""

    def __init__(self) -> None:
        self.window = StageWindow(TRANSFORM_STAGES, extra=("in_to_out",))
        self.engine_calls = DurationHistogram()
        self.in_to_out = DurationHistogram()
        self._queued: deque[_Chunk] = deque()  # mirrors the input queue, oldest first
        self._current: _Chunk | None = None  # with the engine now
        self._inputs: deque[_Chunk] = deque()  # reached the engine, by ``end``
        self._outputs: deque[_Chunk] = deque()  # wrote output, by ``out_end``
        self.taken = 0  # input (48 kHz samples) the engine worker has taken from the queue

    @property
    def queued(self) -> int:
        """Chunks waiting in the input queue."""
        return len(self._queued)

    def pushed(self, samples: int, arrived: float, fed: float, resample: float, at: float) -> None:
        """A chunk of ``samples`` (48 kHz) that arrived at ``arrived`` was queued at ``at``.

        ``fed`` is when the receive path handed it on, ``resample`` the resampler's time.
        """
        self._queued.append(_Chunk(samples, arrived, fed, resample, at))

    def evicted(self) -> int:
        """The input queue dropped its oldest chunk; returns its samples (48 kHz)."""
        return self._queued.popleft().samples if self._queued else 0

    def dequeued(self, at: float) -> None:
        """The engine worker took the oldest queued chunk."""
        self._current = self._queued.popleft() if self._queued else None
        if self._current is not None:
            self._current.dequeued = at
            self.taken += self._current.samples
            self._current.end = self.taken

    def produced(self, done: float, resample: float, written_end: int, written: float) -> None:
        """The engine's output for the current chunk was back at ``done`` and written.

        ``written_end`` is the ring buffer's written position after it (unchanged when the
        engine returned nothing yet). A failed call counts too: the pipeline writes silence
        in its place, so positions stay in step.
        """
        chunk, self._current = self._current, None
        if chunk is None:
            return
        self._inputs.append(chunk)
        self.engine_calls.observe(done - chunk.dequeued)
        if not self._outputs or written_end > self._outputs[-1].out_end:
            chunk.out_end, chunk.done, chunk.written = written_end, done, written
            chunk.resample_out = resample
            self._outputs.append(chunk)

    def departed(
        self,
        end_position: int,
        ready: float,
        taken: float,
        sent: float,
        in_to_out: float | None,
    ) -> None:
        """A frame whose last sample is ``end_position - 1`` left at ``sent``.

        ``in_to_out`` is the independent measurement of the same frame (InToOutMeter); a row
        is kept only when both exist, so the window's stage means add up to its mean.
        """
        inputs, outputs = self._inputs, self._outputs
        while inputs and inputs[0].end < end_position:
            inputs.popleft()
        while outputs and outputs[0].out_end < end_position:
            outputs.popleft()
        if not inputs or not outputs or in_to_out is None:
            return
        source, output = inputs[0], outputs[0]
        self.in_to_out.observe(in_to_out)
        self.window.rows.append(
            (
                source.fed - source.arrived,
                source.resample_in + output.resample_out,
                source.dequeued - source.pushed,
                output.done - source.dequeued,
                ready - output.written,
                taken - ready,
                sent - taken,
                in_to_out,
            )
        )


class SpeakStages:
    """Stage timings of one speak session, plus its latency histograms."""

    def __init__(self) -> None:
        self.window = StageWindow(SPEAK_STAGES)
        self.synthesis = DurationHistogram()  # engine time per synthesised chunk
        self.first_audio = DurationHistogram()  # text queued -> its first frame sent
        self.interrupt_to_silence = DurationHistogram()
        self._outputs: deque[_Speech] = deque()

    def synthesised(self, end: int, synthesis: float, resample: float, at: float) -> None:
        """A chunk that took ``synthesis`` seconds of engine time was written at ``at``.

        ``end`` is the ring buffer's written position after it.
        """
        self.synthesis.observe(synthesis)
        self._outputs.append(_Speech(end, synthesis, resample, at))

    def padded(self, end: int, at: float) -> None:
        """Audio the engine did not make (a resampler's tail, padding) was written."""
        self._outputs.append(_Speech(end, 0.0, 0.0, at))

    def cleared(self) -> None:
        """The buffer was cleared (an interrupt): what was written will never depart."""
        self._outputs.clear()

    def departed(self, end_position: int, ready: float, taken: float, sent: float) -> None:
        """A frame whose last sample is ``end_position - 1`` left at ``sent``."""
        outputs = self._outputs
        while outputs and outputs[0].end < end_position:
            outputs.popleft()
        if not outputs:
            return
        speech = outputs[0]
        self.window.rows.append(
            (speech.synthesis, speech.resample, ready - speech.written, taken - ready, sent - taken)
        )


def timed_resample(resampler: StreamResampler, chunk: np.ndarray) -> tuple[np.ndarray, float]:
    """Resample ``chunk``, with the call's duration (0 for a pass-through, not timed)."""
    if resampler.passthrough:
        return chunk, 0.0
    began = time.perf_counter()
    out = resampler.process(chunk)
    return out, time.perf_counter() - began
