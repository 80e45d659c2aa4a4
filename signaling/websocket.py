"""The WebSocket transport's handshake: the client's ``hello`` and the server's ``ready``.

The first message on ``GET /ws`` is a JSON ``hello``; everything after it is audio (binary,
``media.transports.socket_frames``) or the same JSON control messages as the data channel,
plus the transport's own ``ack``/``credit``::

    {"type": "hello",
     "engine": "echo",                             optional: the server's default engine
     "options": {...},                             optional: the engine's options
     "codec": {"name": "pcm16", "rate": 16000},    optional: pcm16 at 8/16/24/48 kHz
                                                   (default 16000), or {"name": "opus"}
     "credit_ms": 1000,                            optional: audio the client can buffer
     "resume": {"session_id": ..., "token": ...,   only to continue a detached session
                "played_seq": 41}}                 the last frame the client played

A malformed hello is refused with the same codes the HTTP API uses (``ApiError``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from media.transports.codecs import PCM_RATES
from media.transports.socket_frames import SEQ_MOD
from media.transports.socket_output import DEFAULT_CREDIT_MS, MAX_CREDIT_MS, MIN_CREDIT_MS
from signaling.errors import ApiError

DEFAULT_PCM_RATE = 16_000
OPUS_RATE = 48_000
CODECS = ("pcm16", "opus")
MAX_HELLO_BYTES = 16 * 1024
SEQ_MAX = SEQ_MOD - 1


@dataclass(frozen=True)
class SocketCodecChoice:
    name: str
    rate: int


DEFAULT_CODEC = SocketCodecChoice("pcm16", DEFAULT_PCM_RATE)


@dataclass(frozen=True)
class SocketResume:
    session_id: str
    token: str
    played_seq: int | None  # None: the client played nothing of what it was sent


@dataclass(frozen=True)
class SocketHello:
    engine: str | None = None
    options: dict[str, Any] | None = None
    codec: SocketCodecChoice | None = None  # None: the default (new) or unchanged (resume)
    credit_ms: int = DEFAULT_CREDIT_MS
    resume: SocketResume | None = None


def _invalid(message: str) -> ApiError:
    return ApiError(400, "invalid_hello", message)


def _object(raw: str | bytes) -> dict[str, Any]:
    if len(raw) > MAX_HELLO_BYTES:
        raise ApiError(
            413, "message_too_large", f"The hello is limited to {MAX_HELLO_BYTES} bytes."
        )
    try:
        payload = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise _invalid("The first message must be a JSON hello.") from exc
    if not isinstance(payload, dict) or payload.get("type") != "hello":
        raise _invalid('The first message must be {"type": "hello", ...}.')
    return payload


def parse_codec(raw: Any) -> SocketCodecChoice:
    if not isinstance(raw, dict):
        raise _invalid("'codec' must be an object with a 'name'.")
    name = raw.get("name")
    if name not in CODECS:
        raise ApiError(400, "unsupported_codec", f"'codec.name' must be one of {list(CODECS)}.")
    if name == "opus":
        rate = raw.get("rate", OPUS_RATE)
        if type(rate) is not int or rate != OPUS_RATE:
            raise ApiError(400, "unsupported_codec", "Opus is carried at 48000 Hz.")
        return SocketCodecChoice("opus", OPUS_RATE)
    rate = raw.get("rate", DEFAULT_PCM_RATE)
    if type(rate) is not int or rate not in PCM_RATES:
        raise ApiError(400, "unsupported_codec", f"'codec.rate' must be one of {list(PCM_RATES)}.")
    return SocketCodecChoice("pcm16", rate)


def parse_credit(raw: Any) -> int:
    if type(raw) is not int or not MIN_CREDIT_MS <= raw <= MAX_CREDIT_MS:
        raise _invalid(f"'credit_ms' must be an integer from {MIN_CREDIT_MS} to {MAX_CREDIT_MS}.")
    return raw


def parse_seq(raw: Any, name: str) -> int:
    if type(raw) is not int or not 0 <= raw <= SEQ_MAX:
        raise _invalid(f"'{name}' must be an integer from 0 to {SEQ_MAX}.")
    return raw


def _resume(raw: Any) -> SocketResume:
    if not isinstance(raw, dict):
        raise _invalid("'resume' must be an object with 'session_id' and 'token'.")
    session_id, token = raw.get("session_id"), raw.get("token")
    if not isinstance(session_id, str) or not isinstance(token, str):
        raise _invalid("'resume' needs 'session_id' and 'token' strings.")
    played = raw.get("played_seq")
    return SocketResume(
        session_id, token, None if played is None else parse_seq(played, "resume.played_seq")
    )


def parse_hello(raw: str | bytes) -> SocketHello:
    """The client's first message, checked; ``ApiError`` says what is wrong with it."""
    payload = _object(raw)
    engine = payload.get("engine")
    if engine is not None and not isinstance(engine, str):
        raise _invalid("'engine' must be a string.")
    options = payload.get("options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "invalid_options", "'options' must be an object.")
    codec = payload.get("codec")
    credit = payload.get("credit_ms")  # null, like a missing field, means the default
    resume = payload.get("resume")
    return SocketHello(
        engine=engine,
        options=options,
        codec=None if codec is None else parse_codec(codec),
        credit_ms=DEFAULT_CREDIT_MS if credit is None else parse_credit(credit),
        resume=None if resume is None else _resume(resume),
    )


def ready_message(
    session_id: str,
    resume_token: str,
    engine: str,
    kind: str,
    codec: SocketCodecChoice,
    credit_ms: int,
    next_seq: int,
    resumed: bool,
) -> str:
    """The server's answer to a hello: the session, its codec, and the first frame's seq."""
    return json.dumps(
        {
            "type": "ready",
            "session_id": session_id,
            "resume_token": resume_token,
            "engine": engine,
            "kind": kind,
            "codec": {"name": codec.name, "rate": codec.rate},
            "frame_ms": 20,
            "credit_ms": credit_ms,
            "next_seq": next_seq,
            "resumed": resumed,
        }
    )
