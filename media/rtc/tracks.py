"""The outgoing WebRTC track: a placeholder that tells when aiortc would start sending.

aiortc's sender pulls frames from a track in a coroutine of its own. Our frames are sent
by the worker's media tick (``media.rtc.media_tick``) instead, so the track aiortc is given
never returns a frame: its first ``recv()`` parks the sender's coroutine, which costs
nothing until the connection ends and aiortc cancels it. Sessions outlive connections (a
resumed session continues on a new one), so the track holds nothing of the session.
A peer that does send through aiortc's sender (``peer.filetracks``) stamps its encoded
frames with :func:`opus_packet`.
"""

from __future__ import annotations

import asyncio
from fractions import Fraction

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from media.audio.frames import RTC_RATE
from media.audio.opus import OpusEncoder
from media.pipeline.outbound import encode_frame

TIME_BASE = Fraction(1, RTC_RATE)


def stamped_packet(payload: bytes, pts: int) -> av.Packet:
    """An encoded frame as aiortc's sender takes it (for peers that send through it)."""
    packet = av.Packet(payload)
    packet.pts = pts
    packet.time_base = TIME_BASE
    return packet


def opus_packet(encoder: OpusEncoder, samples: np.ndarray, pts: int) -> av.Packet:
    """Encode one frame of float32 mono and stamp it for aiortc's sender."""
    return stamped_packet(encode_frame(encoder, samples), pts)


class ParkedAudioTrack(MediaStreamTrack):
    """An audio track whose frames go out another way; ``recv()`` waits until it stops."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._stopped = asyncio.get_running_loop().create_future()

    async def recv(self) -> av.Packet:
        if self.readyState == "live":
            await asyncio.shield(self._stopped)
        raise MediaStreamError

    def stop(self) -> None:
        super().stop()
        if not self._stopped.done():
            self._stopped.set_result(None)
