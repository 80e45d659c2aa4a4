"""The audio receive path under synthetic RTP timing.

Real Opus packets (one per 20 ms of a speech-like signal) are fed with chosen sequence
numbers, timestamps and arrival times. Time only moves when a test moves it: the path gets
a fake clock and a ``call_at`` backed by a small manual scheduler, so every check below is
exact and nothing sleeps (except the one test that runs on the real event loop).

A tracing decoder records what the path asked of libopus (decode packet ``k``, conceal,
recover from packet ``k``'s FEC), which is how the tests see the order of the output.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from aiortc import RTCPeerConnection, RTCRtpCodecParameters
from aiortc.rtp import RtpPacket

from media.audio.opus import Application, OpusDecoder, OpusEncoder, OpusError, packet_has_fec
from media.rtc.compat import install_receive_path as install
from media.rtc.receive import (
    BURST_ALLOWANCE_S,
    MAX_CONCEALED_FRAMES,
    MAX_MARGIN_S,
    MAX_MISORDER,
    REMEMBERED_CONCEALMENTS,
    SEQ_MOD,
    TS_MOD,
    AudioReceivePath,
)

RATE = 48_000
FRAME = 960
SLOT = 0.02  # seconds between packets at the sender
OPUS_PAYLOAD_TYPE = 111


def voiced(seconds: float, seed: int = 0) -> np.ndarray:
    """A harmonic voice with a gliding pitch and a syllable envelope, plus a little noise."""
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    t = np.arange(n) / RATE
    f0 = 200 + 30 * np.sin(2 * np.pi * 1.3 * t) + 15 * np.sin(2 * np.pi * 0.37 * t)
    phase = 2 * np.pi * np.cumsum(f0) / RATE
    voice = sum(np.sin(k * phase) / k for k in range(1, 12))
    envelope = (0.5 * (1 + np.sin(2 * np.pi * 3 * t))) ** 1.5
    return (0.3 * voice * envelope + 0.01 * rng.standard_normal(n)).astype(np.float32)


def encode(encoder: OpusEncoder, seconds: float) -> list[bytes]:
    signal = voiced(seconds)
    payloads = [encoder.encode(signal[i : i + FRAME]) for i in range(0, len(signal), FRAME)]
    assert len(set(payloads)) == len(payloads), "the tracing decoder needs distinct packets"
    return payloads


@pytest.fixture(scope="module")
def plain() -> list[bytes]:
    """Ten seconds of packets without FEC: a lost one can only be concealed with PLC."""
    return encode(OpusEncoder(bitrate=48_000), 10.0)


@pytest.fixture(scope="module")
def with_fec() -> list[bytes]:
    """Two seconds of packets at a SILK bitrate, most of them carrying FEC."""
    encoder = OpusEncoder(
        application=Application.VOIP, bitrate=24_000, fec=True, expected_loss_percent=20
    )
    return encode(encoder, 2.0)


@dataclass
class Timer:
    when: float
    callback: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class Scheduler:
    """A clock that moves only when told to, and the timers set against it."""

    now: float = 0.0
    timers: list[Timer] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(when, callback)
        self.timers.append(timer)
        return timer

    def armed(self) -> list[Timer]:
        return [t for t in self.timers if not t.cancelled]

    def advance_to(self, moment: float) -> None:
        """Fire every timer due by ``moment`` at its own time, in order, then stop there."""
        assert moment >= self.now, "time does not go back"
        while due := [t for t in self.armed() if t.when <= moment]:
            timer = min(due, key=lambda t: t.when)
            self.timers.remove(timer)
            self.now = max(self.now, timer.when)
            timer.callback()
        self.timers = self.armed()
        self.now = moment


class TracingDecoder(OpusDecoder):
    """A real decoder that also records what it was asked to do."""

    def __init__(self, payloads: list[bytes]) -> None:
        super().__init__(channels=1)
        self._index = {payload: k for k, payload in enumerate(payloads)}
        self.events: list[tuple[str, int]] = []

    def decode(self, payload: bytes) -> np.ndarray:
        self.events.append(("decode", self._index[payload]))
        return super().decode(payload)

    def conceal(self, samples: int) -> np.ndarray:
        self.events.append(("conceal", samples))
        return super().conceal(samples)

    def recover(self, next_payload: bytes, samples: int) -> np.ndarray:
        assert samples == FRAME
        self.events.append(("fec", self._index[next_payload]))
        return super().recover(next_payload, samples)

    @property
    def decoded(self) -> list[int]:
        return [k for kind, k in self.events if kind == "decode"]


class Link:
    """One sender's packets, delivered to a receive path at the times a test chooses.

    Packet ``k`` has sequence number ``first_seq + k`` and timestamp
    ``first_timestamp + 960 k`` (both wrapped), and by default arrives at ``20 ms * k``.
    """

    def __init__(
        self, payloads: list[bytes], *, first_seq: int = 1000, first_timestamp: int = 5_000
    ) -> None:
        self.payloads = payloads
        self.first_seq = first_seq
        self.first_timestamp = first_timestamp
        self.time = Scheduler()
        self.decoder = TracingDecoder(payloads)
        self.frames: list[np.ndarray] = []
        self.released_at: list[float] = []
        self.path = AudioReceivePath(
            self._sink, clock=self.time.clock, call_at=self.time.call_at, decoder=self.decoder
        )
        self.max_pending = 0

    def _sink(self, pcm: np.ndarray) -> None:
        self.frames.append(pcm)
        self.released_at.append(self.time.now)

    def send(
        self,
        k: int,
        at: float | None = None,
        *,
        seq: int | None = None,
        timestamp: int | None = None,
        payload: bytes | None = None,
    ) -> int:
        """Deliver packet ``k``; returns how many frames the sink got during the call."""
        self.time.advance_to(k * SLOT if at is None else at)
        before = len(self.frames)
        self.path.receive(
            (self.first_seq + k) % SEQ_MOD if seq is None else seq,
            (self.first_timestamp + k * FRAME) % TS_MOD if timestamp is None else timestamp,
            self.payloads[k] if payload is None else payload,
        )
        self.max_pending = max(self.max_pending, len(self.path._pending))
        return len(self.frames) - before

    def send_all(self, indices: range | list[int]) -> None:
        for k in indices:
            self.send(k)

    @property
    def concealments(self) -> list[tuple[str, int]]:
        return [event for event in self.decoder.events if event[0] != "decode"]

    def assert_in_order(self) -> None:
        decoded = self.decoder.decoded
        assert decoded == sorted(set(decoded)), "output went back or repeated a packet"

    def assert_bounded(self) -> None:
        assert self.max_pending <= 4
        assert len(self.path._concealed_at) <= REMEMBERED_CONCEALMENTS


def late_swap(link: Link, first: int, lateness: float) -> None:
    """Packet ``first`` arrives ``lateness`` after packet ``first + 1``, at its usual time."""
    link.send(first + 1)
    link.send(first, at=(first + 1) * SLOT + lateness)


class TestCleanLink:
    def test_every_packet_is_released_within_its_own_receive_call(self, plain: list[bytes]):
        link = Link(plain)
        for k in range(100):
            assert link.send(k) == 1
        assert link.released_at == [k * SLOT for k in range(100)]
        assert link.decoder.decoded == list(range(100))
        assert all(len(f) == FRAME and f.dtype == np.float32 for f in link.frames)
        stats = link.path.stats
        assert (stats.packets, stats.frames) == (100, 100)
        assert stats.margin_ms == 0.0
        assert stats.jitter_ms == 0.0
        assert stats.concealed == stats.late_dropped == stats.duplicates == stats.skipped == 0
        assert link.time.armed() == []
        assert link.path._pending == {}

    def test_a_padding_only_packet_adds_no_audio(self, plain: list[bytes]):
        """An RTP packet with an empty payload (padding only) used to be decoded as a loss
        with libopus's maximum frame size: 120 ms of made-up audio in the middle."""
        link = Link(plain)
        link.send_all(range(5))
        assert link.send(5, payload=b"") == 0
        link.send_all(range(6, 10))
        assert all(len(f) == FRAME for f in link.frames)
        assert len(link.frames) == 9
        assert link.concealments == []
        assert link.path.stats.concealed == 0


class TestRealTime:
    def test_a_sender_five_times_faster_than_real_time_is_held_to_real_time(
        self, plain: list[bytes]
    ):
        """Tried as a new user would: a peer sending 5x real time to denoise raised another
        caller's RTT; what is beyond real time (plus a burst) is now dropped undecoded."""
        link = Link(plain)
        for k in range(500):  # 10 s of media in 2 s
            link.send(k, at=k * SLOT / 5)
        stats = link.path.stats
        allowed = (2.0 + BURST_ALLOWANCE_S) / SLOT
        assert len(link.decoder.decoded) <= allowed + 1
        assert stats.over_real_time == 500 - len(link.decoder.decoded)
        assert stats.over_real_time >= 500 - allowed - 1
        assert link.concealments == []  # a dropped packet holds its place: no gap to fill
        assert len(link.frames) == len(link.decoder.decoded)

    def test_a_network_burst_after_a_stall_is_not_cut(self, plain: list[bytes]):
        """A link that holds 300 ms of packets and then releases them together loses none."""
        link = Link(plain)
        link.send_all(range(50))
        for k in range(50, 65):  # 15 packets held, delivered at once
            link.send(k, at=65 * SLOT)
        link.send_all(range(65, 100))
        assert link.path.stats.over_real_time == 0
        assert link.decoder.decoded == list(range(100))


class TestReordering:
    def test_with_no_margin_the_missing_packet_is_concealed_and_dropped_when_it_comes(
        self, plain: list[bytes]
    ):
        link = Link(plain)
        link.send_all(range(5))
        assert link.send(6) == 2  # PLC for 5, then 6
        assert link.concealments == [("conceal", FRAME)]
        assert link.send(5, at=6 * SLOT + 0.005) == 0
        stats = link.path.stats
        assert stats.late_dropped == 1
        assert stats.duplicates == 0
        assert stats.concealed == 1
        # The margin now covers the 5 ms the packet came after its slot was filled, plus 2 ms.
        assert stats.margin_ms == pytest.approx(7.0)
        link.assert_in_order()

    def test_after_that_a_similar_swap_is_held_for_and_absorbed(self, plain: list[bytes]):
        link = Link(plain)
        link.send_all(range(5))
        late_swap(link, 5, lateness=0.005)
        link.send_all(range(7, 20))
        before = link.path.stats.concealed

        assert link.send(21) == 0  # held: 20 may still come
        assert [t.when for t in link.time.armed()] == [pytest.approx(21 * SLOT + 0.007)]
        assert link.send(21, at=21 * SLOT + 0.001) == 0  # the same packet again, still held
        assert link.send(20, at=21 * SLOT + 0.004) == 2  # 20 and 21 together
        link.send_all(range(22, 30))

        assert link.path.stats.concealed == before
        assert link.path.stats.late_dropped == 1
        assert link.path.stats.duplicates == 1
        assert len(link.frames) == 30
        assert link.decoder.decoded == [k for k in range(30) if k != 5]
        link.assert_in_order()
        link.assert_bounded()

    def test_a_gap_held_for_the_margin_is_concealed_when_the_margin_runs_out(
        self, plain: list[bytes]
    ):
        link = Link(plain)
        link.send_all(range(5))
        late_swap(link, 5, lateness=0.005)  # margin 7 ms
        link.send_all(range(7, 30))  # 30 is lost
        assert link.send(31) == 0
        link.time.advance_to(31 * SLOT + 0.0069)
        assert len(link.frames) == 30
        link.time.advance_to(31 * SLOT + 0.0071)
        assert len(link.frames) == 32  # PLC for 30, then 31, when the timer fired
        assert link.released_at[-1] == pytest.approx(31 * SLOT + 0.007)
        assert link.concealments[-1] == ("conceal", FRAME)
        link.send_all(range(32, 40))
        assert len(link.frames) == 40
        link.assert_in_order()

    def test_a_packet_much_later_than_any_margin_raises_it_only_to_the_ceiling(
        self, plain: list[bytes]
    ):
        link = Link(plain)
        link.send_all(range(5))
        link.send_all(range(6, 16))
        link.send(5, at=15 * SLOT + 0.001)  # 200 ms after its slot was concealed
        assert link.path.stats.late_dropped == 1
        assert link.path.stats.margin_ms == pytest.approx(MAX_MARGIN_S * 1000)

    def test_a_swap_across_the_sequence_wrap_is_a_late_packet_not_a_new_stream(
        self, plain: list[bytes]
    ):
        link = Link(plain, first_seq=SEQ_MOD - 6)
        link.send_all(range(5))
        late_swap(link, 5, lateness=0.003)  # 65535 comes after 0
        link.send_all(range(7, 12))
        stats = link.path.stats
        assert (stats.concealed, stats.late_dropped, stats.duplicates) == (1, 1, 0)
        assert len(link.frames) == 12
        link.assert_in_order()


class TestLoss:
    def test_a_lost_packet_is_concealed_and_the_output_stays_continuous(self, plain: list[bytes]):
        link = Link(plain)
        link.send_all([k for k in range(30) if k != 10])
        assert len(link.frames) == 30  # one frame per sent packet, lost or not
        assert sum(len(f) for f in link.frames) == 30 * FRAME
        assert link.path.stats.concealed == 1
        assert link.path.stats.recovered_fec == 0
        assert link.decoder.events[9:12] == [("decode", 9), ("conceal", FRAME), ("decode", 11)]

    def test_a_lost_packet_is_rebuilt_from_the_fec_in_the_packet_after_it(
        self, with_fec: list[bytes]
    ):
        lost = next(k for k in range(10, len(with_fec) - 1) if packet_has_fec(with_fec[k + 1]))
        link = Link(with_fec)
        link.send_all([k for k in range(lost + 10) if k != lost])
        assert len(link.frames) == lost + 10
        assert link.path.stats.concealed == 1
        assert link.path.stats.recovered_fec == 1
        assert link.concealments == [("fec", lost + 1)]

    def test_of_two_lost_packets_only_the_second_can_come_from_fec(self, with_fec: list[bytes]):
        lost = next(k for k in range(10, len(with_fec) - 2) if packet_has_fec(with_fec[k + 2]))
        link = Link(with_fec)
        link.send_all([k for k in range(lost + 10) if k not in (lost, lost + 1)])
        assert len(link.frames) == lost + 10
        assert link.concealments == [("conceal", FRAME), ("fec", lost + 2)]
        assert (link.path.stats.concealed, link.path.stats.recovered_fec) == (2, 1)

    def test_a_loss_across_the_sequence_and_timestamp_wrap_conceals_one_frame(
        self, plain: list[bytes]
    ):
        link = Link(plain, first_seq=SEQ_MOD - 6, first_timestamp=TS_MOD - 3 * FRAME)
        link.send_all([k for k in range(20) if k != 6])  # packet 6 has sequence number 0
        assert len(link.frames) == 20
        assert link.concealments == [("conceal", FRAME)]
        assert link.path.stats.skipped == 0

    def test_a_burst_longer_than_the_limit_conceals_only_the_limit_and_skips_the_rest(
        self, plain: list[bytes]
    ):
        burst = range(10, 18)
        link = Link(plain)
        link.send_all([k for k in range(30) if k not in burst])
        stats = link.path.stats
        assert stats.concealed == MAX_CONCEALED_FRAMES
        assert stats.skipped == len(burst) - MAX_CONCEALED_FRAMES
        assert len(link.frames) == 30 - stats.skipped
        # The concealed frames are the ones just before the packet that ended the burst.
        assert link.decoder.events[10:14] == [("conceal", FRAME)] * 3 + [("decode", 18)]
        link.assert_bounded()

    def test_a_packet_from_a_skipped_burst_that_turns_up_is_dropped(self, plain: list[bytes]):
        link = Link(plain)
        link.send_all([*range(5), 11])  # 8, 9 and 10 concealed, 5, 6 and 7 skipped
        link.send(5, at=11 * SLOT + 0.002)
        link.send_all(range(12, 20))
        assert link.path.stats.late_dropped == 1
        assert len(link.frames) == 20 - 3
        link.assert_in_order()


class TestJitter:
    def test_in_order_jittery_arrivals_are_each_released_on_arrival(self, plain: list[bytes]):
        rng = np.random.default_rng(7)
        count = 200
        nominal = np.arange(count) * SLOT + 0.05
        arrivals = np.sort(nominal + rng.uniform(-0.03, 0.03, count))  # jittered, in order
        link = Link(plain)
        for k, at in enumerate(arrivals):
            assert link.send(k, at=float(at)) == 1
        stats = link.path.stats
        assert stats.late_dropped == stats.duplicates == stats.concealed == 0
        assert stats.margin_ms == 0.0
        assert stats.jitter_ms > 1.0
        assert link.max_pending == 0  # nothing ever waits

    def test_the_jitter_estimate_ignores_a_timestamp_wrap(self, plain: list[bytes]):
        link = Link(plain, first_timestamp=TS_MOD - 5 * FRAME)
        link.send_all(range(20))
        assert link.path.stats.jitter_ms == 0.0


class TestDuplicatesAndRestarts:
    def test_duplicates_are_dropped_and_counted(self, plain: list[bytes]):
        link = Link(plain)
        link.send_all(range(10))
        assert link.send(9, at=9 * SLOT + 0.001) == 0
        assert link.send(3, at=9 * SLOT + 0.002) == 0
        link.send_all(range(10, 15))
        stats = link.path.stats
        assert stats.duplicates == 2
        assert stats.late_dropped == 0
        assert stats.margin_ms == 0.0  # a duplicate is not a late packet
        assert len(link.frames) == 15
        assert link.decoder.decoded == list(range(15))

    @pytest.mark.parametrize("jump", [5000, -5000, MAX_MISORDER + 1])
    def test_a_huge_sequence_jump_restarts_instead_of_concealing(
        self, plain: list[bytes], jump: int
    ):
        link = Link(plain)
        link.send_all(range(10))
        restart = (link.first_seq + 10 + jump) % SEQ_MOD
        for n, k in enumerate(range(10, 20)):
            assert link.send(k, seq=(restart + n) % SEQ_MOD, timestamp=777 + n * FRAME) == 1
        stats = link.path.stats
        assert stats.concealed == stats.skipped == stats.late_dropped == stats.duplicates == 0
        assert len(link.frames) == 20
        link.assert_in_order()

    def test_a_jump_within_the_misorder_window_is_a_gap(self, plain: list[bytes]):
        link = Link(plain)
        link.send_all(range(10))
        link.send(10, seq=link.first_seq + 10 + MAX_MISORDER)
        assert link.path.stats.concealed == MAX_CONCEALED_FRAMES
        assert link.path.stats.skipped == MAX_MISORDER - MAX_CONCEALED_FRAMES
        link.assert_bounded()


class TestMarginDecay:
    def test_the_margin_decays_back_to_zero_after_a_quiet_period(self, plain: list[bytes]):
        link = Link(plain)
        link.send_all(range(5))
        late_swap(link, 5, lateness=0.005)
        assert link.path.stats.margin_ms == pytest.approx(7.0)

        link.send_all(range(7, 100))  # two seconds without a late packet
        assert 3.0 < link.path.stats.margin_ms < 7.0
        link.send_all(range(100, 250))  # five seconds
        assert link.path.stats.margin_ms == 0.0
        assert link.path._margin == 0.0

        # With the margin gone, a swap is concealed again rather than held for.
        assert link.send(251) == 2
        assert link.send(250, at=251 * SLOT + 0.003) == 0
        assert link.path.stats.late_dropped == 2
        assert link.path.stats.concealed == 2


class TestBounded:
    def test_a_rough_link_accounts_for_every_packet_and_keeps_nothing(self, plain: list[bytes]):
        """Loss, reordering, duplicates and jitter together, checked by bookkeeping: every
        slot is decoded, concealed or skipped, every packet decoded or dropped."""
        rng = np.random.default_rng(11)
        count = 450
        sent: list[tuple[float, int]] = []
        for k in range(count):
            if rng.random() < 0.05:
                continue  # lost
            at = k * SLOT + rng.uniform(0.0, 0.004)
            if rng.random() < 0.06:
                at += rng.uniform(0.015, 0.05)  # overtaken by the next packet or two
            sent.append((at, k))
            if rng.random() < 0.03:
                sent.append((at + rng.uniform(0.0, 0.03), k))  # duplicated on the way
        sent.sort()
        link = Link(plain)
        for at, k in sent:
            link.send(k, at=at)
            link.assert_bounded()
        link.time.advance_to(count * SLOT + 1.0)  # let any held gap run out

        stats = link.path.stats
        decoded = len(link.decoder.decoded)
        last = max(k for _, k in sent)
        assert decoded + stats.concealed + stats.skipped == last + 1
        assert decoded + stats.late_dropped + stats.duplicates == stats.packets == len(sent)
        assert stats.frames == len(link.frames) == decoded + stats.concealed
        assert stats.late_dropped > 0
        assert stats.duplicates > 0
        assert 0 < stats.margin_ms <= MAX_MARGIN_S * 1000
        assert link.path._pending == {}
        link.assert_in_order()

    def test_after_close_nothing_more_comes_out(self, plain: list[bytes]):
        link = Link(plain)
        link.send_all(range(5))
        late_swap(link, 5, lateness=0.005)
        link.send_all(range(7, 10))
        link.send(11)  # held: a timer is armed for 10
        assert link.time.armed()

        link.path.close()
        assert link.time.armed() == []
        assert link.path._pending == {}
        frames, packets = len(link.frames), link.path.stats.packets
        link.send(10, at=11 * SLOT + 0.001)
        link.send(12)
        link.time.advance_to(1.0)
        assert len(link.frames) == frames
        assert link.path.stats.packets == packets
        with pytest.raises(OpusError, match="closed"):
            link.decoder.decode(plain[0])
        link.path.close()  # twice is harmless


async def test_on_the_real_loop_a_held_gap_is_concealed_by_the_loop_timer(plain: list[bytes]):
    frames: list[np.ndarray] = []
    path = AudioReceivePath(frames.append)
    try:
        for k in range(5):
            path.receive(k, k * FRAME, plain[k])
        path.receive(6, 6 * FRAME, plain[6])  # 5 is concealed at once: no margin yet
        await asyncio.sleep(0.01)
        path.receive(5, 5 * FRAME, plain[5])  # late: the margin grows past 10 ms
        assert path.stats.late_dropped == 1
        assert path.stats.margin_ms > 10.0
        assert len(frames) == 7

        path.receive(8, 8 * FRAME, plain[8])  # 7 is missing: held, not concealed yet
        assert len(frames) == 7
        await asyncio.sleep(path.stats.margin_ms / 1000 + 0.05)
        assert len(frames) == 9
        assert path.stats.concealed == 2
    finally:
        path.close()


class TestAiortcAdapter:
    def test_add_takes_an_rtp_packet_and_feeds_the_sink(self, plain: list[bytes]):
        link = Link(plain)
        for k in range(3):
            packet = RtpPacket(
                payload_type=OPUS_PAYLOAD_TYPE,
                sequence_number=k,
                timestamp=k * FRAME,
                payload=plain[k],
            )
            assert link.path.add(packet) == (False, None)
        assert len(link.frames) == 3
        assert link.decoder.decoded == [0, 1, 2]
        assert link.path.capacity == MAX_MISORDER

    async def test_install_routes_a_real_receivers_packets_into_the_path(self, plain: list[bytes]):
        frames: list[np.ndarray] = []
        scheduler = Scheduler()
        path = AudioReceivePath(frames.append, clock=scheduler.clock, call_at=scheduler.call_at)
        pc = RTCPeerConnection()
        try:
            receiver: Any = pc.addTransceiver("audio").receiver
            install(receiver, path)
            assert receiver._RTCRtpReceiver__jitter_buffer is path
            receiver._RTCRtpReceiver__codecs[OPUS_PAYLOAD_TYPE] = RTCRtpCodecParameters(
                mimeType="audio/opus", clockRate=RATE, channels=2, payloadType=OPUS_PAYLOAD_TYPE
            )
            for k in range(3):
                packet = RtpPacket(
                    payload_type=OPUS_PAYLOAD_TYPE,
                    sequence_number=k,
                    timestamp=k * FRAME,
                    ssrc=1234,
                    payload=plain[k],
                )
                await receiver._handle_rtp_packet(packet, arrival_time_ms=k * 20)
            assert len(frames) == 3
            assert path.stats.packets == 3
        finally:
            path.close()
            await pc.close()

    def test_install_refuses_an_object_without_a_jitter_buffer(self, plain: list[bytes]):
        link = Link(plain)

        class NotAReceiver:
            pass

        with pytest.raises(RuntimeError, match="jitter buffer"):
            install(NotAReceiver(), link.path)
