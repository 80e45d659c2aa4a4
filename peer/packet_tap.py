"""The packets a peer receives, as they came off the wire, judged by an independent decoder.

What the peer *played* (``peer.probe.silence_after``) includes its own playout delay; what
matters for a server's interrupt is when its last packet of speech left. Over loopback a
packet's arrival at the peer is its departure from the server to within a fraction of a
millisecond, so the tap keeps each packet's arrival, and decodes them in sequence order
with a decoder of its own (the peer's receive path conceals and stretches; this one only
decodes) to say which carried sound.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import numpy as np

from media.audio.opus import OpusDecoder

# A decoded packet whose loudest sample is below this (-60 dBFS) carries no sound: strict,
# so that a codec's ringing after a fade counts as sound.
SILENT_PEAK = 10 ** (-60 / 20)
KEPT_PACKETS = 250  # 5 s of 20 ms packets: enough around an interrupt, bounded on a long call
WARM_UP_PACKETS = 10  # decoded before the moment judged, so the decoder is in step

Receive = Callable[[int, int, bytes], None]


class PacketTap:
    """Wraps a receive path's ``receive(seq, timestamp, payload)``; keeps recent packets."""

    def __init__(self, receive_path: object, clock: Callable[[], float] = time.monotonic) -> None:
        self.packets: deque[tuple[float, int, bytes]] = deque(maxlen=KEPT_PACKETS)
        inner: Receive = receive_path.receive  # type: ignore[attr-defined]

        def tapped(seq: int, timestamp: int, payload: bytes) -> None:
            self.packets.append((clock(), seq, bytes(payload)))
            inner(seq, timestamp, payload)

        receive_path.receive = tapped  # type: ignore[attr-defined]

    def levels_after(self, at: float) -> list[tuple[float, float]]:
        """(arrival, peak) of each packet that arrived after ``at`` (monotonic seconds), in
        sequence order, decoded from ``WARM_UP_PACKETS`` before it on."""
        ordered = sorted(self.packets, key=lambda packet: _unwrapped(packet[1], self.packets))
        first = next((i for i, packet in enumerate(ordered) if packet[0] > at), len(ordered))
        decoder = OpusDecoder(channels=1)
        levels = []
        try:
            for arrival, _, payload in ordered[max(0, first - WARM_UP_PACKETS) :]:
                pcm = decoder.decode(payload)
                if arrival > at:
                    levels.append((arrival, float(np.abs(pcm).max()) if len(pcm) else 0.0))
        finally:
            decoder.close()
        return levels

    def last_speech_after(self, at: float) -> float | None:
        """Milliseconds from ``at`` to the arrival of the last packet with sound after it
        (0 when none had sound); None when no packet came after ``at``. After an interrupt
        everything that follows should be silent, so the last one is the answer, not the
        one before the first silent packet (speech has silent packets between words)."""
        levels = self.levels_after(at)
        if not levels:
            return None
        sounding = [arrival for arrival, peak in levels if peak >= SILENT_PEAK]
        return round(1000 * (sounding[-1] - at), 2) if sounding else 0.0

    def audible_after_silence(self, at: float) -> int:
        """Packets with sound after the first silent one that followed ``at``."""
        levels = self.levels_after(at)
        silent = next((i for i, (_, peak) in enumerate(levels) if peak < SILENT_PEAK), None)
        if silent is None:
            return 0
        return sum(peak >= SILENT_PEAK for _, peak in levels[silent:])


def _unwrapped(seq: int, packets: deque[tuple[float, int, bytes]]) -> int:
    """``seq`` made comparable across a wrap of the 16-bit counter, relative to the oldest."""
    return (seq - packets[0][1]) % (1 << 16)
