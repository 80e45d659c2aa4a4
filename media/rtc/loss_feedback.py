"""In-band FEC that follows the loss the far end reports.

Opus can carry a low-bitrate copy of each frame in the next packet (LBRR), which a receive
path decodes in place of a lost packet (``media.rtc.receive``). For echoed speech with 4 %
random loss, PESQ-WB stays within 0.1 of the loss-free score with it and drops by 1.4
with concealment alone (libopus 96 kb/s mono, ``bench/netimpair.py``). The copy is not
free: libopus leaves its CELT-only mode for hybrid coding to make one, which costs more
CPU per frame, so a session pays for it only while its packets are being lost.

The far end says how many were, in the fraction-lost field of its RTCP receiver reports
(about one a second); aiortc's sender keeps the latest as ``remote-inbound-rtp`` stats.
The encoder's expected loss follows it, raised at once and lowered slowly (a loss burst is
often followed by another), and off (no copies) once the link has stayed clean a while.
A report of an outage (most packets lost) is not loss FEC can bridge, and is left out:
after a cut link the encoder would otherwise code for heavy loss, in SILK's narrower
band, for many seconds of a link that is clean again.

Reports come late: the first lost packets of a call are reported a second or two after
they were lost, and the first seconds of loss would go out without copies. The two
directions of a call mostly cross the same access link (the same Wi-Fi, the same mobile
cell), so the loss of the far end's own packets, seen by the receive path at once, stands
in until a report says otherwise: the first packet lost on the way in starts copies on
the way out. Echoed speech through 2 % loss both ways (``bench/netimpair.py``'s link, one
seed): without the stand-in the first four losses on the way back, at 4.4-5.9 s, had no
copies. A clean link loses nothing, so it never pays for this.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from typing import Any

from media.audio.opus import OpusEncoder, OpusError
from media.rtc.receive import AudioReceivePath

log = logging.getLogger(__name__)

POLL_S = 1.0  # receiver reports come about once a second
DECAY = 0.8  # per report without more loss: the estimate falls to a third in five seconds
OFF_BELOW = 0.005  # under half a percent the copies cost more than they save
MAX_PERCENT = 10  # 4 % loss scores the same at 5 and 10 (PESQ-WB 4.41, 4.40); more buys nothing
# A report with most packets lost is an outage (a cut link, a stalled network): copies in
# the next packet cannot bridge it, and it says nothing of the scattered loss after it.
OUTAGE = 0.5
# The receive path's loss is judged over at least this many packets (a second of 20 ms
# ones): one packet lost among the first few of an interval is not 30 % loss.
LOCAL_WINDOW_PACKETS = 50


class LossEstimate:
    """The expected loss percent from a series of reported loss fractions (0 to 1)."""

    def __init__(self) -> None:
        self._loss = 0.0

    def report(self, fraction: float) -> int:
        """Take one report; returns the percent to expect (0: no FEC)."""
        if fraction >= OUTAGE:
            fraction = 0.0
        self._loss = max(fraction, self._loss * DECAY, 0.0)
        if self._loss < OFF_BELOW:
            return 0
        return min(MAX_PERCENT, math.ceil(100 * self._loss))


class LossAdaptiveFec:
    """Keeps ``encoder``'s expected loss in step with what ``sender``'s far end reports.

    ``receive``, the receive path of the far end's stream, is told to report its losses
    here (:meth:`on_receive_loss`), so they start copies before a report comes. A no-op
    when the encoder was made without FEC (the far end did not ask for it).
    """

    def __init__(
        self, sender: Any, encoder: OpusEncoder, receive: AudioReceivePath | None = None
    ) -> None:
        self._sender = sender
        self._encoder = encoder
        self._received = None if receive is None else receive.stats
        if receive is not None:
            receive.on_loss = self.on_receive_loss
        self._estimate = LossEstimate()
        self._task: asyncio.Task[None] | None = None
        self.expected_percent = 0
        self._packets_at_poll = 0  # the receive path's packet count at the last poll

    def start(self) -> None:
        if self._encoder.fec and self._task is None:
            self._task = asyncio.create_task(self._follow(), name="loss-adaptive-fec")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def on_receive_loss(self, packets: int) -> None:
        """``packets`` of the far end's stream were lost on the way in: start copies on the
        way out now, unless the encoder already codes for loss (reports then lead)."""
        if self.expected_percent or self._task is None:  # coding for loss, or not following
            return
        arrived = 0 if self._received is None else self._received.packets
        window = max(arrived - self._packets_at_poll + packets, LOCAL_WINDOW_PACKETS)
        self._expect(self._estimate.report(packets / window))

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            fraction = await self._reported_fraction()
            if self._received is not None:
                self._packets_at_poll = self._received.packets
            if fraction is None:
                continue
            if not self._expect(self._estimate.report(fraction)):
                return  # the encoder was closed: the session is over

    def _expect(self, percent: int) -> bool:
        """Code for ``percent`` loss from now on; False once the encoder is closed."""
        if percent != self.expected_percent:
            try:
                self._encoder.set_expected_loss(percent)
            except OpusError:
                return False
            log.debug("expected loss %d%% -> %d%%", self.expected_percent, percent)
            self.expected_percent = percent
        return True

    async def _reported_fraction(self) -> float | None:
        """The far end's latest fraction lost (0 to 1), None before its first report."""
        stats = await self._sender.getStats()
        for entry in stats.values():
            if getattr(entry, "type", None) == "remote-inbound-rtp":
                # RFC 3550's 8-bit fixed point: lost packets / expected, times 256.
                return float(entry.fractionLost) / 256
        return None
