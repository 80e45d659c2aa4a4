"""A session's outgoing audio over message sockets, within the client's credit.

The client grants credit (how many milliseconds of audio it can buffer) and acknowledges
what it has played, by sequence number. The paced output (one 20 ms frame per slot) is
sent while the audio sent and not yet played fits the credit; beyond it, frames wait here,
and when a client stops reading altogether only the newest ``MAX_WAITING_MS`` wait: the
oldest are dropped and counted, so a stalled client costs bounded memory and never holds
up the session's clock (nor anyone else's).

It outlives the sockets: sequence numbers continue across a resume, and what was sent but
not acknowledged as played is sent again on the next socket, so a dropped connection loses
no audio and repeats only what the client had not played.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from media.audio.frames import FRAME_MS, RTC_RATE
from media.pipeline.outbound import OutboundAudio, OutputClosed
from media.transports.codecs import SocketCodec
from media.transports.socket_frames import SEQ_MOD, pack

log = logging.getLogger(__name__)

DEFAULT_CREDIT_MS = 1000
MIN_CREDIT_MS = FRAME_MS
MAX_CREDIT_MS = 10_000
MAX_WAITING_MS = 2000  # audio held for a client that takes none, at most
MAX_WAITING_TEXTS = 256  # events held for a client that reads nothing, at most


class SocketLink(Protocol):
    """The socket a connection writes to (an aiohttp WebSocket, in the server)."""

    async def send_bytes(self, data: bytes) -> None: ...
    async def send_str(self, data: str) -> None: ...


Message = bytes | str


class OutputWire(Protocol):
    """How a protocol spells what the output sends: each frame, a ``clear``, an event."""

    def frame(self, seq: int, timestamp: int, payload: bytes) -> list[Message]: ...

    def clear(self) -> str:
        """Drop the audio you have not played (sent when speech is interrupted)."""

    def event(self, text: str) -> str | None:
        """A session event as this protocol carries it; None where it carries none."""


class SocketWire:
    """The WebSocket transport's own messages (``media.transports.socket_frames``)."""

    def frame(self, seq: int, timestamp: int, payload: bytes) -> list[Message]:
        return [pack(seq, timestamp, payload)]

    def clear(self) -> str:
        return json.dumps({"type": "clear"})

    def event(self, text: str) -> str | None:
        return text


@dataclass(frozen=True)
class _Sent:
    seq: int  # unwrapped; the wire carries it modulo 2**32
    end_pts: int  # the output stream position after this frame, at 48 kHz
    messages: list[Message]


class SocketOutput:
    """Frames made for a session, waiting for credit or for their acknowledgement."""

    def __init__(
        self,
        output: OutboundAudio,
        codec: SocketCodec,
        credit_ms: int,
        wire: OutputWire | None = None,
    ) -> None:
        self._output = output
        self.codec = codec
        self.wire = wire or SocketWire()
        self.credit_ms = credit_ms
        self.next_seq = 0
        self.played_seq = -1
        self.played_pts = 0
        self._unplayed: deque[_Sent] = deque()  # sent, not acknowledged as played
        self._waiting: deque[_Sent] = deque()  # not sent yet
        self._texts: deque[str] = deque(maxlen=MAX_WAITING_TEXTS)
        self._link: SocketLink | None = None
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.frames_dropped = 0
        self.texts_dropped = 0
        self.frames_resent = 0
        self.backpressure_sent = 0

    # --- the client's side ---------------------------------------------------------------

    def ack(self, wire_seq: int, played: bool = True) -> None:
        """The client is done with every frame up to ``wire_seq`` (cumulative): it played
        them, or (``played=False``) it dropped them on a ``clear``."""
        base = self.played_seq + 1
        seq = base + (wire_seq - base) % SEQ_MOD
        if seq >= self.next_seq:  # an ack beyond what exists is stale or wrong: ignore it
            return
        while self._unplayed and self._unplayed[0].seq <= seq:
            end = self._unplayed.popleft().end_pts
            if played:
                self.played_pts = end
        self.played_seq = seq
        self._wake.set()

    def grant(self, credit_ms: int) -> None:
        self.credit_ms = credit_ms
        self._wake.set()

    @property
    def session_ended(self) -> bool:
        return self._output.closed

    @property
    def unplayed_ms(self) -> int:
        return len(self._unplayed) * FRAME_MS

    @property
    def waiting_ms(self) -> int:
        return len(self._waiting) * FRAME_MS

    @property
    def played_ms(self) -> float:
        return round(1000 * self.played_pts / RTC_RATE, 1)

    def describe(self) -> dict[str, Any]:
        """The flow-control state, for ``GET /sessions/{id}``."""
        return {
            "codec": {"name": self.codec.name, "rate": self.codec.rate},
            "credit_ms": self.credit_ms,
            "unplayed_ms": self.unplayed_ms,
            "waiting_ms": self.waiting_ms,
            "played_seq": self.played_seq % SEQ_MOD if self.played_seq >= 0 else None,
            "played_ms": self.played_ms,
            "frames_dropped": self.frames_dropped,
            "frames_resent": self.frames_resent,
            "texts_dropped": self.texts_dropped,
        }

    # --- texts ---------------------------------------------------------------------------

    def send_text(self, text: str) -> None:
        """Queue a JSON message; a ``speech_finished`` also says how far the client played,
        and an interrupted one is preceded by ``clear``: drop what you have not played."""
        if '"speech_finished"' in text:
            event = json.loads(text)
            if event.get("interrupted"):
                # Frames made before the interrupt and not sent yet are dropped with what
                # the client holds (their sequence numbers are skipped).
                self.frames_dropped += len(self._waiting)
                self._waiting.clear()
                self._queue_text(self.wire.clear())
            event["played_seq"] = self.played_seq % SEQ_MOD if self.played_seq >= 0 else None
            event["played_ms"] = self.played_ms
            text = json.dumps(event)
        carried = self.wire.event(text)
        if carried is not None:
            self._queue_text(carried)

    def tell(self, message: dict[str, Any]) -> None:
        """A message from the transport itself (``backpressure``), counted."""
        if message.get("type") == "backpressure":
            self.backpressure_sent += 1
        self.send_text(json.dumps(message))

    def _queue_text(self, text: str) -> None:
        if len(self._texts) == self._texts.maxlen:
            self.texts_dropped += 1
        self._texts.append(text)
        self._wake.set()

    # --- sockets -------------------------------------------------------------------------

    def attach(self, link: SocketLink, played_seq: int | None = None) -> int:
        """Send to ``link`` once started; return the sequence number of the first frame it
        gets. ``played_seq``: the last frame the client played (a resume); what was sent
        after it is sent again."""
        if played_seq is not None:
            self.ack(played_seq)
        self.frames_resent += len(self._unplayed)
        self._waiting.extendleft(reversed(self._unplayed))
        self._unplayed.clear()
        self._link = link
        return (self._waiting[0].seq if self._waiting else self.next_seq) % SEQ_MOD

    def start(self) -> None:
        """Begin sending to the attached socket (once the handshake's answer is out)."""
        if self._link is not None and not self._tasks:
            self._tasks = [asyncio.create_task(self._make()), asyncio.create_task(self._send())]

    async def detach(self) -> None:
        """The socket went: stop making and sending frames; keep what was not played."""
        self._link = None
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._waiting.clear()
        self._unplayed.clear()
        self._texts.clear()
        self.codec.close()

    async def _send_one(self, message: Message) -> None:
        assert self._link is not None
        if isinstance(message, bytes):
            await self._link.send_bytes(message)
        else:
            await self._link.send_str(message)

    # --- the two tasks of an attached socket ---------------------------------------------

    async def _make(self) -> None:
        """Take each paced frame as its slot comes, whether or not the client has credit."""
        wants_opus = self.codec.wants_opus
        rate = self.codec.rate
        try:
            while True:
                frame = await self._output.next_frame(encode=wants_opus)
                payload = self.codec.encode(frame.samples, frame.payload)
                if frame.is_silence and self.codec.is_silent(payload):
                    payload = b""
                timestamp = frame.pts * rate // RTC_RATE
                end = frame.pts + len(frame.samples)
                seq = self.next_seq
                self.next_seq += 1
                if len(self._waiting) * FRAME_MS >= MAX_WAITING_MS:
                    self._waiting.popleft()
                    self.frames_dropped += 1
                messages = self.wire.frame(seq % SEQ_MOD, timestamp % SEQ_MOD, payload)
                self._waiting.append(_Sent(seq, end, messages))
                self._wake.set()
        except OutputClosed:
            return

    async def _send(self) -> None:
        """Write queued texts, then frames while the unplayed audio fits the credit."""
        try:
            while self._link is not None:
                await self._wake.wait()
                self._wake.clear()
                while self._texts and self._link is not None:
                    await self._send_one(self._texts.popleft())
                while (
                    self._waiting
                    and self._link is not None
                    and len(self._unplayed) * FRAME_MS < self.credit_ms
                ):
                    sent = self._waiting.popleft()
                    self._unplayed.append(sent)
                    for message in sent.messages:
                        await self._send_one(message)
        except (ConnectionError, RuntimeError) as exc:
            # The socket closed under a write; its handler notices the close.
            log.debug("socket write ended: %s", exc)
