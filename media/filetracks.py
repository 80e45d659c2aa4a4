"""Tracks for a headless peer: play samples in real time, record what a remote track sends.

Both stamp every frame with ``time.monotonic()`` on a :class:`media.probe.Timeline`, so the
peer can measure round-trip time on the audio itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from media.frames import FRAME_SAMPLES, RTC_RATE, frame_to_mono, mono_to_frame
from media.probe import Timeline

FRAME_SECONDS = FRAME_SAMPLES / RTC_RATE
RTP_CLOCK_WRAP = 1 << 32  # received pts are RTP timestamps, which wrap


class SamplesSourceTrack(MediaStreamTrack):
    """Sends ``samples`` (48 kHz float32 mono) in 20 ms frames at real-time pace.

    After the samples run out it keeps sending silence, so the call stays up while the
    tail of the reply comes back; ``finished`` is set when the last real frame has gone.
    ``shape`` (e.g. a marker inserter) may alter each frame just before it is sent.
    """

    kind = "audio"

    def __init__(
        self,
        samples: np.ndarray,
        shape: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> None:
        super().__init__()
        self._samples = samples.astype(np.float32, copy=False)
        self._shape = shape
        self._start: float | None = None
        self._index = 0
        self.timeline = Timeline()
        self.sent: list[np.ndarray] = []
        self.finished = asyncio.Event()

    @property
    def frames_sent(self) -> int:
        return self._index

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._start is None:
            self._start = now
        due = self._start + self._index * FRAME_SECONDS
        if due > now:
            await asyncio.sleep(due - now)
        begin = self._index * FRAME_SAMPLES
        frame = self._samples[begin : begin + FRAME_SAMPLES]
        if len(frame) < FRAME_SAMPLES:
            frame = np.pad(frame, (0, FRAME_SAMPLES - len(frame)))
        if begin + FRAME_SAMPLES >= len(self._samples):
            self.finished.set()
        if self._shape is not None:
            frame = self._shape(frame)
        self.sent.append(frame)
        self.timeline.append(FRAME_SAMPLES, time.monotonic())
        pts = self._index * FRAME_SAMPLES
        self._index += 1
        return mono_to_frame(frame, pts)


class TrackRecorder:
    """Drains a remote audio track into memory, noting arrival times and timestamp gaps."""

    def __init__(self) -> None:
        self.timeline = Timeline()
        self.chunks: list[np.ndarray] = []
        self.gaps = 0
        self.gap_samples = 0
        self._last_pts: int | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self, track: MediaStreamTrack) -> None:
        self._task = asyncio.create_task(self._run(track))

    @property
    def frames(self) -> int:
        return len(self.chunks)

    def audio(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)

    async def _run(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            samples = frame_to_mono(frame)
            self.timeline.append(len(samples), time.monotonic())
            self.chunks.append(samples)
            if self._last_pts is not None and frame.pts is not None:
                missing = (frame.pts - self._last_pts - frame.samples) % RTP_CLOCK_WRAP
                if 0 < missing < RTP_CLOCK_WRAP // 2:
                    self.gaps += 1
                    self.gap_samples += missing
            self._last_pts = frame.pts

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
