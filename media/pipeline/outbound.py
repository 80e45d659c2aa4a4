"""Where a session's output audio waits for its slot: ring buffer, pacer and encoder.

Transform and speak sessions differ in what they write here (a continuous processed
stream, or bursts of synthesised speech far ahead of real time) and in how much audio may
wait (a transform drops a backlog to keep latency; speech must all be played), but they
leave the same way: one paced, Opus-encoded frame per 20 ms slot, which a transport sends
(``media.rtc.tracks`` over WebRTC).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from media.audio.frames import FRAME_SAMPLES, RTC_RATE
from media.audio.opus import OpusEncoder
from media.audio.ringbuffer import RingBuffer
from media.pipeline.pacing import FramePacer, OutputCushion

# An interruption fades out over the first quarter of the next frame: long enough not to
# click, short enough that the packet after it decodes to silence. The rest of that frame is
# zeros, so the encoder's lookahead (6.5 ms) carries the whole fade in the same packet; what
# libopus still lets through into the next packet (MDCT spreading, and in SILK and hybrid
# modes the predicted energies decaying) is what decides that packet. Measured on speech
# peaking at -1 dBFS, 72 interrupt points, 96 kb/s: packets after the fade's above -50 dBFS
# 11 % with a 10 ms fade, 1 % with 5 ms (CELT); with FEC planned for loss (SILK/hybrid) 32 %
# and 15 %, and 4 % once the fade's frame and the next are coded without prediction.
FADE_SAMPLES = FRAME_SAMPLES // 4
INDEPENDENT_AFTER_FADE = 2  # frames coded without inter-frame prediction: the fade's, the next
FADE_SECONDS = FADE_SAMPLES / RTC_RATE

# ``(samples, no_audio)``: ``no_audio`` when none of the buffered audio left in this frame
# (filler silence, or a slot filled by expanding what went before).
FrameObserver = Callable[[np.ndarray, bool], None]


class OutputClosed(Exception):
    """The session ended: there are no more frames."""


@dataclass(frozen=True)
class OutboundFrame:
    """One 20 ms slot's audio: as sent (``samples``, float32 mono) and encoded (``payload``)."""

    samples: np.ndarray
    payload: bytes
    pts: int  # the first sample's position in the output stream, at 48 kHz
    is_silence: bool


def encode_frame(encoder: OpusEncoder, samples: np.ndarray) -> bytes:
    """One frame of float32 mono as the encoder's channels want it, encoded."""
    pcm = samples if encoder.channels == 1 else np.repeat(samples, encoder.channels)
    return encoder.encode(pcm)


class OutboundAudio:
    """48 kHz float32 mono in, one paced Opus frame per 20 ms out.

    It lives as long as the session; each connection a transport attaches reads from it
    (see :meth:`restart`), so the buffer, the schedule and the encoder's state carry on
    across a resumed connection.
    """

    def __init__(
        self,
        encoder: OpusEncoder,
        capacity_seconds: float,
        max_backlog: int | None,
        on_frame: FrameObserver | None = None,
        cushion: OutputCushion | None = None,
    ) -> None:
        self.buffer = RingBuffer(int(capacity_seconds * RTC_RATE))
        self.pacer = FramePacer(self.buffer, max_backlog=max_backlog, cushion=cushion)
        self.encoder = encoder
        self._on_frame = on_frame
        self.frames_sent = 0
        self.silence_sent = 0
        self.expanded_sent = 0  # frames that were mostly expansion of a late hop
        self._independent = 0  # frames still to code without prediction (after a fade)
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def restart(self) -> None:
        """A new connection reads from here: the slot schedule starts again from now."""
        self.pacer.restart()

    async def next_frame(self, encode: bool = True) -> OutboundFrame:
        """The next paced frame, encoded unless ``encode`` is false (a transport that sends
        PCM: its ``payload`` is then empty); silence when nothing is ready in its slot."""
        if self._closed:
            raise OutputClosed
        samples, is_silence = await self.pacer.next_frame()
        if self._closed:
            raise OutputClosed  # the session ended while this frame waited
        return self._leave(samples, is_silence, encode)

    def poll_frame(self) -> OutboundFrame | None:
        """The next frame, encoded, if its slot has come (``FramePacer.poll``); None before
        (poll again at ``pacer.due`` or once audio is written)."""
        if self._closed:
            raise OutputClosed
        taken = self.pacer.poll()
        return None if taken is None else self._leave(*taken, encode=True)

    def _leave(self, samples: np.ndarray, is_silence: bool, encode: bool) -> OutboundFrame:
        payload = self._encode(samples) if encode else b""
        self._independent = max(0, self._independent - 1)
        frame = OutboundFrame(samples, payload, self.pacer.pts, is_silence)
        cushion = self.pacer.cushion
        expanded = not is_silence and cushion is not None and cushion.last_expanded
        self.frames_sent += 1
        self.silence_sent += is_silence
        self.expanded_sent += expanded
        if self._on_frame is not None:  # told once the frame leaves: encoded
            self._on_frame(samples, is_silence or expanded)
        return frame

    def _encode(self, samples: np.ndarray) -> bytes:
        if not self._independent:
            return encode_frame(self.encoder, samples)
        self.encoder.set_prediction_disabled(True)
        try:
            return encode_frame(self.encoder, samples)
        finally:
            self.encoder.set_prediction_disabled(False)

    def write(self, samples: np.ndarray) -> None:
        if len(samples):
            self.buffer.write(samples)
            self.pacer.notify()

    def end_stream(self) -> None:
        """What is written so far ends a stream: its last partial frame is sent too."""
        self.pacer.end_stream()

    @property
    def buffered_seconds(self) -> float:
        return self.buffer.available / RTC_RATE

    def fade_out(self) -> int:
        """Keep the next ``FADE_SAMPLES`` of what is queued, faded to zero; drop the rest.

        Returns how many samples were dropped. The next frame starts where the audio was
        and reaches silence a quarter of the way through, instead of cutting off with a
        click; the rest of it is zeros, so it is a whole frame (a part one went out as a
        short packet and broke the frame grid, and the speech in the encoder's lookahead
        followed in the packets after it). Nothing that was played may come back as
        expansion either.
        """
        playing = FADE_SAMPLES
        if self.pacer.holding:  # an utterance waiting for its pre-buffer was never heard
            playing = max(0, min(playing, self.pacer.held_at - self.buffer.consumed))
        head = self.buffer.read(playing)
        dropped = self.buffer.clear()
        self.pacer.release()
        if self.pacer.cushion is not None:
            self.pacer.cushion.reset()
        if len(head):
            ramp = np.linspace(1.0, 0.0, len(head), dtype=np.float32)
            self.buffer.write(head * ramp)
            self.buffer.write(np.zeros(FRAME_SAMPLES - len(head), np.float32))
            self.pacer.notify()
            self._independent = INDEPENDENT_AFTER_FADE
        return dropped

    def close(self) -> None:
        self._closed = True
        self.encoder.close()
        self.buffer.release()
