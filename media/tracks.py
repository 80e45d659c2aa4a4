"""The outgoing audio track: one paced 20 ms frame per ``recv()``.

aiortc pulls frames from a track as fast as ``recv()`` returns them and encodes each one, so
the track is where pacing must happen. This track never busy-waits and never raises from a
live ``recv()``: when the engine has nothing ready, the slot is silence.
"""

from __future__ import annotations

import av
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from media.frames import mono_to_frame
from media.pacing import FramePacer


class OutboundAudioTrack(MediaStreamTrack):
    """Frames from a :class:`FramePacer`, stamped with slot-based timestamps."""

    kind = "audio"

    def __init__(self, pacer: FramePacer) -> None:
        super().__init__()
        self.pacer = pacer
        self.frames_sent = 0
        self.silence_sent = 0

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        samples, is_silence = await self.pacer.next_frame()
        if self.readyState != "live":
            raise MediaStreamError
        self.frames_sent += 1
        self.silence_sent += is_silence
        return mono_to_frame(samples, self.pacer.pts)
