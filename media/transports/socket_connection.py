"""One client socket attached to a session: its audio in, the session's audio out, and the
client's messages.

To the session it is both the connection (``state``, ``close()``) and the message channel
(``send``, ``on("message")``) that a WebRTC call's peer connection and data channel are, so
the control protocol, the events and the lifecycle are the same whatever the transport.
The transport's own messages are handled here:

- ``{"type": "ack", "seq": N}``: the client has played every frame up to ``N``
  (``credit_ms`` may come with it);
- ``{"type": "credit", "credit_ms": M}``: the client can now buffer ``M`` ms;
- ``{"type": "bye"}``: the client hangs up.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol

from media.transports.socket_frames import SEQ_MOD
from media.transports.socket_input import SocketInput
from media.transports.socket_output import (
    MAX_CREDIT_MS,
    MIN_CREDIT_MS,
    SocketLink,
    SocketOutput,
)

TRANSPORT_MESSAGES = ("ack", "credit")
HANG_UP = "bye"
# Why the server closes a socket it is done with (4000-4999: the application's own codes).
CLOSE_NORMAL = 1000  # the session ended (a ``session_ended`` event said why)
CLOSE_REPLACED = 4409  # another connection resumed the session


class ClosableLink(SocketLink, Protocol):
    async def close(self, code: int, reason: str) -> None: ...


class SocketConnection:
    """The session's side of one socket; it lives until the socket closes or is replaced."""

    def __init__(self, link: ClosableLink, output: SocketOutput, audio_in: SocketInput) -> None:
        self._link = link
        self._output = output
        self.input = audio_in
        self.state = "connected"
        self.readyState = "open"
        self._handlers: dict[str, Callable[..., Any]] = {}

    @property
    def credit_ms(self) -> int:
        return self._output.credit_ms

    def start(self) -> None:
        """The client has its ``ready``: audio and events may flow."""
        self._output.start()

    # --- the message channel the session reads -------------------------------------------

    def send(self, data: str) -> None:
        if self.readyState == "open":
            self._output.send_text(data)

    def on(self, event: str, handler: Callable[..., Any]) -> None:
        self._handlers[event] = handler

    # --- what the client sends -----------------------------------------------------------

    def receive_bytes(self, data: bytes) -> None:
        self.input.receive(data)

    def receive_text(self, raw: str) -> bool:
        """A transport message is handled here; anything else is the session's to answer.

        Returns True for ``bye``: the client hangs up.
        """
        kind, message = _typed(raw)
        if kind == HANG_UP:
            return True
        if kind not in TRANSPORT_MESSAGES or message is None:
            handler = self._handlers.get("message")
            if handler is not None:
                handler(raw)
            return False
        error = self._apply(message)
        if error is not None:
            self.send(json.dumps({"type": "error", "error": "invalid_message", "message": error}))
        return False

    def _apply(self, message: dict[str, Any]) -> str | None:
        credit = message.get("credit_ms")
        if credit is not None or message["type"] == "credit":
            if type(credit) is not int or not MIN_CREDIT_MS <= credit <= MAX_CREDIT_MS:
                return f"'credit_ms' must be an integer from {MIN_CREDIT_MS} to {MAX_CREDIT_MS}."
            self._output.grant(credit)
        if message["type"] == "ack":
            seq = message.get("seq")
            if type(seq) is not int or not 0 <= seq < SEQ_MOD:
                return f"'seq' must be an integer from 0 to {SEQ_MOD - 1}."
            self._output.ack(seq)
        return None

    # --- the end -------------------------------------------------------------------------

    def closed_by_client(self) -> None:
        """The socket closed from the client's side: nothing more can be written to it."""
        self._stop()

    def _stop(self) -> bool:
        if self.state == "closed":
            return False
        self.state = "closed"
        self.readyState = "closed"
        self.input.close()
        close = self._handlers.get("close")
        if close is not None:
            close()
        return True

    async def close(self) -> None:
        """The session lets this socket go (detached, replaced, or ended)."""
        self._stop()
        await self._output.detach()
        if self._output.session_ended:
            await self._link.close(CLOSE_NORMAL, "the session ended")
        else:
            await self._link.close(CLOSE_REPLACED, "the session continues on another connection")


def _typed(raw: str) -> tuple[object, dict[str, Any] | None]:
    """A message's ``type`` and the message, as parsed; (None, None) when it is not a JSON
    object (the session's control protocol says what is wrong with it)."""
    try:
        message = json.loads(raw)
    except (ValueError, RecursionError):
        return None, None
    if not isinstance(message, dict):
        return None, None
    return message.get("type"), message
