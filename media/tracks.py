"""The outgoing audio track: one paced, already encoded 20 ms frame per ``recv()``.

aiortc pulls frames from a track as fast as ``recv()`` returns them, so the track is where
pacing must happen. It also encodes: a track that returns an ``av.Packet`` is sent as is,
which skips aiortc's own path (a PyAV resampler, a thread-pool hop per frame, fixed stereo
96 kb/s ``voip`` and a pure-Python audio level loop on the event loop) in favour of one
libopus call with the session's own codec settings.

This track never busy-waits and never raises from a live ``recv()``: when the engine has
nothing ready, the slot is silence.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from media.frames import RTC_RATE
from media.opus import OpusEncoder
from media.pacing import FramePacer

TIME_BASE = Fraction(1, RTC_RATE)


def opus_packet(encoder: OpusEncoder, samples: np.ndarray, pts: int) -> av.Packet:
    """Encode one frame of float32 mono and stamp it for aiortc's sender."""
    pcm = samples if encoder.channels == 1 else np.repeat(samples, encoder.channels)
    packet = av.Packet(encoder.encode(pcm))
    packet.pts = pts
    packet.time_base = TIME_BASE
    return packet


class OutboundAudioTrack(MediaStreamTrack):
    """Frames from a :class:`FramePacer`, Opus-encoded, stamped with slot-based timestamps."""

    kind = "audio"

    def __init__(
        self,
        pacer: FramePacer,
        encoder: OpusEncoder,
        on_frame: Callable[[np.ndarray, bool], None] | None = None,
    ) -> None:
        super().__init__()
        self.pacer = pacer
        self.encoder = encoder
        self._on_frame = on_frame
        self.frames_sent = 0
        self.silence_sent = 0

    async def recv(self) -> av.Packet:
        if self.readyState != "live":
            raise MediaStreamError
        samples, is_silence = await self.pacer.next_frame()
        if self.readyState != "live":
            raise MediaStreamError
        self.frames_sent += 1
        self.silence_sent += is_silence
        if self._on_frame is not None:
            self._on_frame(samples, is_silence)
        return opus_packet(self.encoder, samples, self.pacer.pts)

    def stop(self) -> None:
        super().stop()
        self.encoder.close()
