"""The audio receive path: RTP packets in arrival order, one steady 20 ms frame per 20 ms out.

aiortc's audio path holds four packets (80 ms) in a fixed-prefetch jitter buffer, stalls on
a lost packet until sixteen more have arrived, decodes in a thread with no loss concealment
and queues the frames without bound. This path is a playout buffer in the manner of
libwebrtc's NetEq instead:

- a packet is decoded (libopus, inline, straight to float32 mono) the moment it is next in
  sequence; one that comes out of order waits in a small packet buffer;
- its own timer on the loop hands the sink one 20 ms frame per 20 ms slot, so what follows
  gets a steady 50 frames a second: a slot's frame goes as soon as its audio is there, never
  before the slot starts, and a slot that ends with too little audio is completed by
  libopus's PLC (it continues the decoder's own signal, so the next packet decodes on from
  it), and after ``PLC_IN_PLACE_FRAMES`` of that by expanding the past audio
  (``media.audio.splice``): there is no hard silence inside audio. When the stream carries
  FEC the slot waits ``FEC_GRACE_S`` longer, for the next packet and its copy, and once the
  link has lost a packet the playout runs later (for ``LOSS_HOLD_S`` after the last loss:
  a frame on a jittery link, half of one on a link that is not), so that the copy is
  normally there before the slot starts or soon enough after;
- the *playout delay* is how far the slot grid runs behind the earliest expected arrival of
  the audio being played (``PlayoutDelayEstimator.expected_arrival``). It follows the target
  that the estimator derives from the arrival statistics (``target - 20 ms``: a packet may
  always be up to one slot late for free), as ``media.audio.delay_control`` decides: an
  error of a few milliseconds moves the slot grid (no audio is touched), a larger one is
  worked off by time-scale modification, accelerating when the buffer plays later than
  needed and expanding ahead of time when the target has risen; an expansion while a
  packet is late raises it by itself;
- a packet later than the target allows, with a later packet already there, is lost: its
  time is skipped if an expansion already filled it, else it is concealed from the later
  packet's in-band FEC when that has a copy, or by libopus PLC for the first of a run and
  by expanding the audio before it for the rest (libopus fades a run of concealment, which
  on a tone left holes 33 dB down); at most ``MAX_CONCEALED_FRAMES`` in a row. If it turns
  up after that it is dropped as late;
- a packet libopus cannot decode, or that decodes to a duration its stream's timestamps
  rule out (random bytes often "decode" to loud noise), is a lost packet, counted
  (``undecodable``), never an exception: the socket's datagram callback calls this path
  (``media.rtc.rtp_intake``; aiortc's DTLS loop for the packets it queued before DTLS was
  up, a loop that an exception would end). A stream that stays undecodable is muted, and after
  ``UNDECODABLE_ERROR_S`` reported once through ``on_error``;
- media a sender delivers beyond real time plus a burst allowance is dropped undecoded
  (counted as ``over_real_time``): a caller cannot buy more than real time;
- ``relay_stalls`` (the server's leg of an echo or transform call): when a slot runs out
  with nothing to play and no later packet in hand (the link is stalled, not losing), the
  path waits instead of concealing, tells ``on_stall``, and when the held packets come it
  plays their slots back to back until it is on its grid again; those packets do not
  teach the target (their lateness is the stall's). So a stall passes on to the listener,
  whose own buffer holds it once, instead of being held by two playout buffers in series.
  A stall longer than ``RELAY_STALL_MAX_S`` is given up and concealed as before, and so is
  one that a packet on time ends (the link lost a run of packets: nothing was held).

``AudioReceivePath.add`` has the signature of aiortc's ``JitterBuffer.add``, so
``media.rtc.compat.install_receive_path`` can put it in an ``RTCRtpReceiver`` in place of the
stock buffer; ``media.rtc.rtp_intake`` hands it packets the same way. It is an
``AudioInput`` of the pipeline it feeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from media.audio.delay_control import DelayControl
from media.audio.frames import FRAME_SAMPLES, RTC_RATE
from media.audio.opus import MAX_FRAME_SAMPLES, OpusDecoder, OpusError, packet_has_fec
from media.audio.playout_delay import PlayoutDelayEstimator
from media.audio.realtime import RealTimeBudget
from media.audio.splice import XFADE, Splicer
from media.pipeline.base import ReceiveStats
from media.pipeline.pacing import InputStall

log = logging.getLogger(__name__)

SEQ_MOD = 1 << 16
TS_MOD = 1 << 32
FRAME_SECONDS = FRAME_SAMPLES / RTC_RATE
MAX_MISORDER = 100  # a sequence jump beyond this is a new stream, not a gap
MAX_CONCEALED_FRAMES = 3  # 60 ms of PLC in a row at most: beyond that PLC is noise
# PLC fills at most this many slots in a row while their packets are awaited: libopus fades
# its concealment after the first frame, where an expansion holds the level for 150 ms.
PLC_IN_PLACE_FRAMES = 1
REMEMBERED_LOSSES = 64  # lost sequence numbers kept, to tell a late packet from a duplicate
MAX_BUFFER_S = 1.0  # decoded audio held at most (the target's ceiling is 0.5 s)
LOSS_TOLERANCE_S = 0.001  # timer rounding, when judging whether a packet is past its time
# The target's resolution: 5 ms, as 10 ms edges cost up to 10 ms more on every leg.
DELAY_BUCKET_S = 0.005
# A missing packet's slot waits this much past its end when the stream carries FEC: the
# next packet, due about then, rebuilds it from its copy (better than concealment).
FEC_GRACE_S = 0.005
# On a jittery link the delay is held this much above what the target asks for. The target
# is a bucket's upper edge, which under jitter of bounded range is the range's maximum, and
# a slot gives up on its packet LOSS_TOLERANCE_S before its deadline; so the buffer sat at
# the very edge: traced on the server through 0-30 ms of jitter, the delay held 10.8 ms
# over a wanted 10 and a packet 30.0 ms late was played 19.1 ms into its slot, where one a
# millisecond later (the sender's or this loop's scheduling) misses it, and its slot is
# expanded: a 20 ms time shift inside the speech, which PESQ-WB scores about as harshly as a
# loss (3 s windows of the server's received audio: 4.3-4.5 untouched, 2.5-3.4 with one).
# Echoed speech through bench.netimpair's relay (15 s calls, median PESQ-WB of 4, four runs
# each way, alternating): 2 % loss + 0-30 ms jitter 3.52 / 3.64 / 3.54 / 3.18 without,
# 3.61 / 3.78 / 3.60 / 3.42 with (the peer's late packets 29-40 -> 18-32 a run), round
# trip 63-67 ms either way; 0-30 ms jitter alone 3.87 / 3.78 / 3.84 / 4.19 without,
# 4.11 / 4.19 / 3.86 / 4.04 with. A clean link (the target at its floor) holds none.
DEADLINE_HEADROOM_S = 0.002
# A stream that carries FEC copies and has lost a packet within this long plays a frame later
# than its lateness needs, so that a lost packet's copy (in the next packet) is in hand by
# its slot. Without that, on a link that only loses, the copy comes a slot late: the frame
# is rebuilt but handed on late, which the next leg (the caller's receive path, after an
# echo) takes for jitter, conceals and stretches around. Echoed speech through
# bench.playout_sim (12 calls a profile, PESQ-WB @ delay): 2 % loss 3.71 @ 13.9 ms ->
# 4.00 @ 56.9, 2 % loss + 0-30 ms jitter 3.58 @ 61.1 -> 3.96 @ 71.8; a clean link, 0-30 ms
# jitter alone and 5 % loss + 0-50 ms jitter (whose target holds more already) unchanged.
# Live, bench.netimpair on 2 % loss + 0-30 ms jitter (8 calls each, one run after the
# other): 3.35 -> 3.74, round trip p50 72 -> 83 ms. NetEq works at about this level
# anyway: it decodes a copy only when the next packet is in its buffer. A link that has
# stopped losing sheds the frame again after this long.
LOSS_HOLD_S = 10.0
# On a link that loses without jitter (the target at its floor) the copy comes exactly a
# frame after the lost packet was due, and a shorter hold serves as well: the rebuilt frame
# is handed on the moment its copy comes, within its own slot, and the next leg plays it
# within its own. Half a frame leaves room for both ends' scheduling above the cliff
# (a copy handed a whole frame late). bench.playout_sim, 2 % loss, 24 calls, PESQ-WB @
# delay by hold: none 3.66 @ 13.6 ms, 2 ms 4.12 @ 19.9, 6 ms 4.00 @ 27.9, 10 ms 3.99 @
# 32.9, 17 ms 4.02 @ 46.9, a frame 4.01 @ 56.9. On a jittery link the copy's own lateness
# adds to it: on 2 % loss + 0-30 ms jitter (12 calls) PESQ-WB rose with the hold up to the
# frame (12 ms 3.49 @ 61.0, 17 ms 3.75 @ 61.8, 20 ms 3.81 @ 66.8, 22 ms 3.97 @ 71.8, 27 ms
# 3.98 @ 77.9), so there it stays a frame.
CALM_LOSS_HOLD_S = FRAME_SECONDS / 2
PLC_QUANTUM = RTC_RATE // 400  # libopus conceals in 2.5 ms steps
IDLE_AFTER_S = 1.0  # no packet for this long, with the expansion faded out: stop the slots
JITTER_GAIN = 1 / 16  # RFC 3550 interarrival jitter filter
# Media a sender may deliver beyond real time, as a burst: what a network that held packets
# (a Wi-Fi stall of up to ~300 ms, then a flush) releases at once, with room to spare.
BURST_ALLOWANCE_S = 0.5
# Undecodable packets: a stream with at least DISTRUST_AT of the last DISTRUST_WINDOW
# undecodable is muted until fewer than TRUST_AT are; muted for UNDECODABLE_ERROR_S, it is
# reported. The log says so at most once every LOG_INTERVAL_S.
DISTRUST_WINDOW = 50
DISTRUST_AT = 25
TRUST_AT = 5
UNDECODABLE_ERROR_S = 5.0
LOG_INTERVAL_S = 10.0
UNDECODABLE_AUDIO = "undecodable_audio"  # the error code reported through on_error
# The stream's packet duration is the timestamp step most of its last FRAME_STEPS consecutive
# packets took (the shorter on a tie). A sender that found a slot already passed (a stalled
# event loop) stamps its next packet a slot or more further on: that step is not a longer
# packet. Taking the last two equal steps instead, two such packets in a row (our own server
# under eight CosyVoice callers) made the stream "40 ms" and the second of them undecodable.
FRAME_STEPS = 8
# A relayed stall is waited out for at most this long from its slot's start: the Wi-Fi
# stalls bench.netimpair models are 100-300 ms. Beyond it the slots are concealed and
# skipped as on a path that does not relay (the link may have gone for good).
RELAY_STALL_MAX_S = 0.32

FrameSink = Callable[[np.ndarray], None]
ErrorSink = Callable[[str, str], None]  # (code, message)
StallSink = Callable[[InputStall], None]


def _seq_delta(a: int, b: int) -> int:
    """Signed distance from ``b`` to ``a`` in 16-bit sequence space."""
    return (a - b + SEQ_MOD // 2) % SEQ_MOD - SEQ_MOD // 2


@dataclass
class _Pending:
    timestamp: int
    payload: bytes
    arrived: float


class _Decoded:
    """Decoded audio waiting to be played, with each piece's RTP timestamp and arrival.

    A piece may be a *gap*: the time of lost packets that the playout fills by expanding
    the audio before it (``pcm`` None). Audio is read up to the next gap, never across it.
    """

    def __init__(self) -> None:
        # (pcm or None for a gap, samples, timestamp, arrival)
        self._pieces: deque[tuple[np.ndarray | None, int, int, float]] = deque()
        self._offset = 0  # samples of the first piece already played
        self.samples = 0

    def push(self, pcm: np.ndarray, timestamp: int, arrived: float) -> None:
        if len(pcm):
            self._pieces.append((pcm, len(pcm), timestamp, arrived))
            self.samples += len(pcm)

    def push_gap(self, samples: int, timestamp: int, arrived: float) -> None:
        if samples > 0:
            self._pieces.append((None, samples, timestamp, arrived))
            self.samples += samples

    def head(self, samples: int) -> np.ndarray:
        """A copy of the first ``samples`` (fewer if fewer are held before a gap)."""
        parts, need, offset = [], samples, self._offset
        for pcm, _, _, _ in self._pieces:
            if need <= 0 or pcm is None:
                break
            part = pcm[offset : offset + need]
            parts.append(part)
            need -= len(part)
            offset = 0
        if not parts:
            return np.zeros(0, np.float32)
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def gap_after(self, samples: int) -> int:
        """The samples of gap that begin right after the first ``samples`` (0 if none)."""
        position = -self._offset
        for pcm, length, _, _ in self._pieces:
            if position >= samples:
                return length if pcm is None and position == samples else 0
            position += length
            if pcm is None and position > samples:
                return position - samples
        return 0

    @property
    def head_timestamp(self) -> int | None:
        if not self._pieces:
            return None
        return (self._pieces[0][2] + self._offset) % TS_MOD

    def drop(self, samples: int) -> float | None:
        """Remove the first ``samples``; returns when the piece holding the last one arrived."""
        arrived = None
        samples = min(samples, self.samples)
        self.samples -= samples
        while samples > 0:
            _, length, _, arrived = self._pieces[0]
            left = length - self._offset
            if samples < left:
                self._offset += samples
                return arrived
            samples -= left
            self._pieces.popleft()
            self._offset = 0
        return arrived

    def clear(self) -> None:
        self._pieces.clear()
        self._offset = 0
        self.samples = 0


class AudioReceivePath:
    """Reorders, conceals, decodes and plays out one incoming Opus stream into a frame sink."""

    def __init__(
        self,
        sink: FrameSink,
        *,
        clock: Callable[[], float] | None = None,
        call_at: Callable[[float, Callable[[], None]], Any] | None = None,
        decoder: OpusDecoder | None = None,
        on_error: ErrorSink | None = None,
        peak_mode: bool = True,
        relay_stalls: bool = False,
        on_stall: StallSink | None = None,
    ) -> None:
        loop = asyncio.get_running_loop() if clock is None or call_at is None else None
        self._sink = sink
        self._peak_mode = peak_mode
        self._relay_stalls = relay_stalls
        self._on_stall = on_stall
        # The start of the slot a relayed stall left without audio (None: no stall).
        self._stall_start: float | None = None
        self._clock = clock or loop.time  # type: ignore[union-attr]
        self._call_at = call_at or loop.call_at  # type: ignore[union-attr]
        self._decoder = decoder or OpusDecoder(channels=1)
        self.on_error = on_error
        # Told how many packets each gap lost (the send side's FEC starts on it).
        self.on_loss: Callable[[int], None] | None = None
        self._pending: dict[int, _Pending] = {}  # packets after a gap
        self._next_seq: int | None = None
        self._next_timestamp: int | None = None  # RTP timestamp the next packet should have
        self._last_timestamp: int | None = None  # ...of the last one decoded or concealed
        self._frame_samples = FRAME_SAMPLES  # the stream's packet duration, from timestamps
        self._learnt_frame = False
        self._steps: deque[int] = deque(maxlen=FRAME_STEPS)  # recent timestamp steps
        self._previous: tuple[int, int] | None = None  # (seq, timestamp) of the last arrival
        self._decoded = _Decoded()
        self._splicer = Splicer()
        self._estimator = self._new_estimator()
        self._covered = 0  # samples expanded while waiting for the next packet
        self._concealed_run = 0  # frames of PLC since the last packet decoded
        # PLC played in place of a packet still awaited: libopus's state is that far ahead.
        self._concealed_ahead = 0
        self._stream_has_fec = False  # the last packet decoded carried an FEC copy
        self._fec_seen_at = -math.inf  # when a packet with an FEC copy was last decoded
        self._lost_at: OrderedDict[int, float] = OrderedDict()
        self._transit: float | None = None
        self._closed = False
        self._budget = RealTimeBudget(BURST_ALLOWANCE_S, self._clock())
        # The slot grid: slot k starts at anchor + k * 20 ms; the next to play is ``_slot``.
        self._anchor: float | None = None
        self._slot = 0
        self._timer: Any = None
        self._waiting = False  # the current slot waits for its audio (a packet fires it)
        self._idle = False
        self._last_arrival = -math.inf
        self._control_steps = DelayControl()
        self._nudge = 0.0
        self._reported_target = self._reported_margin = -1.0  # as the stats last had them
        # Undecodable packets.
        self._recent_bad: deque[bool] = deque(maxlen=DISTRUST_WINDOW)
        self._tainted = False  # the decoder's state came from a packet that was not audio
        self._distrust_since: float | None = None
        self._reported = False
        self._logged_at = -math.inf
        self._unlogged = 0
        self.stats = ReceiveStats()
        # When the packet behind the frame being handed to the sink arrived (for a frame of
        # expansion: when it was made). The sink reads it.
        self.arrived_at = 0.0

    # The JitterBuffer interface aiortc's receiver calls for every audio packet.
    @property
    def capacity(self) -> int:
        return MAX_MISORDER

    def add(self, packet: Any) -> tuple[bool, None]:
        try:
            self.receive(packet.sequence_number, packet.timestamp, bytes(packet.payload))
        except Exception:  # in aiortc's DTLS loop an exception would end the call
            log.exception("the receive path failed on a packet; it is dropped")
        return False, None

    @property
    def target_delay(self) -> float:
        """The estimator's target playout delay, seconds (one frame at least)."""
        return self._estimator.target

    def receive(self, seq: int, timestamp: int, payload: bytes) -> None:
        """Take one RTP packet as it arrives."""
        if self._closed:
            return  # the session ended; the transport may still deliver a few packets
        now = self._clock()
        self.stats.packets += 1
        self._update_jitter(timestamp, now)
        if self._next_seq is None:
            self._next_seq, self._next_timestamp = seq, timestamp
        delta = _seq_delta(seq, self._next_seq)
        if delta < 0 and -delta <= MAX_MISORDER:
            if self._lost_at.pop(seq, None) is None:
                self.stats.duplicates += 1
            else:  # it came after its time was given up: its lateness is worth knowing
                self.stats.late_dropped += 1
                self._estimator.add(timestamp, now)
            return
        if abs(delta) > MAX_MISORDER:
            self._restart(seq, timestamp)
        elif self._idle and delta > 0:
            self._resume_after_idle(seq, timestamp)
        if seq in self._pending:
            self.stats.duplicates += 1
            return
        self._learn_frame(seq, timestamp)
        if self._stall_start is not None and not self._late(timestamp, now):
            self._stall_was_a_gap(now)
        if self._stall_start is None:  # a stall's lateness is the listener's to hold
            self._estimator.add(timestamp, now)
        if payload and not self._budget.spend(self._frame_samples / RTC_RATE, now):
            # Beyond real time: it keeps its place in the sequence but is never decoded.
            self.stats.over_real_time += 1
            payload = b""
        self._pending[seq] = _Pending(timestamp, payload, now)
        self._last_arrival = now
        self._drain(now)
        self._bound(now)
        if self._anchor is None or self._idle:
            self._idle = False
            self._anchor, self._slot = now, 0
            self._control_steps.rebase()
            self._fire(now)
        elif self._waiting and self._can_play(now):
            if now >= self._slot_start():
                self._fire(now)
            else:  # early for its slot: it plays when the slot starts
                self._arm(self._slot_start(), waiting=False)

    def close(self) -> None:
        self._closed = True
        self._end_stall(InputStall.GIVEN_UP)  # what waits for the stall's audio stops waiting
        self._cancel_timer()
        self._pending.clear()
        self._decoded.clear()
        self._decoder.close()

    # --- packets -------------------------------------------------------------------------

    def _new_estimator(self) -> PlayoutDelayEstimator:
        return PlayoutDelayEstimator(bucket=DELAY_BUCKET_S, peak_mode=self._peak_mode)

    def _restart(self, seq: int, timestamp: int) -> None:
        """A new stream (sender restart or a huge gap): forget the old sequence and timing.

        The audio already decoded goes too (its timing belongs to the old stream); the next
        frame is merged in from what was played, so the listener hears no break.
        """
        self._pending.clear()
        self._decoded.clear()
        self._next_seq, self._next_timestamp = seq, timestamp
        self._last_timestamp = None
        self._previous = None
        self._learnt_frame = False
        self._steps.clear()
        self._covered = 0
        self._estimator = self._new_estimator()

    def _resume_after_idle(self, seq: int, timestamp: int) -> None:
        """Packets again after the slots stopped: what was missed meanwhile is long gone."""
        assert self._next_seq is not None
        self.stats.skipped += _seq_delta(seq, self._next_seq)
        self._pending.clear()
        self._next_seq, self._next_timestamp = seq, timestamp
        self._covered = 0

    def _learn_frame(self, seq: int, timestamp: int) -> None:
        """The stream's packet duration, from the timestamps of consecutive packets: the
        step most of the recent ones took, once two agree (see ``FRAME_STEPS``)."""
        previous, self._previous = self._previous, (seq, timestamp)
        if previous is None or _seq_delta(seq, previous[0]) != 1:
            return
        step = (timestamp - previous[1]) % TS_MOD
        if not (0 < step <= MAX_FRAME_SAMPLES and step % (RTC_RATE // 400) == 0):
            return
        self._steps.append(step)
        if self._learnt_frame and step == self._frame_samples:
            return  # another vote for the duration already learnt: nothing can change
        common, votes = max(Counter(self._steps).items(), key=lambda item: (item[1], -item[0]))
        if votes >= 2:
            self._frame_samples, self._learnt_frame = common, True
        else:
            self._frame_samples, self._learnt_frame = step, False

    def _update_jitter(self, timestamp: int, now: float) -> None:
        transit = now - timestamp / RTC_RATE
        if self._transit is not None:
            difference = abs(transit - self._transit)
            if difference < 1.0:  # ignore timestamp wraps and stream restarts
                jitter = self.stats.jitter_ms / 1000
                jitter += (difference - jitter) * JITTER_GAIN
                self.stats.jitter_ms = round(jitter * 1000, 2)
        self._transit = transit

    def _drain(self, now: float) -> None:
        """Decode every packet that is next in sequence."""
        assert self._next_seq is not None
        while (packet := self._pending.pop(self._next_seq, None)) is not None:
            if packet.payload:  # a padding-only packet holds its place but no audio
                self._decode(packet, now)
            self._last_timestamp = packet.timestamp
            self._next_timestamp = (packet.timestamp + self._frame_samples) % TS_MOD
            self._next_seq = (self._next_seq + 1) % SEQ_MOD

    def _decode(self, packet: _Pending, now: float) -> None:
        pcm: np.ndarray | None
        try:
            pcm = self._decoder.decode(packet.payload)
            failed = False
        except OpusError:
            pcm, failed = None, True
        if pcm is not None and self._learnt_frame and not self._fits_timing(len(pcm)):
            pcm = None  # libopus made something of it, but not this stream's audio
            self._tainted = True
        bad = pcm is None
        self._recent_bad.append(bad)
        self._judge_stream(now)
        if bad:
            self._undecodable(now)
            if failed and not self._tainted and self._distrust_since is None:
                self._push_concealment(self._frame_samples, packet.timestamp, packet.arrived)
            return
        assert pcm is not None
        self._tainted = False
        if self._distrust_since is not None:
            return  # a muted stream: a decodable packet among noise is noise too
        self._decoded.push(pcm, packet.timestamp, packet.arrived)
        self._covered = 0  # the packet waited for has come: the expansion stretched time
        self._concealed_run = 0
        self._concealed_ahead = 0
        self._stream_has_fec = packet_has_fec(packet.payload)
        if self._stream_has_fec:
            self._fec_seen_at = now

    def _fits_timing(self, samples: int) -> bool:
        """Whether the stream's timestamps allow a packet of ``samples``: its usual packet
        duration, or the latest step (a sender that changed its packet duration: the first
        longer packet is taken for noise, the next ones are heard)."""
        return samples == self._frame_samples or bool(self._steps and samples == self._steps[-1])

    def _push_concealment(self, samples: int, timestamp: int, arrived: float) -> None:
        try:
            pcm = self._decoder.conceal(samples)
        except OpusError:
            return
        self._decoded.push(pcm, timestamp, arrived)
        self.stats.concealed += 1
        self._concealed_run += 1

    def _bound(self, now: float) -> None:
        """Keep the packet buffer and the decoded audio within their bounds."""
        while len(self._pending) > MAX_MISORDER // 2:
            self._lose_gap(now)
            self._drain(now)
        excess = self._decoded.samples - int(MAX_BUFFER_S * RTC_RATE)
        if excess > 0:
            self._decoded.drop(excess)
            self.stats.dropped_ms += round(1000 * excess / RTC_RATE, 1)

    # --- losses --------------------------------------------------------------------------

    def _gap_is_lost(self, now: float) -> bool:
        """The next packet is missing, a later one is here, and it is past the target; or
        its slot has run out and the packet after it carries its FEC copy (real audio now
        beats waiting on with expansion for a packet that is probably lost)."""
        if not self._pending or self._next_timestamp is None or self._next_seq is None:
            return False
        expected = self._estimator.expected_arrival(self._next_timestamp)
        if expected is None or now - expected >= self._estimator.target - LOSS_TOLERANCE_S:
            return True
        after = self._pending.get((self._next_seq + 1) % SEQ_MOD)
        slot_over = self._anchor is not None and (
            now >= self._slot_start() + FRAME_SECONDS - LOSS_TOLERANCE_S
        )
        return slot_over and after is not None and packet_has_fec(after.payload)

    def _lose_gap(self, now: float) -> None:
        """Give up the packets missing before the earliest one waiting: skip or conceal each."""
        assert self._next_seq is not None and self._next_timestamp is not None
        following = min(self._pending, key=lambda s: _seq_delta(s, self._next_seq))  # type: ignore[arg-type]
        missing = _seq_delta(following, self._next_seq)
        after = self._pending[following]
        samples = self._gap_samples(after.timestamp, missing)
        concealed = 0
        for index in range(missing):
            seq = (self._next_seq + index) % SEQ_MOD
            self._remember_lost(seq, now)
            timestamp = (self._next_timestamp + index * samples) % TS_MOD
            if self._covered >= samples:  # its time was played already
                self._covered -= samples
                if self._concealed_ahead >= samples:  # by PLC: it was concealed
                    self._concealed_ahead -= samples
                    self.stats.concealed += 1
                    continue
                self.stats.skipped += 1  # by an expansion
                if not self._tainted and index >= missing - MAX_CONCEALED_FRAMES:
                    self._quietly_conceal(samples)  # libopus's state in step with the stream
                continue
            played = self._covered  # part of its time, played already
            self._covered = self._concealed_ahead = 0
            if concealed >= MAX_CONCEALED_FRAMES or self._tainted or self._distrust_since:
                self.stats.skipped += 1
                continue
            if index == missing - 1 and packet_has_fec(after.payload):
                try:
                    pcm = self._decoder.recover(after.payload, samples)
                except OpusError:
                    pcm = np.zeros(0, np.float32)
                if len(pcm):
                    self._decoded.push(pcm, timestamp, after.arrived)
                    self.stats.recovered_fec += 1
                    self.stats.concealed += 1
                    concealed += 1
                    continue
            if self._concealed_run < PLC_IN_PLACE_FRAMES:
                rest = -(-(samples - played) // PLC_QUANTUM) * PLC_QUANTUM  # PLC for the rest
                self._push_concealment(rest, (timestamp + played) % TS_MOD, after.arrived)
            else:  # libopus would fade: the playout expands the audio before instead
                self._decoded.push_gap(samples - played, (timestamp + played) % TS_MOD, now)
                self.stats.concealed += 1
                self._concealed_run += 1
            concealed += 1
        self._next_seq, self._next_timestamp = following, after.timestamp
        if self.on_loss is not None:
            self.on_loss(missing)

    def _remember_lost(self, seq: int, now: float) -> None:
        self._lost_at[seq] = now
        if len(self._lost_at) > REMEMBERED_LOSSES:
            self._lost_at.popitem(last=False)

    def _conceal_in_place(self, now: float) -> int:
        """The slot's deadline has passed without its audio: libopus's PLC fills it.

        Concealment continues the decoder's own signal, where an expansion of what was
        played would have to be merged back into it. It stands in for the missing packet
        as an expansion does: should the packet come after all it is played after it (the
        delay grows, and is shed later), and should a later one come first it is skipped,
        its time played (and counted as concealed). After ``PLC_IN_PLACE_FRAMES`` in a
        row (a stall, or a burst) the slots are expanded and faded instead. Returns the
        samples concealed.
        """
        if (
            self._next_timestamp is None
            or self._concealed_run >= PLC_IN_PLACE_FRAMES
            or self._splicer.expanding
            or self._tainted
            or self._distrust_since is not None
            or self._last_timestamp is None  # nothing decoded yet: nothing to continue
        ):
            return 0
        short = FRAME_SAMPLES - self._decoded.samples
        samples = -(-short // PLC_QUANTUM) * PLC_QUANTUM
        try:
            pcm = self._decoder.conceal(samples)
        except OpusError:
            return 0
        self._decoded.push(pcm, self._next_timestamp, now)
        self._covered += samples
        self._concealed_ahead += samples
        self._concealed_run += 1
        # Time played while waiting, as an expansion; if the packet is lost after all, it
        # counts as concealed then.
        stats = self.stats
        stats.expanded_ms = round(stats.expanded_ms + 1000 * samples / RTC_RATE, 1)
        return samples

    def _quietly_conceal(self, samples: int) -> None:
        with contextlib.suppress(OpusError):
            self._decoder.conceal(samples)

    def _gap_samples(self, following_timestamp: int, missing: int) -> int:
        """Samples per missing packet, from the timestamps around the gap (2.5 ms units)."""
        if self._next_timestamp is None or not missing:
            return self._frame_samples
        span = (following_timestamp - self._next_timestamp) % TS_MOD
        per_packet = span // missing
        quantum = RTC_RATE // 400
        return max(quantum, min(per_packet, 2880)) // quantum * quantum

    # --- undecodable audio ---------------------------------------------------------------

    def _undecodable(self, now: float) -> None:
        self.stats.undecodable += 1
        self._unlogged += 1
        if now - self._logged_at >= LOG_INTERVAL_S:
            log.warning(
                "%d undecodable audio packet(s) concealed (the sender sends something that is "
                "not Opus audio)",
                self._unlogged,
            )
            self._logged_at, self._unlogged = now, 0

    def _judge_stream(self, now: float) -> None:
        """Mute a stream that is mostly undecodable; report it once it has been for long."""
        bad = sum(self._recent_bad)
        if self._distrust_since is None:
            if bad >= DISTRUST_AT:
                self._distrust_since = now
                self._decoded.clear()
            return
        if bad < TRUST_AT:
            self._distrust_since, self._reported = None, False
            return
        if not self._reported and now - self._distrust_since >= UNDECODABLE_ERROR_S:
            self._reported = True
            if self.on_error is not None:
                self.on_error(
                    UNDECODABLE_AUDIO,
                    f"No decodable audio for {UNDECODABLE_ERROR_S:.0f} s: the caller's packets "
                    "are not Opus audio. They are concealed as lost and the call goes on.",
                )

    # --- playout -------------------------------------------------------------------------

    def _slot_start(self) -> float:
        assert self._anchor is not None
        return self._anchor + self._slot * FRAME_SECONDS

    def _slot_deadline(self, start: float) -> float:
        """When a slot without its audio gives up waiting: at its end, or a little after
        when the stream carries FEC (the next packet, due about then, holds a copy)."""
        return start + FRAME_SECONDS + (FEC_GRACE_S if self._stream_has_fec else 0.0)

    def _can_play(self, now: float) -> bool:
        """A whole frame of audio is there for the current slot, or can be made (a loss)."""
        if self._decoded.samples >= FRAME_SAMPLES:
            return True
        return bool(self._pending) and self._gap_is_lost(now)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self, when: float, waiting: bool) -> None:
        self._cancel_timer()
        self._waiting = waiting
        self._timer = self._call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._closed or self._anchor is None:
            return
        now = self._clock()
        start = self._slot_start()
        if now + LOSS_TOLERANCE_S < start:
            self._arm(start, waiting=False)  # woke early (the grid moved)
        elif self._can_play(now):
            self._fire(now)
        elif now >= self._slot_deadline(start) - LOSS_TOLERANCE_S:
            if self._stalls(now, start):
                self._arm(self._stall_start + RELAY_STALL_MAX_S, waiting=True)  # type: ignore[operator]
            else:
                self._end_stall(InputStall.GIVEN_UP)
                self._fire(now)
        else:
            self._arm(self._slot_deadline(start), waiting=True)

    def _stalls(self, now: float, start: float) -> bool:
        """Whether a slot past its deadline waits on as (part of) a relayed stall: nothing
        to play, no later packet in hand (that would be a loss), a live stream, and the
        stall not yet waited out. Tells ``on_stall`` when one begins."""
        if (
            not self._relay_stalls
            or self._pending
            or self._last_timestamp is None
            or self._splicer.expanding
            or self._distrust_since is not None
        ):
            return False
        if self._stall_start is None:
            if self._concealed_run < PLC_IN_PLACE_FRAMES:
                return False  # a late packet is concealed in place first: jitter, mostly
            if now - self._last_arrival >= RELAY_STALL_MAX_S:
                return False  # the stream had stopped already: not a stall to relay
            self._stall_start = start
            self.stats.relayed_stalls += 1
            if self._on_stall is not None:
                self._on_stall(InputStall.BEGAN)
        return now < self._stall_start + RELAY_STALL_MAX_S - LOSS_TOLERANCE_S

    def _late(self, timestamp: int, now: float) -> bool:
        """Whether a packet came later than the target allows."""
        expected = self._estimator.expected_arrival(timestamp)
        return expected is None or now - expected > self._estimator.target

    def _stall_was_a_gap(self, now: float) -> None:
        """A packet on time ended the wait: the link lost a run of packets (or the sender
        paused), it did not hold them. Nothing held is coming, so the slots waited
        through are skipped, their time counted as played for the missing packets (as an
        expansion's would have been), and the listener's buffer fills that gap itself."""
        self._covered += self._slots_behind(now) * FRAME_SAMPLES  # the slots _fire skips
        self._end_stall(InputStall.GIVEN_UP)

    def _slots_behind(self, now: float) -> int:
        """The slots that passed unplayed, when the grid is more than two behind (else 0)."""
        late = now - self._slot_start()
        return int(late / FRAME_SECONDS) if late > 2 * FRAME_SECONDS else 0

    def _end_stall(self, edge: InputStall) -> None:
        if self._stall_start is not None:
            self._stall_start = None
            if self._on_stall is not None:
                self._on_stall(edge)

    def _fire(self, now: float) -> None:
        """Play the current slot: one frame to the sink, then set up the next slot."""
        self._cancel_timer()
        self._waiting = False
        start = self._slot_start()
        if self._stall_start is None and (behind := self._slots_behind(now)):
            # The loop was held up: the slots that passed are gone (their audio is not).
            self._slot += behind
            self.stats.skipped_slots += behind
            start = self._slot_start()
        try:
            self._play(now, start)
        except Exception:
            log.exception("the receive path failed to play a frame")
        self._slot += 1
        if self._nudge and self._stall_start is None:  # a relayed burst keeps the grid
            self._anchor += self._nudge  # type: ignore[operator]
        self._nudge = 0.0
        if self._should_idle(now):
            self._idle = True
            self._end_stall(InputStall.GIVEN_UP)
            return
        start = self._slot_start()
        if self._stall_start is not None and start > now:
            self._end_stall(InputStall.RELAYED)  # the held slots are played: on the grid again
        if self._pending or self._can_play(now):
            self._arm(start, waiting=False)  # at its start a gap before them may be lost
        else:
            # Nothing for the next slot is here: until its deadline only the packet that
            # brings its audio can move it on (and plays it, from the slot's start on).
            self._arm(self._slot_deadline(start), waiting=True)

    def _play(self, now: float, start: float) -> None:
        while self._pending and self._next_seq not in self._pending and self._gap_is_lost(now):
            self._lose_gap(now)
            self._drain(now)
        concealed = 0
        if (
            self._decoded.samples < FRAME_SAMPLES
            and self._next_seq not in self._pending
            and now >= self._slot_deadline(start) - LOSS_TOLERANCE_S
            and now - self._last_arrival < IDLE_AFTER_S
        ):
            concealed = self._conceal_in_place(now)
        change = self._control(start)
        ahead = self._decoded.head(FRAME_SAMPLES + max(change, 0) + 2 * XFADE)
        frame, used = self._splicer.play(ahead, FRAME_SAMPLES, change)
        splicer = self._splicer
        # An expansion at a gap plays the lost packets' time; beyond it, the awaited one's.
        filled = min(splicer.expanded, self._decoded.gap_after(used))
        arrived = self._decoded.drop(used + filled) if used + filled else None
        waited = splicer.expanded - filled
        if used and not concealed:
            self._covered = waited
        else:
            self._covered += waited
        stats = self.stats
        if splicer.expanded:  # most frames are played as they are: nothing to add
            stats.expanded_ms = round(stats.expanded_ms + 1000 * splicer.expanded / RTC_RATE, 1)
        if shed := splicer.accelerated + splicer.skipped:
            stats.accelerated_ms = round(stats.accelerated_ms + 1000 * shed / RTC_RATE, 1)
        if splicer.preemptive:
            stats.preemptive_ms = round(
                stats.preemptive_ms + 1000 * splicer.preemptive / RTC_RATE, 1
            )
        stats.frames += 1
        self.arrived_at = arrived if arrived is not None else now
        self._sink(frame)

    def _control(self, start: float) -> int:
        """The time-scale step this slot should take toward the target delay (samples)."""
        timestamp = self._decoded.head_timestamp
        if timestamp is None:
            timestamp = self._next_timestamp
        expected = None if timestamp is None else self._estimator.expected_arrival(timestamp)
        target = self._estimator.target
        wanted = max(0.0, target - FRAME_SECONDS)
        if wanted > 0:  # a jittery link: the target sits at the edge of its lateness
            wanted += DEADLINE_HEADROOM_S
        if self._losing_with_fec(start):
            hold = FRAME_SECONDS + DEADLINE_HEADROOM_S if wanted > 0 else CALM_LOSS_HOLD_S
            wanted = max(wanted, hold)
        # Both change a few times a second at most: rounded for the stats only then.
        if target != self._reported_target or wanted != self._reported_margin:
            self._reported_target, self._reported_margin = target, wanted
            self.stats.target_ms = round(1000 * target, 1)
            self.stats.margin_ms = round(1000 * wanted, 1)
        if expected is None or self._splicer.expanding:
            return 0
        delay = start - expected
        self.stats.delay_ms = round(1000 * delay, 1)
        surplus = self._decoded.samples - FRAME_SAMPLES
        change, self._nudge = self._control_steps.step(delay, wanted, surplus)
        return change

    def _losing_with_fec(self, now: float) -> bool:
        """The stream carries FEC copies and lost a packet (one that never came: a late
        one leaves ``_lost_at`` when it does) within ``LOSS_HOLD_S``."""
        if now - self._fec_seen_at >= LOSS_HOLD_S or not self._lost_at:
            return False
        return now - next(reversed(self._lost_at.values())) < LOSS_HOLD_S

    def _should_idle(self, now: float) -> bool:
        return (
            self._splicer.faded
            and not self._pending
            and not self._decoded.samples
            and now - self._last_arrival >= IDLE_AFTER_S
        )
