"""Cheap load-generating WebRTC callers for capacity benchmarks.

A measuring caller costs a few percent of a core (decoding, recording, analysis), too much
to verify high session counts on one client core. Load callers here are cheaper:

- they send Opus packets encoded once, in advance, and cycled (no per-frame encoding);
- most of them do not decode what comes back: a counting sink replaces the receive path,
  so an incoming packet costs aiortc's SRTP and RTP handling only;
- a few "probe" callers per level do decode, with chirp markers in what they send, and
  measure the round trip exactly as the headless peer does.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import av
import numpy as np
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from media.audio.frames import FRAME_SAMPLES
from media.audio.opus import OpusEncoder
from media.rtc.compat import install_receive_path as install
from media.rtc.ice import rtc_configuration
from media.rtc.receive import AudioReceivePath
from media.rtc.tracks import TIME_BASE
from peer.filetracks import FrameRecorder, RealTimeClock
from peer.probe import ChirpInserter, Timeline, detect_markers, rtt_from_markers
from signaling.client import Answer, delete_session, post_offer

CONNECT_TIMEOUT_S = 20.0


@dataclass
class EncodedClip:
    """A clip encoded once: Opus payloads, and where chirp markers start (sample index)."""

    payloads: list[bytes]
    markers: list[int]
    sent_audio: np.ndarray

    @classmethod
    def encode(cls, audio: np.ndarray, with_markers: bool) -> EncodedClip:
        frames = len(audio) // FRAME_SAMPLES
        inserter = ChirpInserter() if with_markers else None
        encoder = OpusEncoder(channels=1, bitrate=64_000)
        payloads, sent = [], []
        for index in range(frames):
            frame = audio[index * FRAME_SAMPLES : (index + 1) * FRAME_SAMPLES]
            if inserter is not None:
                frame = inserter.process(frame)
            payloads.append(encoder.encode(frame))
            sent.append(frame)
        encoder.close()
        markers = inserter.marker_starts if inserter is not None else []
        return cls(payloads, markers, np.concatenate(sent))


class CyclingTrack(MediaStreamTrack):
    """Sends a pre-encoded clip on repeat at real-time pace (or ``speed`` times it),
    stamping each frame's send time."""

    kind = "audio"

    def __init__(self, clip: EncodedClip, speed: float = 1.0) -> None:
        super().__init__()
        self._clip = clip
        self._clock = RealTimeClock(speed)
        self.timeline = Timeline()

    async def recv(self) -> av.Packet:
        if self.readyState != "live":
            raise MediaStreamError
        index = await self._clock.next_frame()
        packet = av.Packet(self._clip.payloads[index % len(self._clip.payloads)])
        packet.pts = index * FRAME_SAMPLES
        packet.time_base = TIME_BASE
        self.timeline.append(FRAME_SAMPLES, time.monotonic())
        return packet


class CountingSink:
    """Stands in for the receive path: counts packets, decodes nothing."""

    def __init__(self) -> None:
        self.packets = 0

    @property
    def capacity(self) -> int:
        return 1

    def add(self, packet: Any) -> tuple[bool, None]:
        self.packets += 1
        return False, None


@dataclass
class LoadCaller:
    url: str
    engine: str
    clip: EncodedClip
    probe: bool
    speed: float = 1.0  # of the audio sent, against real time
    pc: RTCPeerConnection = field(init=False)
    track: CyclingTrack = field(init=False)
    answer: Answer | None = None
    sink: CountingSink | None = None
    recorder: FrameRecorder | None = None
    receive: AudioReceivePath | None = None

    def __post_init__(self) -> None:
        self.pc = RTCPeerConnection(rtc_configuration([]))
        self.track = CyclingTrack(self.clip, self.speed)
        receiver = self.pc.addTransceiver(self.track, direction="sendrecv").receiver
        if self.probe:
            self.recorder = FrameRecorder()
            self.receive = AudioReceivePath(self.recorder)
            install(receiver, self.receive)
        else:
            self.sink = CountingSink()
            install(receiver, self.sink)

    async def connect(self, http: aiohttp.ClientSession) -> None:
        connected = asyncio.Event()

        @self.pc.on("connectionstatechange")
        def on_state() -> None:
            if self.pc.connectionState == "connected":
                connected.set()

        await self.pc.setLocalDescription(await self.pc.createOffer())
        self.answer = await post_offer(http, self.url, self.pc.localDescription.sdp, self.engine)
        await self.pc.setRemoteDescription(RTCSessionDescription(self.answer.sdp, "answer"))
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            await connected.wait()

    @property
    def packets_received(self) -> int:
        if self.sink is not None:
            return self.sink.packets
        assert self.receive is not None
        return self.receive.stats.packets

    def rtts_since(self, since: float) -> list[float]:
        """RTTs (seconds) of the markers that came back at or after monotonic time ``since``."""
        if self.recorder is None or not self.recorder.frames:
            return []
        template = ChirpInserter().template
        found = detect_markers(self.recorder.audio(), template)
        arrivals = [self.recorder.timeline.time_of(index) for index in found]
        sent_total, length = self.track.timeline.total_samples, len(self.clip.sent_audio)
        sent = [
            self.track.timeline.time_of(cycle * length + marker)
            for cycle in range(sent_total // length + 1)
            for marker in self.clip.markers
            if cycle * length + marker + len(template) <= sent_total
        ]
        return rtt_from_markers(sent, [t for t in arrivals if t >= since])

    async def close(self, http: aiohttp.ClientSession | None) -> None:
        if http is not None and self.answer is not None:
            with contextlib.suppress(aiohttp.ClientError):
                await delete_session(http, self.answer)
        if self.receive is not None:
            self.receive.close()
        await self.pc.close()
