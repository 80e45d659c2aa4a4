"""The audio receive path: RTP packets in arrival order to in-order 20 ms PCM frames, fast.

aiortc's audio path holds four packets (80 ms) in a fixed-prefetch jitter buffer, stalls
on a lost packet until sixteen more have arrived, decodes in a thread with no loss
concealment and queues the frames without bound. This path instead:

- releases a packet the moment it is next in sequence (no fixed prefetch);
- when a packet is missing, waits for it at most ``margin`` (zero on a clean link), then
  conceals it: from the next packet's in-band FEC copy when there is one, else with libopus
  packet-loss concealment; gaps longer than ``MAX_CONCEALED_FRAMES`` are skipped, not
  filled with a long synthetic tail;
- adapts ``margin`` to the reordering it measures: a packet that arrives after its slot was
  concealed raises the margin to cover that lateness, and quiet periods let it decay;
- drops packets that arrive too late or twice (counted), so delay never accumulates;
- decodes inline (tens of microseconds) straight to float32 mono, with no thread hop;
- drops, undecoded, media a sender delivers beyond real time plus a burst allowance
  (counted as ``over_real_time``): a caller cannot buy more than real time.

``AudioReceivePath.add`` has the signature of aiortc's ``JitterBuffer.add``, so
``media.rtc.compat.install_receive_path`` can put it in an ``RTCRtpReceiver`` in place of the
stock buffer. It is an ``AudioInput`` of the pipeline it feeds.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from media.audio.frames import FRAME_SAMPLES, RTC_RATE
from media.audio.opus import OpusDecoder, packet_has_fec
from media.pipeline.base import ReceiveStats

SEQ_MOD = 1 << 16
TS_MOD = 1 << 32
MAX_MISORDER = 100  # a sequence jump beyond this is a new stream, not a gap
MAX_CONCEALED_FRAMES = 3  # 60 ms: beyond that PLC is noise; the pacer plays silence instead
MAX_MARGIN_S = 0.08
MARGIN_HEADROOM_S = 0.002
MARGIN_DECAY_PER_S = 0.002  # margin shrinks by 2 ms per second without late packets
REMEMBERED_CONCEALMENTS = 64
JITTER_GAIN = 1 / 16  # RFC 3550 interarrival jitter filter
# Media a sender may deliver beyond real time, as a burst: what a network that held packets
# (a Wi-Fi stall of up to ~300 ms, then a flush) releases at once, with room to spare.
BURST_ALLOWANCE_S = 0.5

FrameSink = Callable[[np.ndarray], None]


class RealTimeBudget:
    """How much media a sender may still deliver: real time, plus a burst allowance.

    A caller cannot buy more than real time: media beyond it would cost decode and engine
    time that other sessions need, and grow this session's latency. The budget fills at
    one second per second up to ``allowance_s``; each packet spends its duration.
    """

    def __init__(self, allowance_s: float, now: float) -> None:
        self._allowance = allowance_s
        self._available = allowance_s
        self._updated = now

    def spend(self, seconds: float, now: float) -> bool:
        elapsed = max(0.0, now - self._updated)
        self._available = min(self._allowance, self._available + elapsed)
        self._updated = now
        if self._available < seconds:
            return False
        self._available -= seconds
        return True


def _seq_delta(a: int, b: int) -> int:
    """Signed distance from ``b`` to ``a`` in 16-bit sequence space."""
    return (a - b + SEQ_MOD // 2) % SEQ_MOD - SEQ_MOD // 2


@dataclass
class _Pending:
    timestamp: int
    payload: bytes
    arrived: float


class AudioReceivePath:
    """Reorders, conceals and decodes one incoming Opus stream into a frame sink."""

    def __init__(
        self,
        sink: FrameSink,
        *,
        clock: Callable[[], float] | None = None,
        call_at: Callable[[float, Callable[[], None]], Any] | None = None,
        decoder: OpusDecoder | None = None,
    ) -> None:
        loop = asyncio.get_running_loop() if clock is None or call_at is None else None
        self._sink = sink
        self._clock = clock or loop.time  # type: ignore[union-attr]
        self._call_at = call_at or loop.call_at  # type: ignore[union-attr]
        self._decoder = decoder or OpusDecoder(channels=1)
        self._pending: dict[int, _Pending] = {}
        self._next_seq: int | None = None
        self._last_timestamp: int | None = None
        self._frame_samples = FRAME_SAMPLES
        self._margin = 0.0
        self._last_late_at: float | None = None
        self._concealed_at: OrderedDict[int, float] = OrderedDict()
        self._timer: Any = None
        self._transit: float | None = None
        self._closed = False
        self._budget = RealTimeBudget(BURST_ALLOWANCE_S, self._clock())
        self.stats = ReceiveStats()
        # When the packet behind the frame being handed to the sink arrived (for a concealed
        # frame: the packet after the gap, whose arrival started the wait). The sink reads it.
        self.arrived_at = 0.0

    # The JitterBuffer interface aiortc's receiver calls for every audio packet.
    @property
    def capacity(self) -> int:
        return MAX_MISORDER

    def add(self, packet: Any) -> tuple[bool, None]:
        self.receive(packet.sequence_number, packet.timestamp, bytes(packet.payload))
        return False, None

    def receive(self, seq: int, timestamp: int, payload: bytes) -> None:
        """Take one RTP packet as it arrives."""
        if self._closed:
            return  # the session ended; the transport may still deliver a few packets
        now = self._clock()
        self.stats.packets += 1
        self._update_jitter(timestamp, now)
        self._decay_margin(now)
        if self._next_seq is None:
            self._next_seq = seq
        delta = _seq_delta(seq, self._next_seq)
        if delta < 0:
            if -delta > MAX_MISORDER:
                self._restart(seq)
            else:
                self._late(seq, now)
                return
        elif delta > MAX_MISORDER:
            self._restart(seq)
        if seq in self._pending:
            self.stats.duplicates += 1
            return
        if payload and not self._budget.spend(self._frame_samples / RTC_RATE, now):
            # Beyond real time: it keeps its place in the sequence (no gap to conceal) but
            # is never decoded.
            self.stats.over_real_time += 1
            payload = b""
        self._pending[seq] = _Pending(timestamp, payload, now)
        self._release(now)

    def close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._pending.clear()
        self._decoder.close()

    def _restart(self, seq: int) -> None:
        """A new stream (sender restart or a huge gap): forget the old sequence."""
        self._pending.clear()
        self._next_seq = seq
        self._last_timestamp = None

    def _late(self, seq: int, now: float) -> None:
        concealed = self._concealed_at.pop(seq, None)
        if concealed is None:
            self.stats.duplicates += 1
            return
        self.stats.late_dropped += 1
        self._last_late_at = now
        wanted = self._margin + (now - concealed) + MARGIN_HEADROOM_S
        self._margin = min(MAX_MARGIN_S, wanted)
        self.stats.margin_ms = round(self._margin * 1000, 1)

    def _decay_margin(self, now: float) -> None:
        if self._margin <= 0 or self._last_late_at is None:
            return
        quiet = now - self._last_late_at
        if quiet > 1.0:
            self._margin = max(0.0, self._margin - MARGIN_DECAY_PER_S * quiet)
            self._last_late_at = now
            self.stats.margin_ms = round(self._margin * 1000, 1)

    def _update_jitter(self, timestamp: int, now: float) -> None:
        transit = now - timestamp / RTC_RATE
        if self._transit is not None:
            difference = abs(transit - self._transit)
            if difference < 1.0:  # ignore timestamp wraps and stream restarts
                jitter = self.stats.jitter_ms / 1000
                jitter += (difference - jitter) * JITTER_GAIN
                self.stats.jitter_ms = round(jitter * 1000, 2)
        self._transit = transit

    def _release(self, now: float) -> None:
        assert self._next_seq is not None
        while self._pending:
            packet = self._pending.pop(self._next_seq, None)
            if packet is not None:
                if packet.payload:  # a padding-only packet holds its place but no audio
                    self.arrived_at = packet.arrived
                    self._emit(self._decode(packet))
                self._next_seq = (self._next_seq + 1) % SEQ_MOD
                continue
            first_waiting = min(p.arrived for p in self._pending.values())
            deadline = first_waiting + self._margin
            if now < deadline:
                self._arm_timer(deadline)
                return
            self._fill_gap(now)

    def _fill_gap(self, now: float) -> None:
        """Conceal the missing packets before the earliest one waiting, or skip them."""
        assert self._next_seq is not None
        following = min(self._pending, key=lambda s: _seq_delta(s, self._next_seq))  # type: ignore[arg-type]
        missing = _seq_delta(following, self._next_seq)
        samples = self._gap_samples(self._pending[following].timestamp, missing)
        self.arrived_at = self._pending[following].arrived
        for index in range(missing):
            seq = (self._next_seq + index) % SEQ_MOD
            self._concealed_at[seq] = now
            if len(self._concealed_at) > REMEMBERED_CONCEALMENTS:
                self._concealed_at.popitem(last=False)
            if index < missing - MAX_CONCEALED_FRAMES:
                self.stats.skipped += 1
                continue
            payload = self._pending[following].payload
            if index == missing - 1 and packet_has_fec(payload):
                self._emit(self._decoder.recover(payload, samples))
                self.stats.recovered_fec += 1
            else:
                self._emit(self._decoder.conceal(samples))
            self.stats.concealed += 1
        self._next_seq = following

    def _gap_samples(self, following_timestamp: int, missing: int) -> int:
        """Samples per missing packet, from the timestamps around the gap (2.5 ms units)."""
        if self._last_timestamp is None:
            return self._frame_samples
        span = (following_timestamp - self._last_timestamp) % TS_MOD - self._frame_samples
        per_packet = span // missing if missing else self._frame_samples
        quantum = RTC_RATE // 400
        per_packet = max(quantum, min(per_packet, 2880)) // quantum * quantum
        return per_packet

    def _decode(self, packet: _Pending) -> np.ndarray:
        pcm = self._decoder.decode(packet.payload)
        self._last_timestamp = packet.timestamp
        if len(pcm):
            self._frame_samples = len(pcm)
        return pcm

    def _emit(self, pcm: np.ndarray) -> None:
        self.stats.frames += 1
        self._sink(pcm)

    def _arm_timer(self, deadline: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._pending:
            self._release(self._clock())
