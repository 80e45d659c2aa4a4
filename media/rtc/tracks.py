"""The outgoing WebRTC track: one paced, already encoded 20 ms frame per ``recv()``.

aiortc pulls frames from a track as fast as ``recv()`` returns them, so the track is where
pacing must happen. It also encodes: a track that returns an ``av.Packet`` is sent as is,
which skips aiortc's own path (a PyAV resampler, a thread-pool hop per frame, fixed stereo
96 kb/s ``voip`` and a pure-Python audio level loop on the event loop) in favour of one
libopus call with the session's own codec settings (``media.pipeline.outbound``).

This track never busy-waits and never raises from a live ``recv()``: when the engine has
nothing ready, the slot is silence.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Protocol

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from media.audio.frames import RTC_RATE
from media.audio.opus import OpusEncoder
from media.pipeline.outbound import OutboundFrame, OutputClosed, encode_frame

TIME_BASE = Fraction(1, RTC_RATE)


def stamped_packet(payload: bytes, pts: int) -> av.Packet:
    """An encoded frame as aiortc's sender takes it."""
    packet = av.Packet(payload)
    packet.pts = pts
    packet.time_base = TIME_BASE
    return packet


def opus_packet(encoder: OpusEncoder, samples: np.ndarray, pts: int) -> av.Packet:
    """Encode one frame of float32 mono and stamp it for aiortc's sender."""
    return stamped_packet(encode_frame(encoder, samples), pts)


class FrameSource(Protocol):
    """What a track sends from: the session's paced, encoded audio, which outlives tracks."""

    async def next_frame(self) -> OutboundFrame: ...


class OutboundAudioTrack(MediaStreamTrack):
    """One peer connection's view of a session's outgoing audio.

    aiortc stops a sender's track when the connection ends, irreversibly. Sessions outlive
    connections (a resumed session continues on a new one), so the track holds nothing but
    its source: stopping it ends this connection's stream, not the session's audio.
    """

    kind = "audio"

    def __init__(self, source: FrameSource) -> None:
        super().__init__()
        self._source = source

    async def recv(self) -> av.Packet:
        if self.readyState != "live":
            raise MediaStreamError
        try:
            frame = await self._source.next_frame()
        except OutputClosed:
            self.stop()
            raise MediaStreamError from None
        if self.readyState != "live":
            raise MediaStreamError
        return stamped_packet(frame.payload, frame.pts)
