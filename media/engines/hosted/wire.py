"""Control messages between media workers and the model host, over one Unix socket.

A message is a small JSON header and an optional binary payload, each length-prefixed
(two big-endian uint32s, then the header, then the payload). Speech does not travel here:
a message names where in the connection's shared-memory ring (``ring.py``) its samples
are. Payloads carry what is sent once (a voice prompt clip), and a transform session's
chunks both ways (20 ms of float32 each: under 4 kB, a copy cheaper than a ring's
bookkeeping).

Both ends refuse what does not fit the format with :class:`ProtocolError` (a length over
its cap, a header that is not a JSON object with a string ``t``), so a garbled or hostile
peer ends its own connection and nothing else.
"""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

PREFIX = struct.Struct(">II")
MAX_HEADER_BYTES = 64 * 1024
# A voice prompt of 30 s at 48 kHz float32 is 5.8 MB.
MAX_PAYLOAD_BYTES = 16 * 1024 * 1024

Header = dict[str, Any]


class ProtocolError(Exception):
    """A message that breaks the format; the connection it came on is closed."""


def encode(header: Header, payload: bytes = b"") -> bytes:
    """One message as bytes on the wire."""
    body = json.dumps(header, separators=(",", ":")).encode()
    if len(body) > MAX_HEADER_BYTES or len(payload) > MAX_PAYLOAD_BYTES:
        raise ProtocolError("message too large")
    return PREFIX.pack(len(body), len(payload)) + body + payload


async def read_message(reader: asyncio.StreamReader) -> tuple[Header, bytes] | None:
    """The next message, or None when the peer closed the connection between messages."""
    try:
        prefix = await reader.readexactly(PREFIX.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise ProtocolError("connection closed inside a message") from exc
        return None
    header_len, payload_len = _lengths(prefix)
    try:
        body = await reader.readexactly(header_len)
        payload = await reader.readexactly(payload_len) if payload_len else b""
    except asyncio.IncompleteReadError as exc:
        raise ProtocolError("connection closed inside a message") from exc
    return _header(body), payload


class MessageReader:
    """The messages in a byte stream that comes in pieces (a protocol's ``data_received``)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[Header, bytes]]:
        """The messages ``data`` completes, in order; raises :class:`ProtocolError`."""
        buffer = self._buffer
        buffer += data
        messages = []
        while len(buffer) >= PREFIX.size:
            header_len, payload_len = _lengths(buffer)
            body_end = PREFIX.size + header_len
            end = body_end + payload_len
            if len(buffer) < end:
                break
            messages.append(
                (_header(bytes(buffer[PREFIX.size : body_end])), bytes(buffer[body_end:end]))
            )
            del buffer[:end]
        return messages


def _lengths(prefix: bytes | bytearray) -> tuple[int, int]:
    header_len, payload_len = PREFIX.unpack_from(prefix)
    if header_len > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {header_len} bytes (at most {MAX_HEADER_BYTES})")
    if payload_len > MAX_PAYLOAD_BYTES:
        raise ProtocolError(f"payload of {payload_len} bytes (at most {MAX_PAYLOAD_BYTES})")
    return header_len, payload_len


def _header(body: bytes) -> Header:
    try:
        header = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError("header is not JSON") from exc
    if not isinstance(header, dict) or not isinstance(header.get("t"), str):
        raise ProtocolError("header is not an object with a string 't'")
    return header
