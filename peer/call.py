"""One client-side call to a cosyrtc server: the connection the headless peer and tests use.

``PeerCall`` streams audio to the server in real time, records what comes back through the
same receive path as the server, and exchanges control messages on a data channel:

    async with PeerCall(url, audio, engine="piper") as call:
        await call.send({"type": "speak", "text": "Hello."})
        await call.wait_for("speech_finished")
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import numpy as np
from aiortc import RTCPeerConnection, RTCSessionDescription

from media.audio.opus import Application, OpusEncoder
from media.rtc.compat import install_receive_path as install
from media.rtc.ice import rtc_configuration
from media.rtc.loss_feedback import LossAdaptiveFec
from media.rtc.receive import AudioReceivePath
from peer.events import EventLog
from peer.filetracks import PEER_BITRATE, FrameRecorder, SamplesSourceTrack
from signaling.client import Answer, delete_session, post_offer, post_whip

CONNECT_TIMEOUT_S = 15.0
_OPUS_RTPMAP = re.compile(r"a=rtpmap:(\d+) opus/48000/2", re.IGNORECASE)


def declare_inband_fec(sdp: str) -> str:
    """The offer with ``useinbandfec=1`` on Opus (RFC 7587): the peer decodes FEC copies,
    so the server sends them while the peer reports loss. aiortc writes no Opus fmtp."""
    lines = sdp.split("\r\n")
    if any(line.startswith("a=fmtp:") for line in lines):
        return sdp  # parameters already chosen: left as they are
    out = []
    for line in lines:
        out.append(line)
        if match := _OPUS_RTPMAP.fullmatch(line):
            out.append(f"a=fmtp:{match.group(1)} useinbandfec=1")
    return "\r\n".join(out)


class PeerCall(EventLog):
    """A connected call; use as ``async with``. Raises ``SignalingError`` when refused."""

    def __init__(
        self,
        url: str,
        audio: np.ndarray,
        *,
        engine: str | None = None,
        options: dict[str, Any] | None = None,
        codec: dict[str, Any] | None = None,
        whip: bool = False,
        shape: Callable[[np.ndarray], np.ndarray] | None = None,
        data_channel: bool = True,
        offer_filter: Callable[[str], str] | None = None,
        answer_filter: Callable[[str], str] | None = None,
        resume: dict[str, str] | None = None,
        token: str | None = None,
    ) -> None:
        self.url = url if url.endswith("/") else url + "/"
        # SDP rewrites between the two peers (a test relay puts its own addresses in the
        # candidates); ``answer`` keeps what the server sent.
        self.offer_filter = offer_filter
        self.answer_filter = answer_filter
        self.engine = engine
        self.options = options
        self.codec = codec
        self.whip = whip
        self.resume = resume  # continue that session (``Answer.resume``) instead of a new one
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        # The peer encodes with the application it asks the server for, so a low-delay call
        # is low-delay both ways.
        application = Application[(codec or {}).get("application", "voip").upper()]
        # FEC as a browser does it: copies sent while the server reports loss, and asked for.
        encoder = OpusEncoder(channels=1, bitrate=PEER_BITRATE, application=application, fec=True)
        self.source = SamplesSourceTrack(audio, shape=shape, encoder=encoder)
        self.recorder = FrameRecorder()
        self.receive = AudioReceivePath(self.recorder)
        self.pc = RTCPeerConnection(rtc_configuration([]))
        super().__init__()
        self._connected = asyncio.Event()
        self._http: aiohttp.ClientSession | None = None
        self.answer: Answer | None = None
        self.connect_ms: float | None = None
        transceiver = self.pc.addTransceiver(self.source, direction="sendrecv")
        install(transceiver.receiver, self.receive)
        self._fec = LossAdaptiveFec(transceiver.sender, encoder, self.receive)
        self.channel = self.pc.createDataChannel("control") if data_channel else None
        if self.channel is not None:
            self.channel.on("message", self._record_event)
        self.pc.on("connectionstatechange", self._on_state)

    @property
    def session_id(self) -> str | None:
        return self.answer.session_id if self.answer else None

    def _on_state(self) -> None:
        if self.pc.connectionState == "connected":
            self._connected.set()

    async def __aenter__(self) -> PeerCall:
        try:
            await self.connect()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        started = time.monotonic()
        self._http = aiohttp.ClientSession(headers=self._headers)
        sdp = declare_inband_fec(self.pc.localDescription.sdp)
        if self.offer_filter is not None:
            sdp = self.offer_filter(sdp)
        if self.whip:
            self.answer = await post_whip(self._http, self.url, sdp, self.engine)
        else:
            self.answer = await post_offer(
                self._http, self.url, sdp, self.engine, self.options, self.codec, self.resume
            )
        answer_sdp = self.answer.sdp
        if self.answer_filter is not None:
            answer_sdp = self.answer_filter(answer_sdp)
        await self.pc.setRemoteDescription(RTCSessionDescription(answer_sdp, "answer"))
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            await self._connected.wait()
        self.connect_ms = (time.monotonic() - started) * 1000
        self._fec.start()
        if self.channel is not None and self.channel.readyState != "open":
            opened = asyncio.Event()
            self.channel.once("open", opened.set)
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                await opened.wait()

    async def send(self, message: dict[str, Any] | str) -> float:
        """Send a control message; returns the monotonic time it was handed to the channel."""
        if self.channel is None:
            raise RuntimeError("this call has no data channel")
        self.channel.send(message if isinstance(message, str) else json.dumps(message))
        return time.monotonic()

    async def end(self) -> int | None:
        """End the session on the server (DELETE); returns the HTTP status."""
        if self.answer is None or self._http is None:
            return None
        return await delete_session(self._http, self.answer)

    async def close(self) -> None:
        await self._fec.stop()
        self.receive.close()
        await self.pc.close()
        if self._http is not None:
            await self._http.close()
            self._http = None

    def received(self) -> np.ndarray:
        return self.recorder.audio()

    def sent(self) -> np.ndarray:
        return np.concatenate(self.source.sent) if self.source.sent else np.zeros(0, np.float32)
