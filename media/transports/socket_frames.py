"""The binary audio message of the WebSocket transport, both directions.

Each message is an 8-byte header and a payload::

    uint32 seq        big-endian: 0, 1, 2, ... per direction, continuing across a resume
    uint32 timestamp  big-endian: the first sample's position in the stream, at the
                      codec's rate (wrapping at 2**32)
    payload           the codec's audio (PCM16 little-endian samples, mu-law bytes or one
                      Opus packet); from the server, an empty payload is 20 ms of silence

The sequence number is what the client acknowledges and what a resume restarts from.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

HEADER = struct.Struct(">II")
SEQ_MOD = 1 << 32


class MalformedFrame(ValueError):
    """A binary message too short to hold the header."""


@dataclass(frozen=True)
class AudioMessage:
    seq: int
    timestamp: int
    payload: bytes


def pack(seq: int, timestamp: int, payload: bytes) -> bytes:
    return HEADER.pack(seq % SEQ_MOD, timestamp % SEQ_MOD) + payload


def unpack(data: bytes) -> AudioMessage:
    if len(data) < HEADER.size:
        raise MalformedFrame(
            f"an audio message starts with an {HEADER.size}-byte header (seq, timestamp)"
        )
    seq, timestamp = HEADER.unpack_from(data)
    return AudioMessage(seq, timestamp, bytes(data[HEADER.size :]))
