"""Twilio's wire formats: the request signature, the TwiML that opens a Media Stream, and
the stream's JSON messages.

A phone call reaches the server through Twilio in two steps: Twilio asks a webhook what to
do with the call and gets TwiML back, ``<Connect><Stream>``, naming a WebSocket; it then
opens that WebSocket and exchanges JSON text messages on it for the rest of the call, the
caller's audio and ours carried as base64 mu-law at 8 kHz. Both requests come from the open
internet, so both are checked against ``X-Twilio-Signature`` before anything else.

This module knows the formats only: no sockets, no aiohttp, no audio. The parser refuses
anything it cannot read with :class:`TwilioProtocolError` and a stable code, and ignores
fields it does not use, so a Twilio that adds fields keeps working.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias
from xml.sax.saxutils import escape

MAX_MESSAGE_BYTES = 64 * 1024
# Twilio refuses a <Parameter> whose name and value together reach 500 characters.
MAX_PARAMETER_CHARS = 499
# Enough for any sequence number, chunk or timestamp in a call that lasts years, and short
# of Python's limit on the digits it converts to an int.
_MAX_DIGITS = 18
_ATTRIBUTE_ENTITIES = {'"': "&quot;", "\n": "&#10;", "\r": "&#13;", "\t": "&#9;"}
# Characters XML 1.0 cannot carry at all, escaped or not (its production Char).
_NOT_XML = re.compile(r"[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _shown(text: str) -> str:
    """``text`` quoted for an error message, cut short: it comes from outside."""
    return repr(text if len(text) <= 40 else text[:40] + "...")


# ---------------------------------------------------------------------------------------------
# Request signatures


def signature(auth_token: str, url: str, params: Mapping[str, str]) -> str:
    """``X-Twilio-Signature`` for a request: base64 of HMAC-SHA1, keyed by the auth token,
    over the URL followed by every POST parameter's name and value, sorted by name.

    ``url`` is the URL exactly as Twilio requested it, query string included, which behind
    a proxy is the public one, not the one the server sees. A GET has no parameters.
    """
    signed = url + "".join(key + params[key] for key in sorted(params))
    # surrogatepass: a forged request's lone surrogates make a signature that fails to
    # match, not an exception.
    data = signed.encode("utf-8", "surrogatepass")
    digest = hmac.new(auth_token.encode(), data, hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def signature_valid(
    auth_token: str, url: str, params: Mapping[str, str], presented: str | None
) -> bool:
    """Whether ``presented`` (the header's value; None when it is missing) signs the request.

    Compared in constant time, so a forger cannot learn the signature a byte at a time from
    how long a refusal takes.
    """
    if not presented:
        return False
    expected = signature(auth_token, url, params).encode()
    return hmac.compare_digest(expected, presented.encode("utf-8", "surrogatepass"))


def stream_token(auth_token: str, call_sid: str) -> str:
    """The secret the TwiML hands its stream (a ``<Parameter>``), checked on ``start``.

    Whether Twilio signs the stream's WebSocket handshake is not something the server can
    rely on; a parameter it can compute only from the auth token and the call's id, and
    that Twilio echoes in ``start``, ties the stream to a call the webhook answered.
    """
    digest = hmac.new(auth_token.encode(), call_sid.encode("utf-8", "surrogatepass"), "sha256")
    return digest.hexdigest()[:32]


def stream_token_valid(auth_token: str, call_sid: str, presented: str | None) -> bool:
    if not presented:
        return False
    expected = stream_token(auth_token, call_sid).encode()
    return hmac.compare_digest(expected, presented.encode("utf-8", "surrogatepass"))


# ---------------------------------------------------------------------------------------------
# TwiML


def _attribute(value: str) -> str:
    """``value`` as a double-quoted XML attribute; line breaks and tabs as character
    references, which attribute-value normalisation would otherwise turn into spaces."""
    if _NOT_XML.search(value):
        raise ValueError(f"{_shown(value)} holds a character XML cannot carry.")
    return '"' + escape(value, _ATTRIBUTE_ENTITIES) + '"'


def connect_stream_twiml(stream_url: str, parameters: Mapping[str, str]) -> str:
    """TwiML connecting the call to a bidirectional Media Stream at ``stream_url``.

    Twilio allows no query string in a stream's URL, so whatever the WebSocket needs to
    know about the call travels as ``<Parameter>`` elements, which come back in the
    ``start`` message's ``customParameters``. ``<Connect>`` (not ``<Start>``) makes the
    stream bidirectional: audio can be sent back, and the call lasts as long as the socket.

    Raises ValueError for a parameter past Twilio's length limit, or for text XML cannot
    carry (control characters), rather than hand Twilio TwiML it would refuse mid-call.
    """
    for name, value in parameters.items():
        if len(name) + len(value) > MAX_PARAMETER_CHARS:
            raise ValueError(
                f"Parameter {name[:40]!r}: name and value together are limited to "
                f"{MAX_PARAMETER_CHARS} characters."
            )
    children = "".join(
        f"<Parameter name={_attribute(name)} value={_attribute(value)}/>"
        for name, value in parameters.items()
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f"<Response><Connect><Stream url={_attribute(stream_url)}>{children}</Stream>"
        "</Connect></Response>"
    )


# ---------------------------------------------------------------------------------------------
# Media Stream messages, Twilio -> server


class TwilioProtocolError(Exception):
    """A Media Stream message the server cannot read, with a stable code for logs and
    metrics."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Connected:
    """The first message on the socket, before the stream has an identity."""

    protocol: str
    version: str


@dataclass(frozen=True)
class Start:
    """The stream's metadata, sent once after ``connected``.

    ``custom_parameters`` are the ``<Parameter>`` elements of the TwiML. Twilio documents
    the media format as always ``audio/x-mulaw``, 8000 Hz, one channel; it is reported as
    sent, for the caller to refuse anything else.
    """

    stream_sid: str
    call_sid: str
    account_sid: str
    tracks: tuple[str, ...]
    custom_parameters: dict[str, str] = field(hash=False)
    encoding: str
    sample_rate: int
    channels: int


@dataclass(frozen=True)
class Media:
    """A chunk of one track's audio: ``payload`` is raw mu-law, in practice 20 ms (160
    bytes), though Twilio documents no size.

    ``chunk`` counts from 1; ``timestamp_ms`` is the chunk's presentation time from the
    start of the stream, which says where audio is missing when chunks are lost.
    """

    stream_sid: str
    track: str
    chunk: int
    timestamp_ms: int
    payload: bytes


@dataclass(frozen=True)
class Mark:
    """A mark the server sent, echoed back once the audio queued before it has played, or
    at once when a ``clear`` dropped that audio."""

    stream_sid: str
    name: str


@dataclass(frozen=True)
class Dtmf:
    """A key the caller pressed (bidirectional streams only)."""

    stream_sid: str
    digit: str


@dataclass(frozen=True)
class Stop:
    """The last message: the call ended (a bidirectional stream ends only with its call)."""

    stream_sid: str


TwilioMessage: TypeAlias = Connected | Start | Media | Mark | Dtmf | Stop


def _get(parent: Mapping[str, Any], key: str, path: str) -> Any:
    if key not in parent:
        raise TwilioProtocolError("missing_field", f"The message has no '{path}{key}'.")
    return parent[key]


def _wrong(name: str, expected: str) -> TwilioProtocolError:
    return TwilioProtocolError("invalid_field", f"'{name}' must be {expected}.")


def _text(parent: Mapping[str, Any], key: str, path: str = "") -> str:
    value = _get(parent, key, path)
    if not isinstance(value, str):
        raise _wrong(path + key, "a string")
    return value


def _section(parent: Mapping[str, Any], key: str, path: str = "") -> dict[str, Any]:
    value = _get(parent, key, path)
    if not isinstance(value, dict):
        raise _wrong(path + key, "an object")
    return value


def _count(parent: Mapping[str, Any], key: str, path: str, least: int = 0) -> int:
    """A whole number at or above ``least``, sent as a JSON number or as a string of digits
    (Twilio sends ``chunk`` and ``timestamp`` as strings)."""
    value = _get(parent, key, path)
    if isinstance(value, str) and value.isascii() and value.isdigit():
        if len(value) > _MAX_DIGITS:
            raise _wrong(path + key, f"at most {_MAX_DIGITS} digits")
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise _wrong(path + key, f"a whole number of at least {least}")
    return value


def _parameter(name: str, value: Any) -> str:
    """A custom parameter's value as a string: scalars as their JSON text (``5``, ``true``),
    which is how they were written; objects and arrays are refused."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        raise TwilioProtocolError(
            "invalid_field",
            f"Custom parameter {_shown(name)} must be a string, not an object or array.",
        )
    return json.dumps(value)


def _connected(message: dict[str, Any]) -> Connected:
    return Connected(_text(message, "protocol"), _text(message, "version"))


def _start(message: dict[str, Any]) -> Start:
    start = _section(message, "start")
    tracks = _get(start, "tracks", "start.")
    if not isinstance(tracks, list) or not all(isinstance(track, str) for track in tracks):
        raise _wrong("start.tracks", "an array of strings")
    parameters = start.get("customParameters", {})
    if not isinstance(parameters, dict):
        raise _wrong("start.customParameters", "an object")
    media_format = _section(start, "mediaFormat", "start.")
    return Start(
        stream_sid=_text(message, "streamSid"),
        call_sid=_text(start, "callSid", "start."),
        account_sid=_text(start, "accountSid", "start."),
        tracks=tuple(tracks),
        custom_parameters={name: _parameter(name, value) for name, value in parameters.items()},
        encoding=_text(media_format, "encoding", "start.mediaFormat."),
        sample_rate=_count(media_format, "sampleRate", "start.mediaFormat.", least=1),
        channels=_count(media_format, "channels", "start.mediaFormat.", least=1),
    )


def _media(message: dict[str, Any]) -> Media:
    media = _section(message, "media")
    encoded = _text(media, "payload", "media.")
    try:
        payload = base64.b64decode(encoded, validate=True)
    except ValueError:  # binascii.Error, and non-ASCII text
        raise TwilioProtocolError("invalid_payload", "'media.payload' is not base64.") from None
    return Media(
        stream_sid=_text(message, "streamSid"),
        track=_text(media, "track", "media."),
        chunk=_count(media, "chunk", "media."),
        timestamp_ms=_count(media, "timestamp", "media."),
        payload=payload,
    )


def _mark(message: dict[str, Any]) -> Mark:
    return Mark(_text(message, "streamSid"), _text(_section(message, "mark"), "name", "mark."))


def _dtmf(message: dict[str, Any]) -> Dtmf:
    return Dtmf(_text(message, "streamSid"), _text(_section(message, "dtmf"), "digit", "dtmf."))


def _stop(message: dict[str, Any]) -> Stop:
    return Stop(_text(message, "streamSid"))


_PARSERS: dict[str, Callable[[dict[str, Any]], TwilioMessage]] = {
    "connected": _connected,
    "start": _start,
    "media": _media,
    "mark": _mark,
    "dtmf": _dtmf,
    "stop": _stop,
}


def _decode(raw: str | bytes, max_bytes: int) -> dict[str, Any]:
    """Bytes or text to a JSON object, or a TwilioProtocolError saying what is wrong."""
    size = len(raw) if isinstance(raw, bytes) else len(raw.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise TwilioProtocolError(
            "message_too_large", f"Messages are limited to {max_bytes} bytes."
        )
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise TwilioProtocolError("invalid_encoding", "Messages must be UTF-8 JSON.") from None
    try:
        message = json.loads(raw)
    except (ValueError, RecursionError):
        # ValueError: JSONDecodeError, and a number past Python's integer digit limit.
        raise TwilioProtocolError("invalid_json", "The message is not valid JSON.") from None
    if not isinstance(message, dict):
        raise TwilioProtocolError("invalid_message", "A message must be a JSON object.")
    return message


def parse_message(raw: str | bytes, max_bytes: int = MAX_MESSAGE_BYTES) -> TwilioMessage:
    """One Media Stream message from Twilio, or :class:`TwilioProtocolError`.

    Numbers may come as JSON numbers or as strings of digits, extra fields are ignored, and
    ``sequenceNumber`` is not read: messages arrive in order on one socket.
    """
    message = _decode(raw, max_bytes)
    event = message.get("event")
    if not isinstance(event, str):
        raise TwilioProtocolError("invalid_message", "A message needs a string 'event'.")
    parser = _PARSERS.get(event)
    if parser is None:
        raise TwilioProtocolError("unknown_event", f"Unknown event {_shown(event)}.")
    return parser(message)


# ---------------------------------------------------------------------------------------------
# Media Stream messages, server -> Twilio


def _dumps(message: dict[str, Any]) -> str:
    # Compact: a media message goes out 50 times a second for the length of the call.
    return json.dumps(message, separators=(",", ":"))


def media_message(stream_sid: str, payload: bytes) -> str:
    """Audio to play to the caller: raw mu-law at 8 kHz, no file header, any length.

    Twilio queues it behind what was sent before and plays it in order.
    """
    encoded = base64.b64encode(payload).decode("ascii")
    return _dumps({"event": "media", "streamSid": stream_sid, "media": {"payload": encoded}})


def mark_message(stream_sid: str, name: str) -> str:
    """A mark after the audio sent so far: Twilio echoes it back when that audio has played
    (at once if nothing is queued), which is how the server learns what the caller heard."""
    return _dumps({"event": "mark", "streamSid": stream_sid, "mark": {"name": name}})


def clear_message(stream_sid: str) -> str:
    """Drop every queued media message (barge-in).

    Twilio then echoes every mark still pending at once: the audio before those marks was
    dropped, not played, which is what the caller did not hear of an interrupted reply.
    """
    return _dumps({"event": "clear", "streamSid": stream_sid})
