"""Where a session's output audio waits for its slot: ring buffer, pacer and track together.

Transform and speak sessions differ in what they write here (a continuous processed
stream, or bursts of synthesised speech far ahead of real time) and in how much audio may
wait (a transform drops a backlog to keep latency; speech must all be played), but they
leave through the same paced, Opus-encoding track.
"""

from __future__ import annotations

from collections.abc import Callable

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError

from media.frames import FRAME_SAMPLES, RTC_RATE
from media.opus import OpusEncoder
from media.pacing import FramePacer
from media.ringbuffer import RingBuffer
from media.tracks import OutboundAudioTrack, opus_packet

# An interruption fades out over the first half of the next frame: long enough not to click,
# short enough that the track is silent 10 ms into that frame.
FADE_SAMPLES = FRAME_SAMPLES // 2
FADE_SECONDS = FADE_SAMPLES / RTC_RATE

FrameObserver = Callable[[np.ndarray, bool], None]


class OutboundAudio:
    """48 kHz float32 mono in, one paced Opus frame per 20 ms out.

    It lives as long as the session; each peer connection gets its own ``track`` over it
    (see :meth:`new_track`), so the buffer, the schedule and the encoder's state carry on
    across a resumed connection.
    """

    def __init__(
        self,
        encoder: OpusEncoder,
        capacity_seconds: float,
        max_backlog: int | None,
        on_frame: FrameObserver | None = None,
    ) -> None:
        self.buffer = RingBuffer(int(capacity_seconds * RTC_RATE))
        self.pacer = FramePacer(self.buffer, max_backlog=max_backlog)
        self.encoder = encoder
        self._on_frame = on_frame
        self.frames_sent = 0
        self.silence_sent = 0
        self._closed = False
        self.track = OutboundAudioTrack(self)

    def new_track(self) -> OutboundAudioTrack:
        """A track for a new peer connection; the previous one stops, the schedule restarts."""
        self.track.stop()
        self.pacer.restart()
        self.track = OutboundAudioTrack(self)
        return self.track

    async def next_packet(self) -> av.Packet:
        """The next paced frame, encoded; silence when nothing is ready in its slot."""
        samples, is_silence = await self.pacer.next_frame()
        if self._closed:
            raise MediaStreamError  # the session ended while this frame waited
        packet = opus_packet(self.encoder, samples, self.pacer.pts)
        self.frames_sent += 1
        self.silence_sent += is_silence
        if self._on_frame is not None:  # told once the frame leaves: encoded
            self._on_frame(samples, is_silence)
        return packet

    def write(self, samples: np.ndarray) -> None:
        if len(samples):
            self.buffer.write(samples)
            self.pacer.notify()

    def complete_frame(self) -> None:
        """Pad with silence to a whole frame, so the end of a stream is sent, not held back.

        The pacer only sends whole frames; a last partial frame would wait for audio that
        never comes.
        """
        self.write(np.zeros((-self.buffer.available) % FRAME_SAMPLES, np.float32))

    @property
    def buffered_seconds(self) -> float:
        return self.buffer.available / RTC_RATE

    def fade_out(self) -> int:
        """Keep the next ``FADE_SAMPLES`` of what is queued, faded to zero; drop the rest.

        Returns how many samples were dropped. The next frame starts where the audio was
        and reaches silence half-way through, instead of cutting off with a click.
        """
        head = self.buffer.read(FADE_SAMPLES)
        dropped = self.buffer.clear()
        if len(head):
            ramp = np.linspace(1.0, 0.0, len(head), dtype=np.float32)
            self.buffer.write(head * ramp)
            self.pacer.notify()
        return dropped

    def close(self) -> None:
        self._closed = True
        self.track.stop()
        self.encoder.close()
        self.buffer.clear()
