"""Tracks for a headless peer: play samples in real time, record what the server sends.

Both stamp every frame with ``time.monotonic()`` on a :class:`peer.probe.Timeline`, so the
peer can measure round-trip time on the audio itself. The peer sends Opus it encodes itself
and receives through the same :mod:`media.rtc.receive` path as the server, so what it measures
is the server and the network, not aiortc's client-side buffering.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from media.audio.frames import FRAME_SAMPLES, RTC_RATE
from media.audio.opus import OpusEncoder
from media.pipeline.base import ReceiveStats
from media.rtc.tracks import opus_packet
from peer.probe import Timeline

FRAME_SECONDS = FRAME_SAMPLES / RTC_RATE
PEER_BITRATE = 96_000


class RealTimeClock:
    """Frame ``k`` of a stream that started at its first frame is due ``k * 20 ms`` later
    (``speed`` times sooner: a sender that runs ahead of real time, for tests of it)."""

    def __init__(self, speed: float = 1.0) -> None:
        self._start: float | None = None
        self._period = FRAME_SECONDS / speed
        self.frames = 0

    async def next_frame(self) -> int:
        """Wait until the next frame is due; return its index."""
        now = time.monotonic()
        if self._start is None:
            self._start = now
        due = self._start + self.frames * self._period
        if due > now:
            await asyncio.sleep(due - now)
        index, self.frames = self.frames, self.frames + 1
        return index


class RealTimeFrames:
    """``samples`` (48 kHz float32 mono) cut into 20 ms frames, each due 20 ms after the last.

    After the samples run out the frames are silence, so a call stays up while the tail of
    the reply comes back; ``finished`` is set when the last real frame has been taken.
    ``shape`` (e.g. a marker inserter) may alter each frame as it is taken. Every frame
    taken is kept (``sent``) and stamped on ``timeline``.
    """

    def __init__(
        self, samples: np.ndarray, shape: Callable[[np.ndarray], np.ndarray] | None
    ) -> None:
        self._samples = samples.astype(np.float32, copy=False)
        self._shape = shape
        self._clock = RealTimeClock()
        self.timeline = Timeline()
        self.sent: list[np.ndarray] = []
        self.finished = asyncio.Event()

    @property
    def frames_sent(self) -> int:
        return self._clock.frames

    def _take(self, index: int) -> np.ndarray:
        """Frame ``index``, shaped, kept and stamped now."""
        begin = index * FRAME_SAMPLES
        frame = self._samples[begin : begin + FRAME_SAMPLES]
        if len(frame) < FRAME_SAMPLES:
            frame = np.pad(frame, (0, FRAME_SAMPLES - len(frame)))
        if begin + FRAME_SAMPLES >= len(self._samples):
            self.finished.set()
        if self._shape is not None:
            frame = self._shape(frame)
        self.sent.append(frame)
        self.timeline.append(FRAME_SAMPLES, time.monotonic())
        return frame


class SamplesSourceTrack(MediaStreamTrack, RealTimeFrames):
    """Sends ``samples`` as Opus, 20 ms at a time, in real time (``RealTimeFrames``)."""

    kind = "audio"

    def __init__(
        self,
        samples: np.ndarray,
        shape: Callable[[np.ndarray], np.ndarray] | None = None,
        encoder: OpusEncoder | None = None,
    ) -> None:
        MediaStreamTrack.__init__(self)
        RealTimeFrames.__init__(self, samples, shape)
        self._encoder = encoder or OpusEncoder(channels=1, bitrate=PEER_BITRATE)

    async def recv(self) -> av.Packet:
        if self.readyState != "live":
            raise MediaStreamError
        index = await self._clock.next_frame()
        return opus_packet(self._encoder, self._take(index), index * FRAME_SAMPLES)

    def stop(self) -> None:
        super().stop()
        self._encoder.close()


class FrameRecorder:
    """A receive-path sink that keeps every frame and the time it was released."""

    def __init__(self) -> None:
        self.timeline = Timeline()
        self.chunks: list[np.ndarray] = []
        self.receive_stats: ReceiveStats | None = None

    def __call__(self, pcm: np.ndarray) -> None:
        self.timeline.append(len(pcm), time.monotonic())
        self.chunks.append(pcm)

    @property
    def frames(self) -> int:
        return len(self.chunks)

    def audio(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)
