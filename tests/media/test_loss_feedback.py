"""Loss-adaptive FEC: the expected loss follows receiver reports; copies appear with it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from media.audio.opus import Application, OpusEncoder, packet_has_fec
from media.rtc import loss_feedback
from media.rtc.loss_feedback import LossAdaptiveFec, LossEstimate
from media.rtc.receive import AudioReceivePath
from peer.call import declare_inband_fec
from peer.speech import speech_with_pauses


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    """Two seconds of real speech: libopus makes copies of what it takes for voice."""
    return speech_with_pauses().clean[: 2 * 48_000]


def fec_share(encoder: OpusEncoder, signal: np.ndarray) -> float:
    packets = [encoder.encode(signal[i : i + 960]) for i in range(0, len(signal) - 959, 960)]
    return sum(map(packet_has_fec, packets[5:])) / len(packets[5:])


class TestLossEstimate:
    def test_no_loss_means_no_fec(self) -> None:
        estimate = LossEstimate()
        assert [estimate.report(0.0) for _ in range(5)] == [0] * 5

    def test_loss_is_taken_at_once_and_let_go_slowly(self) -> None:
        estimate = LossEstimate()
        assert estimate.report(0.04) == 4
        after = [estimate.report(0.0) for _ in range(20)]
        assert after[0] == 4  # 3.2 %, rounded up
        assert after == sorted(after, reverse=True)
        assert 0 < after[3] < 4
        assert after[-1] == 0  # clean for 20 s: the copies stop

    def test_heavy_loss_is_capped(self) -> None:
        assert LossEstimate().report(0.3) == loss_feedback.MAX_PERCENT
        assert LossEstimate().report(-1.0) == 0

    def test_an_outage_is_not_loss_to_code_for(self) -> None:
        estimate = LossEstimate()
        assert estimate.report(1.0) == 0  # a cut link
        assert estimate.report(0.6) == 0
        assert estimate.report(0.03) == 3


class TestEncoder:
    def test_copies_come_with_expected_loss_and_go_without(self, speech: np.ndarray) -> None:
        encoder = OpusEncoder(application=Application.VOIP, bitrate=96_000, fec=True)
        assert fec_share(encoder, speech) == 0.0  # CELT only: no copies while nothing is lost
        encoder.set_expected_loss(5)
        assert fec_share(encoder, speech) > 0.5  # voiced frames (not the pauses)
        encoder.set_expected_loss(0)
        assert fec_share(encoder, speech) == 0.0

    def test_without_fec_an_expected_loss_changes_nothing(self, speech: np.ndarray) -> None:
        encoder = OpusEncoder(application=Application.VOIP, bitrate=96_000, fec=False)
        encoder.set_expected_loss(10)
        assert fec_share(encoder, speech) == 0.0


@dataclass
class Report:
    fractionLost: int
    type: str = "remote-inbound-rtp"


class ReportingSender:
    """Stands in for aiortc's RTCRtpSender: getStats with the far end's latest report."""

    def __init__(self) -> None:
        self.fraction: int | None = None

    async def getStats(self) -> dict[str, Any]:
        return {} if self.fraction is None else {"r": Report(self.fraction)}


async def test_the_encoder_follows_the_reports(
    monkeypatch: pytest.MonkeyPatch, speech: np.ndarray
) -> None:
    monkeypatch.setattr(loss_feedback, "POLL_S", 0.01)
    sender = ReportingSender()
    encoder = OpusEncoder(application=Application.VOIP, bitrate=96_000, fec=True)
    follower = LossAdaptiveFec(sender, encoder)
    follower.start()
    try:
        await asyncio.sleep(0.05)
        assert follower.expected_percent == 0  # no report yet
        sender.fraction = 13  # 13/256: 5 %
        await asyncio.sleep(0.05)
        assert follower.expected_percent == 6
        assert fec_share(encoder, speech) > 0.5
    finally:
        await follower.stop()


async def test_a_loss_on_the_way_in_starts_copies_before_any_report(
    monkeypatch: pytest.MonkeyPatch, speech: np.ndarray
) -> None:
    monkeypatch.setattr(loss_feedback, "POLL_S", 0.01)
    sender = ReportingSender()
    encoder = OpusEncoder(application=Application.VOIP, bitrate=96_000, fec=True)
    receive = AudioReceivePath(lambda frame: None)
    follower = LossAdaptiveFec(sender, encoder, receive)
    assert receive.on_loss == follower.on_receive_loss
    follower.on_receive_loss(1)
    assert follower.expected_percent == 0  # not started: no call to protect yet
    follower.start()
    try:
        receive.stats.packets = 10
        follower.on_receive_loss(1)  # one of the first packets: judged over a second's worth
        assert follower.expected_percent == 2
        assert fec_share(encoder, speech) > 0.5
        follower.on_receive_loss(5)  # the encoder codes for loss already: reports lead
        assert follower.expected_percent == 2
        sender.fraction = 0  # the far end reports a clean way out: the copies wind down
        await asyncio.sleep(0.5)
        assert follower.expected_percent == 0
    finally:
        await follower.stop()


async def test_an_outage_on_the_way_in_starts_no_copies() -> None:
    receive = AudioReceivePath(lambda frame: None)
    follower = LossAdaptiveFec(ReportingSender(), OpusEncoder(fec=True), receive)
    follower.start()
    try:
        follower.on_receive_loss(100)  # a cut link, not loss FEC can bridge
        assert follower.expected_percent == 0
    finally:
        await follower.stop()


async def test_nothing_runs_when_the_far_end_did_not_ask_for_fec() -> None:
    follower = LossAdaptiveFec(ReportingSender(), OpusEncoder(fec=False))
    follower.start()
    assert follower._task is None
    await follower.stop()


def test_the_peer_offers_inband_fec_once() -> None:
    offer = "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 96\r\na=rtpmap:96 opus/48000/2\r\na=sendrecv\r\n"
    declared = declare_inband_fec(offer)
    assert "a=rtpmap:96 opus/48000/2\r\na=fmtp:96 useinbandfec=1\r\n" in declared
    assert declare_inband_fec(declared) == declared
