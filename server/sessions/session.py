"""One live session: its peer connection, its pipeline, its events and its control channel."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from media.engines.base import Engine
from media.pipeline.base import Pipeline, TextInput
from media.transports.socket_output import SocketOutput
from server.sessions.channel_limits import ChannelLimits
from server.sessions.control import Alternatives, ControlError, apply, decode, parse
from server.sessions.events import EventHub
from signaling.errors import ApiError

log = logging.getLogger(__name__)

STATS_INTERVAL_SECONDS = 1.0


class Connection(Protocol):
    """What a session holds of the transport it is attached to (a WebRTC peer connection,
    a WebSocket): its state, and how to let it go."""

    @property
    def state(self) -> str: ...

    async def close(self) -> None: ...


class MessageChannel(Protocol):
    """The client's message channel on a connection (a WebRTC data channel, a socket)."""

    readyState: str

    def send(self, data: str) -> None: ...
    def on(self, event: str, handler: Callable[..., Any]) -> Any: ...


@dataclass(eq=False)
class Session:
    """Outlives its peer connection: a detached session keeps its engine state, queues and
    speech position until it is resumed on a new connection or its grace period ends."""

    id: str
    engine: Engine[Any]
    pipeline: Pipeline
    events: EventHub
    resume_token: str
    connection: Connection | None = None
    channel: MessageChannel | None = None
    receives_caller_audio: bool = True
    detached_at: float | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)  # lifecycle tasks
    grace: asyncio.Task[None] | None = None
    resumes: int = 0
    close_reason: str | None = None  # why it ended, once it has
    opened_at: float = field(default_factory=time.time)  # wall clock, for the session list
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    ever_connected: bool = False
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    limits: ChannelLimits = field(kw_only=True)
    speakers_for: Alternatives | None = field(default=None, kw_only=True)
    client: str = field(default="", kw_only=True)  # the key per-client limits count by
    # The audio sent over sockets and not yet played: it outlives each socket (resume).
    socket_output: SocketOutput | None = field(default=None, kw_only=True)

    @property
    def speaker(self) -> TextInput:
        """Where text goes, or the error a client gets for asking a transform to speak."""
        text_input = self.pipeline.text_input
        if text_input is None:
            raise ControlError(
                "not_a_speak_session",
                f"Engine '{self.engine.name}' transforms audio; open a session with a speak "
                "engine to send text.",
            )
        return text_input

    def use_channel(self, channel: MessageChannel) -> None:
        """Adopt the first data channel the client opens on this connection."""
        if self.channel is not None:
            return
        self.channel = channel
        channel.on("message", self._on_message)
        channel.on("close", lambda: self.drop_channel(channel))
        self.events.attach_channel(self._send)

    def drop_channel(self, channel: MessageChannel | None = None) -> None:
        """Stop using the data channel (``channel``: only if it is still the one in use)."""
        if channel is None or channel is self.channel:
            self.channel = None
            self.events.detach_channel()

    @property
    def connection_state(self) -> str:
        return "detached" if self.connection is None else self.connection.state

    def _send(self, text: str) -> None:
        if self.channel is not None and self.channel.readyState == "open":
            self.channel.send(text)

    def _on_message(self, raw: str | bytes) -> None:
        try:
            if not self.limits.admit(raw):
                return
            reply = apply(
                parse(decode(raw, self.limits.max_bytes)), self.speaker, self.speakers_for
            )
        except ControlError as exc:
            reply = exc.event()
        if reply is not None:
            self._send(json.dumps(reply))

    def command(self, payload: Any) -> dict[str, Any] | None:
        """Carry out a control message that came over HTTP; errors become 400 responses."""
        try:
            if not isinstance(payload, dict):
                raise ControlError("invalid_message", "The body must be a JSON object.")
            return apply(parse(payload), self.speaker, self.speakers_for)
        except ControlError as exc:
            raise ApiError(400, exc.code, exc.message) from exc

    def stats_event(self) -> dict[str, Any]:
        """The ``stats`` event: what the page charts, about once a second."""
        receive = self.pipeline.receive_stats
        return {
            "type": "stats",
            "engine_delay_ms": self.engine.delay_ms,
            "frames_out": self.pipeline.output.frames_sent,
            "underruns": self.pipeline.underruns,
            "packets_in": receive.packets,
            "concealed": receive.concealed,
            "late_dropped": receive.late_dropped,
            "jitter_ms": receive.jitter_ms,
            "stages_ms": self.pipeline.stage_summary_ms(),
            **self.pipeline.stats_fields(),
        }

    async def report_stats(self) -> None:
        """Publish ``stats`` once a second for as long as the session lives (each built
        only when someone listens: a call without a data channel or SSE stream, such as a
        WHIP publisher's, would pay for summaries nobody reads)."""
        while True:
            await asyncio.sleep(STATS_INTERVAL_SECONDS)
            if self.events.heard:
                self.events.publish(self.stats_event())

    def describe(self) -> dict[str, Any]:
        return {
            "session_id": self.id,
            "engine": self.engine.name,
            "kind": self.engine.kind.value,
            "connection_state": self.connection_state,
            "resumes": self.resumes,
            "frames_out": self.pipeline.output.frames_sent,
            "receive": vars(self.pipeline.receive_stats),
            "stats": self.stats_event(),
            **self.pipeline.describe(),
            **({"socket": self.socket_output.describe()} if self.socket_output else {}),
        }
