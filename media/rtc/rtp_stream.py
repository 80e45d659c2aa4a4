"""One session's outgoing RTP audio, sent without aiortc's per-session sender loop.

aiortc sends each frame through a coroutine per sender: the track's ``recv()``, a PyAV
packet, an ``RtpPacket`` object serialised with its header extensions, then three awaits
down to the socket. Here a frame is a 12-byte header packed into one buffer with the
extension block built once per stream (audio negotiates only the mid, which is constant),
SRTP-protected and handed to the UDP socket in one synchronous call
(``media.rtc.compat.protected_rtp_send``). What aiortc's RTCP sender reports read from its
sender (packets, octets, the last packet's RTP and NTP times) is kept up to date, so the far
end's receiver reports and round-trip times work as before.
"""

from __future__ import annotations

import random
import struct
import time
from collections.abc import Callable

from aiortc.rtcrtpparameters import RTCRtpSendParameters
from aiortc.rtp import HeaderExtensions, HeaderExtensionsMap

RTP_VERSION_BITS = 0x80
EXTENSION_BIT = 0x10
MARKER_BIT = 0x80
NTP_EPOCH_OFFSET = 2208988800  # seconds from 1900 (NTP) to 1970 (Unix)
_HEADER = struct.Struct("!BBHII")

SendPacket = Callable[[bytes], None]
# (packets, octets of payload, the last packet's RTP timestamp, its NTP time)
SentReport = Callable[[int, int, int, int], None]


def ntp_now() -> int:
    """The wall clock as a 64-bit NTP timestamp (what an RTCP sender report carries)."""
    return int((time.time() + NTP_EPOCH_OFFSET) * (1 << 32))


def extension_block(parameters: RTCRtpSendParameters) -> bytes:
    """The header extension block every packet of the stream carries (empty: none)."""
    extensions = HeaderExtensionsMap()
    extensions.configure(parameters)
    profile, value = extensions.set(HeaderExtensions(mid=parameters.muxId))
    if not value:
        return b""
    return struct.pack("!HH", profile, len(value) >> 2) + value


class RtpAudioStream:
    """Packs and sends one Opus payload per 20 ms frame on one SSRC."""

    def __init__(
        self,
        parameters: RTCRtpSendParameters,
        ssrc: int,
        send: SendPacket,
        on_sent: SentReport | None = None,
    ) -> None:
        self._send = send
        self._on_sent = on_sent
        self._ssrc = ssrc
        self._extensions = extension_block(parameters)
        self._first_byte = RTP_VERSION_BITS | (EXTENSION_BIT if self._extensions else 0)
        # Each payload is a whole frame, the last (only) one of its frame: marker set, as
        # aiortc's sender sets it.
        payload_type = parameters.codecs[0].payloadType
        assert payload_type is not None, "a negotiated codec has a payload type"
        self._second_byte = MARKER_BIT | payload_type
        self._sequence = random.getrandbits(16)
        self._timestamp_origin = random.getrandbits(32)
        self.packets = 0
        self.octets = 0

    def send(self, payload: bytes, pts: int) -> None:
        """Send one frame's payload stamped ``pts`` (samples at the codec's clock rate).

        Raises ``ConnectionError`` when the transport is not (or no longer) connected.
        """
        timestamp = (self._timestamp_origin + pts) & 0xFFFFFFFF
        header = _HEADER.pack(
            self._first_byte, self._second_byte, self._sequence, timestamp, self._ssrc
        )
        self._send(header + self._extensions + payload)
        self._sequence = (self._sequence + 1) & 0xFFFF
        self.packets += 1
        self.octets += len(payload)
        if self._on_sent is not None:
            self._on_sent(self.packets, self.octets, timestamp, ntp_now())
