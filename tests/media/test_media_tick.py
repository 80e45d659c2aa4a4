"""The media tick: every session's frames from one task, packed as real RTP.

The streams here send into lists instead of a DTLS transport (the calls over loopback in
``tests/integration`` send through the real one); the pacers, encoders and the RTP parser
that checks the packets are the real ones.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from aiortc.rtcrtpparameters import (
    RTCRtpCodecParameters,
    RTCRtpHeaderExtensionParameters,
    RTCRtpSendParameters,
)
from aiortc.rtp import HeaderExtensionsMap, RtpPacket

from media.audio.frames import FRAME_SAMPLES, RTC_RATE
from media.audio.opus import OpusEncoder
from media.pipeline.outbound import OutboundAudio
from media.rtc.media_tick import MediaTick
from media.rtc.rtp_stream import RtpAudioStream

MID_URI = "urn:ietf:params:rtp-hdrext:sdes:mid"


def parameters() -> RTCRtpSendParameters:
    return RTCRtpSendParameters(
        codecs=[RTCRtpCodecParameters("audio/opus", clockRate=48000, channels=2, payloadType=111)],
        headerExtensions=[RTCRtpHeaderExtensionParameters(id=1, uri=MID_URI)],
        muxId="0",
    )


def output() -> OutboundAudio:
    return OutboundAudio(OpusEncoder(channels=1), capacity_seconds=2.0, max_backlog=FRAME_SAMPLES)


class Wire:
    def __init__(self, fail_with: type[Exception] | None = None) -> None:
        self.packets: list[tuple[float, bytes]] = []
        self.fail_with = fail_with

    def send(self, data: bytes) -> None:
        if self.fail_with is not None:
            raise self.fail_with("the wire is cut")
        self.packets.append((asyncio.get_running_loop().time(), data))


def parsed(wire: Wire) -> list[RtpPacket]:
    extensions = HeaderExtensionsMap()
    extensions.configure(parameters())
    return [RtpPacket.parse(data, extensions) for _, data in wire.packets]


async def produce(out: OutboundAudio, frames: int) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    for i in range(frames):
        out.write(np.full(FRAME_SAMPLES, 0.1, np.float32))
        await asyncio.sleep(max(0.0, start + (i + 1) * FRAME_SAMPLES / RTC_RATE - loop.time()))


def test_a_frame_is_the_rtp_packet_aiortc_would_send() -> None:
    sent: list[bytes] = []
    reports: list[tuple[int, int, int, int]] = []
    stream = RtpAudioStream(
        parameters(), ssrc=1234, send=sent.append, on_sent=lambda *r: reports.append(r)
    )
    stream.send(b"\x01\x02\x03", pts=0)
    stream.send(b"\x04\x05", pts=960)
    extensions = HeaderExtensionsMap()
    extensions.configure(parameters())
    first, second = (RtpPacket.parse(data, extensions) for data in sent)
    assert (first.version, first.payload_type, first.ssrc, first.marker) == (2, 111, 1234, 1)
    assert first.extensions.mid == "0"
    assert (first.payload, second.payload) == (b"\x01\x02\x03", b"\x04\x05")
    assert second.sequence_number == (first.sequence_number + 1) % 65536
    assert second.timestamp == (first.timestamp + 960) % (1 << 32)
    # What the RTCP sender report reads: packets, payload octets, the last RTP timestamp.
    assert reports[-1][:3] == (2, 5, second.timestamp)


async def test_one_tick_sends_each_session_its_own_steady_stream() -> None:
    tick = MediaTick(asyncio.get_running_loop())
    wires = [Wire(), Wire(), Wire()]
    outputs = [output() for _ in wires]
    for out, wire in zip(outputs, wires, strict=True):
        tick.add(out, RtpAudioStream(parameters(), ssrc=1000 + len(wire.packets), send=wire.send))
    await asyncio.gather(*(produce(out, 25) for out in outputs))
    await asyncio.sleep(0.05)
    for wire in wires:
        packets = parsed(wire)
        assert 24 <= len(packets) <= 27
        assert all(p.payload_type == 111 and p.extensions.mid == "0" for p in packets)
        seqs = np.diff([p.sequence_number for p in packets]) % 65536
        assert np.all(seqs == 1)
        steps = np.diff([p.timestamp for p in packets]) % (1 << 32)
        assert np.all(steps % FRAME_SAMPLES == 0) and np.all(steps > 0)
        gaps = np.diff([t for t, _ in wire.packets])
        assert np.median(gaps) == pytest.approx(0.020, abs=0.003)
    # Three sessions, one timer: far fewer turns than the frames they sent.
    assert tick.turns < sum(len(w.packets) for w in wires)


async def test_a_session_that_fails_leaves_the_tick_and_the_others_go_on() -> None:
    tick = MediaTick(asyncio.get_running_loop())
    good, broken, offline = Wire(), Wire(fail_with=RuntimeError), Wire(fail_with=ConnectionError)
    outs = [output(), output(), output()]
    tick.add(outs[0], RtpAudioStream(parameters(), ssrc=1, send=good.send))
    failing = tick.add(outs[1], RtpAudioStream(parameters(), ssrc=2, send=broken.send))
    not_up = tick.add(outs[2], RtpAudioStream(parameters(), ssrc=3, send=offline.send))
    await asyncio.gather(*(produce(out, 10) for out in outs))
    assert len(good.packets) >= 9
    assert not failing.active, "a stream whose sending raised stops"
    assert not_up.active and not_up.send_failures >= 9, "a dropped connection only drops frames"
    assert tick.streams == 2


async def test_a_closed_output_leaves_the_tick() -> None:
    tick = MediaTick(asyncio.get_running_loop())
    wire = Wire()
    out = output()
    stream = tick.add(out, RtpAudioStream(parameters(), ssrc=9, send=wire.send))
    await produce(out, 3)
    out.close()
    out.write(np.zeros(FRAME_SAMPLES, np.float32))  # wakes the tick, which finds it closed
    await asyncio.sleep(0.01)
    assert not stream.active and tick.streams == 0
