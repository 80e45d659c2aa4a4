"""One session's incoming RTP audio, taken from the socket without aiortc's receive loop.

aiortc hands every datagram through an ``asyncio.Queue`` to a coroutine per DTLS transport,
which wakes for it, unprotects it, parses it into an ``RtpPacket`` (header extensions
decoded) and awaits its way into the receiver, which keeps its statistics and passes it to
the jitter buffer. Here aioice's datagram callback hands an Opus packet to
:meth:`RtpIntake.take` already unprotected (``media.rtc.compat.divert_rtp``): the fixed
header is read with one ``struct`` call, the receiver's statistics (which its RTCP receiver
reports and ``getStats`` read) are kept, and the packet goes to the receive path, all in the
one callback. No header extension is decoded: the audio path reads none.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

RTP_VERSION = 2
HEADER_BYTES = 12
_HEADER = struct.Struct("!BBHII")
_EXTENSION_HEADER = struct.Struct("!HH")
PADDING_BIT = 0x20
EXTENSION_BIT = 0x10
CSRC_COUNT_MASK = 0x0F
PAYLOAD_TYPE_MASK = 0x7F


@dataclass(slots=True)
class RtpAudioPacket:
    """What the receive path and aiortc's receiver statistics read of a packet.

    The attribute names are ``aiortc.rtp.RtpPacket``'s, so the receive path's ``add`` and
    aiortc's ``StreamStatistics.add`` take either.
    """

    payload_type: int
    sequence_number: int
    timestamp: int
    ssrc: int
    payload: bytes


def parse_rtp(data: bytes) -> RtpAudioPacket | None:
    """The packet's header fields and payload; None where aiortc's parser would refuse it
    (too short, not version 2, truncated CSRC list or extension, bad padding)."""
    size = len(data)
    if size < HEADER_BYTES:
        return None
    first, second, sequence_number, timestamp, ssrc = _HEADER.unpack_from(data)
    if first >> 6 != RTP_VERSION:
        return None
    start = HEADER_BYTES + 4 * (first & CSRC_COUNT_MASK)
    if first & EXTENSION_BIT:
        if size < start + _EXTENSION_HEADER.size:
            return None
        _, words = _EXTENSION_HEADER.unpack_from(data, start)
        start += _EXTENSION_HEADER.size + 4 * words
    if start > size:
        return None
    end = size
    if first & PADDING_BIT:
        padding = data[-1]
        if not padding or padding > size - start:
            return None
        end -= padding
    return RtpAudioPacket(
        second & PAYLOAD_TYPE_MASK, sequence_number, timestamp, ssrc, data[start:end]
    )


class PacketSink(Protocol):
    """Where the packets go: ``media.rtc.receive.AudioReceivePath`` (which never raises)."""

    def add(self, packet: RtpAudioPacket) -> object: ...


class RtpIntake:
    """Reads each unprotected RTP packet of one stream and hands it on."""

    def __init__(self, sink: PacketSink, report: Callable[[RtpAudioPacket], None]) -> None:
        self._sink = sink
        self._report = report

    def take(self, data: bytes) -> None:
        packet = parse_rtp(data)
        if packet is None:
            return  # aiortc drops these too (its parser raises)
        self._report(packet)
        self._sink.add(packet)
