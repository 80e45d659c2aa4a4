"""Audio packets taken from the socket's callback: the header read as aiortc reads it, and a
real call between two aiortc peers over loopback whose packets reach the sink that way
while aiortc's statistics stay true."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
from collections.abc import Iterator
from typing import Any

import aioice.stun
import pytest
from aiortc import AudioStreamTrack, RTCPeerConnection
from aiortc.rtcrtpparameters import RTCRtpReceiveParameters
from aiortc.rtp import RtpPacket

from media.rtc.compat import (
    divert_rtp,
    install_receive_path,
    protected_rtp_send,
    received_report,
    restrict_host_addresses,
    when_receiver_starts,
)
from media.rtc.rtp_intake import RtpIntake, parse_rtp

LOOPBACK = "127.0.0.1"


def aiortc_parse(data: bytes) -> RtpPacket | None:
    try:
        return RtpPacket.parse(data)
    except ValueError:
        return None


@pytest.mark.parametrize("csrc", [[], [7], [1, 2, 3]])
@pytest.mark.parametrize("padding", [0, 1, 9])
@pytest.mark.parametrize("extension", [b"", b"\x10\x30\x00\x00", bytes(12)])
def test_the_header_reads_as_aiortc_reads_it(csrc: list[int], padding: int, extension: bytes):
    packet = RtpPacket(payload_type=111, sequence_number=65535, timestamp=4_000_000_000, ssrc=9)
    packet.csrc = csrc
    packet.payload = os.urandom(80)
    data = bytearray(packet.serialize())
    if extension:  # a one-byte-header extension block, as a browser sends one
        data[0] |= 0x10
        at = 12 + 4 * len(csrc)
        data[at:at] = b"\xbe\xde" + (len(extension) // 4).to_bytes(2, "big") + extension
    if padding:
        data[0] |= 0x20
        data += bytes(padding - 1) + bytes([padding])
    ours, theirs = parse_rtp(bytes(data)), aiortc_parse(bytes(data))
    assert ours is not None and theirs is not None
    assert (ours.payload_type, ours.sequence_number, ours.timestamp, ours.ssrc) == (
        theirs.payload_type,
        theirs.sequence_number,
        theirs.timestamp,
        theirs.ssrc,
    )
    assert ours.payload == theirs.payload == packet.payload


def test_what_aiortc_refuses_is_refused() -> None:
    rng = random.Random(5)
    valid = RtpPacket(payload_type=111, sequence_number=1, payload=b"\x01" * 20).serialize()
    cases = [b"", valid[:11], bytes([0x40]) + valid[1:], bytes([0x8F]) + valid[1:20]]
    cases += [bytes([0xB0]) + valid[1:] + b"\x00", bytes([0xA0]) + valid[1:-1] + b"\xff"]
    cases += [valid[: rng.randrange(len(valid))] for _ in range(50)]
    cases += [
        bytes([0x80 | rng.randrange(64)]) + rng.randbytes(rng.randrange(40)) for _ in range(500)
    ]
    for data in cases:
        assert (parse_rtp(data) is None) == (aiortc_parse(data) is None), data.hex()


class Sink:
    def __init__(self) -> None:
        self.packets: list[Any] = []

    def add(self, packet: Any) -> tuple[bool, None]:
        self.packets.append(packet)
        return False, None


@pytest.fixture
def loopback_ice() -> Iterator[None]:
    restrict_host_addresses([LOOPBACK])
    yield
    restrict_host_addresses([])


async def call(divert: bool) -> tuple[RTCPeerConnection, RTCPeerConnection, Any, Sink, Sink]:
    """The caller sends aiortc's own audio; the callee's receiver is diverted when it starts
    (to take Opus, or, with ``divert`` False, a payload type nobody sends)."""
    caller, callee = RTCPeerConnection(), RTCPeerConnection()
    caller.addTrack(AudioStreamTrack())
    await caller.setLocalDescription(await caller.createOffer())
    await callee.setRemoteDescription(caller.localDescription)
    receiver = callee.getTransceivers()[0].receiver
    stock, taken = Sink(), Sink()
    install_receive_path(receiver, stock)

    def start(parameters: RTCRtpReceiveParameters) -> None:
        opus = [c.payloadType for c in parameters.codecs if c.mimeType.lower() == "audio/opus"]
        intake = RtpIntake(taken, received_report(receiver))
        divert_rtp(receiver, opus if divert else [0], intake.take)

    when_receiver_starts(receiver, start)
    await callee.setLocalDescription(await callee.createAnswer())
    await caller.setRemoteDescription(callee.localDescription)
    return caller, callee, receiver, stock, taken


async def until(condition: Any, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.02)


async def stats_of(pc: RTCPeerConnection, kind: str) -> Any:
    return next(s for s in (await pc.getStats()).values() if s.type == kind)


async def test_a_calls_audio_comes_through_the_socket_callback(loopback_ice: None) -> None:
    caller, callee, receiver, stock, taken = await call(divert=True)
    try:
        await until(lambda: len(taken.packets) >= 25)
        sequence = [p.sequence_number for p in taken.packets]
        assert all((b - a) % 65536 == 1 for a, b in itertools.pairwise(sequence))
        opus = next(c for c in receiver._RTCRtpReceiver__codecs.values() if c.name == "opus")
        assert {p.payload_type for p in taken.packets} == {opus.payloadType}
        assert len(stock.packets) < 5  # at most what aiortc had queued before DTLS was up
        seen = len(taken.packets)  # the call goes on while the stats are gathered
        inbound = await stats_of(callee, "inbound-rtp")
        assert inbound.packetsReceived >= seen
        transport = await stats_of(callee, "transport")
        assert transport.packetsReceived >= seen
        sent_before = transport.packetsSent
        send = protected_rtp_send(receiver.transport)
        for k in range(3):
            send(
                RtpPacket(payload_type=111, sequence_number=k, ssrc=77, payload=b"\x08").serialize()
            )
        assert (await stats_of(callee, "transport")).packetsSent == sent_before + 3
    finally:
        await callee.close()
        await caller.close()


async def test_a_receiver_started_again_is_not_diverted_twice(loopback_ice: None) -> None:
    """aiortc calls ``receive`` again on every (re)connect, a no-op for it; so is ours."""
    pc = RTCPeerConnection()
    receiver = pc.addTransceiver("audio").receiver
    calls: list[RTCRtpReceiveParameters] = []

    async def stock_receive(parameters: RTCRtpReceiveParameters) -> None:
        return None

    receiver.receive = stock_receive  # type: ignore[method-assign]
    when_receiver_starts(receiver, calls.append)
    parameters = RTCRtpReceiveParameters()
    await receiver.receive(parameters)
    await receiver.receive(parameters)
    assert calls == [parameters]
    await pc.close()


async def test_other_payload_types_still_go_aiortcs_way(loopback_ice: None) -> None:
    caller, callee, _, stock, taken = await call(divert=False)
    try:
        await until(lambda: len(stock.packets) >= 25)
        assert taken.packets == []
        assert (await stats_of(callee, "inbound-rtp")).packetsReceived >= 25
    finally:
        await callee.close()
        await caller.close()


async def test_media_is_not_tried_as_stun_and_stun_still_is(
    loopback_ice: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once diverted, the callee's RTP skips aioice's STUN parser (which raised per packet);
    the ICE consent checks, which are STUN, still reach it and keep the call up. (Only the
    callee receives RTP: the caller gets RTCP, through its stock, undiverted path.)"""
    tried: list[bytes] = []
    stock_parse = aioice.stun.parse_message

    def parse(data: bytes) -> Any:
        tried.append(data[:2])
        return stock_parse(data)

    monkeypatch.setattr(aioice.stun, "parse_message", parse)
    caller, callee, _, _, taken = await call(divert=True)
    try:
        await until(lambda: len(taken.packets) >= 5)
        tried.clear()
        packets = len(taken.packets)
        await until(lambda: len(taken.packets) >= packets + 50)
        rtp = [head for head in tried if 127 < head[0] < 192 and not 192 <= head[1] < 224]
        assert rtp == []
        assert callee.iceConnectionState in ("completed", "connected")
    finally:
        await callee.close()
        await caller.close()
