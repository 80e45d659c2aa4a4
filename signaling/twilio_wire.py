"""A session's audio as a Twilio Media Stream carries it: the output side's messages.

Ours leaves as ``media`` messages (base64 mu-law, 8 kHz), one per 20 ms frame paced by the
session's output, with a ``mark`` every ``MARK_EVERY_FRAMES`` frames named after the last
frame's sequence number. Twilio echoes a mark when the audio queued before it has played:
that is the acknowledgement the flow control and the played position need. On barge-in
the output sends ``clear``: Twilio drops what it has not played and returns the pending
marks at once, so marks of frames sent before a ``clear`` and echoed after it are audio
that was dropped, not played. Twilio takes no other messages: the session's events stay
on the server (its event stream, ``GET /sessions/{id}/events``).
"""

from __future__ import annotations

from media.transports.socket_output import Message
from signaling.twilio import clear_message, mark_message, media_message

MARK_EVERY_FRAMES = 5  # the played position to within 100 ms


class TwilioWire:
    """``OutputWire`` for one Media Stream (``streamSid``)."""

    def __init__(self, stream_sid: str) -> None:
        self.stream_sid = stream_sid
        self._framed = -1  # the last frame given a message
        self._cleared_through = -1  # frames up to here, when echoed after a clear, were dropped

    def frame(self, seq: int, timestamp: int, payload: bytes) -> list[Message]:
        self._framed = seq
        messages: list[Message] = []
        if payload:  # silence is simply not sent: Twilio plays silence when it has nothing
            messages.append(media_message(self.stream_sid, payload))
        if seq % MARK_EVERY_FRAMES == MARK_EVERY_FRAMES - 1:
            messages.append(mark_message(self.stream_sid, str(seq)))
        return messages

    def clear(self) -> str:
        self._cleared_through = self._framed
        return clear_message(self.stream_sid)

    def event(self, text: str) -> str | None:
        return None

    def mark_played(self, seq: int) -> bool:
        """Whether the echoed mark for frame ``seq`` means played (not dropped by a clear)."""
        return seq > self._cleared_through
