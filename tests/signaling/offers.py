"""Offers made by a real aiortc peer, edits that break them, and a loopback-only guard."""

from __future__ import annotations

import re
from collections.abc import Callable

from aiortc import RTCPeerConnection, RTCSessionDescription

from media.rtc.ice import rtc_configuration

LOOPBACK = "127.0.0.1"


def assert_loopback_only(sdp: str) -> None:
    """Every candidate in ``sdp`` is on 127.0.0.1, so a session answering it stays local."""
    for line in sdp.splitlines():
        if line.startswith("a=candidate:"):
            assert line.split()[4] == LOOPBACK, f"non-loopback candidate: {line}"


async def new_offer(
    audio: str | None = "sendrecv", video: bool = False, data_channel: bool = False
) -> str:
    """The SDP of an offer from a fresh peer (closed again before returning)."""
    pc = RTCPeerConnection(rtc_configuration([]))
    try:
        if audio is not None:
            pc.addTransceiver("audio", direction=audio)
        if video:
            pc.addTransceiver("video", direction="sendrecv")
        if data_channel:
            pc.createDataChannel("control")
        await pc.setLocalDescription(await pc.createOffer())
        sdp = pc.localDescription.sdp
    finally:
        await pc.close()
    assert_loopback_only(sdp)
    return sdp


class LivePeer:
    """A peer that stays open, so the session answering it connects over loopback."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection(rtc_configuration([]))
        self.pc.addTransceiver("audio", direction="sendrecv")

    async def offer(self) -> str:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        sdp = self.pc.localDescription.sdp
        assert_loopback_only(sdp)
        return sdp

    async def accept(self, answer_sdp: str) -> None:
        await self.pc.setRemoteDescription(RTCSessionDescription(answer_sdp, "answer"))

    async def close(self) -> None:
        await self.pc.close()


def drop_lines(sdp: str, keep: Callable[[str], bool]) -> str:
    return "\r\n".join(line for line in sdp.splitlines() if keep(line)) + "\r\n"


def without_prefix(sdp: str, *prefixes: str) -> str:
    return drop_lines(sdp, lambda line: not line.startswith(prefixes))


def without_opus(sdp: str) -> str:
    """The same offer with Opus removed from the audio m-line and its rtpmap/fmtp lines."""
    opus = re.search(r"^a=rtpmap:(\d+) opus/", sdp, re.MULTILINE | re.IGNORECASE)
    assert opus, "the offer has no Opus to remove"
    pt = opus.group(1)
    lines = []
    for line in sdp.splitlines():
        if line.startswith(("a=rtpmap:" + pt + " ", "a=fmtp:" + pt + " ", "a=rtcp-fb:" + pt)):
            continue
        if line.startswith("m=audio "):
            head = line.split()
            line = " ".join(head[:3] + [fmt for fmt in head[3:] if fmt != pt])
        lines.append(line)
    return "\r\n".join(lines) + "\r\n"


def audio_direction(sdp: str) -> str:
    """The direction attribute of the first audio m-line of ``sdp``."""
    in_audio = False
    for line in sdp.splitlines():
        if line.startswith("m="):
            in_audio = line.startswith("m=audio ")
        elif in_audio and line in ("a=sendrecv", "a=sendonly", "a=recvonly", "a=inactive"):
            return line[2:]
    raise AssertionError("no direction on the audio m-line")
