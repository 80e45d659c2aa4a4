"""The speak-session control protocol, shared by the data channel and the HTTP routes.

Client -> server messages are JSON objects with a ``type``:

- ``{"type": "speak", "text": T, "id"?: ID}``: a complete utterance, queued FIFO;
- ``{"type": "speak_delta", "text": piece, "id"?: ID}``: a streamed piece of an utterance;
- ``{"type": "flush", "id"?: ID}``: speak the rest of the streamed utterance;
- ``{"type": "interrupt"}``: stop speaking now and drop everything queued.

Text in a script the engine's languages are not written in is refused
(``unsupported_language``, naming the engines that can speak it) rather than read out as
noise.

Anything malformed gets ``{"type": "error", "error": code, "message": sentence}`` back and
changes nothing; the session goes on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from media.pipeline.base import TextInput
from media.pipeline.speak import SpeechQueueFull, UnsupportedLanguage

MAX_MESSAGE_BYTES = 16 * 1024
MAX_TEXT_CHARS = 4000
MAX_ID_CHARS = 128
MESSAGE_TYPES = ("speak", "speak_delta", "flush", "interrupt")


class ControlError(Exception):
    """A message the server cannot act on, with a stable code for the client."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def event(self) -> dict[str, Any]:
        return {"type": "error", "error": self.code, "message": self.message}


@dataclass(frozen=True)
class Command:
    type: str
    text: str | None = None
    id: str | None = None


Speaker = TextInput  # what a command needs from a speak session
# The engines that can speak a text, by name (for the message of ``unsupported_language``).
Alternatives = Callable[[str], list[str]]


def decode(raw: str | bytes, max_bytes: int = MAX_MESSAGE_BYTES) -> dict[str, Any]:
    """Bytes or text to a JSON object, or a ControlError saying what is wrong."""
    if isinstance(raw, bytes):
        if len(raw) > max_bytes:
            raise ControlError("message_too_large", f"Messages are limited to {max_bytes} bytes.")
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ControlError("invalid_encoding", "Messages must be UTF-8 JSON.") from exc
    if len(raw.encode("utf-8", "surrogatepass")) > max_bytes:
        raise ControlError("message_too_large", f"Messages are limited to {max_bytes} bytes.")
    try:
        payload = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        # ValueError: JSONDecodeError, and a number past Python's integer digit limit.
        raise ControlError("invalid_json", "The message is not valid JSON.") from exc
    if not isinstance(payload, dict):
        raise ControlError("invalid_message", "A message must be a JSON object with a 'type'.")
    return payload


def parse(payload: dict[str, Any]) -> Command:
    """Check one decoded message against the protocol."""
    kind = payload.get("type")
    if not isinstance(kind, str):
        raise ControlError("invalid_message", "A message needs a string 'type'.")
    if kind not in MESSAGE_TYPES:
        raise ControlError("unknown_type", f"Unknown message type '{kind[:40]}'.")
    utterance_id = payload.get("id")
    if utterance_id is not None and (
        not isinstance(utterance_id, str) or not 0 < len(utterance_id) <= MAX_ID_CHARS
    ):
        raise ControlError("invalid_id", f"'id' must be a string of 1-{MAX_ID_CHARS} characters.")
    text = payload.get("text")
    if kind in ("speak", "speak_delta"):
        if not isinstance(text, str):
            raise ControlError("missing_text", f"A {kind} message needs a string 'text'.")
        if kind == "speak" and not text.strip():
            raise ControlError("missing_text", "A speak message needs some text to say.")
        if len(text) > MAX_TEXT_CHARS:
            raise ControlError(
                "text_too_long", f"'text' is limited to {MAX_TEXT_CHARS} characters."
            )
    return Command(kind, text, utterance_id)


def apply(
    command: Command, speaker: Speaker, alternatives: Alternatives | None = None
) -> dict[str, Any] | None:
    """Carry out a command; returns an acknowledgement event when there is one."""
    try:
        return _carry_out(command, speaker)
    except SpeechQueueFull as exc:
        raise ControlError(
            "queue_full", f"Too much speech is queued ({exc}); wait for some to finish."
        ) from exc
    except UnsupportedLanguage as exc:
        others = alternatives(command.text or "") if alternatives is not None else []
        raise ControlError(
            "unsupported_language",
            f"Engine '{exc.engine}' speaks {', '.join(exc.languages)}; this text is written "
            f"in {', '.join(s.lower() for s in exc.scripts)} script. Engines that can speak "
            f"it: {', '.join(others) or 'none here'}.",
        ) from exc


def _carry_out(command: Command, speaker: Speaker) -> dict[str, Any] | None:
    if command.type == "speak":
        assert command.text is not None
        return {"type": "speech_queued", "id": speaker.speak(command.text, command.id)}
    if command.type == "speak_delta":
        assert command.text is not None
        speaker.speak_delta(command.text, command.id)
        return None
    if command.type == "flush":
        speaker.flush(command.id)
        return None
    speaker.interrupt()
    return None
