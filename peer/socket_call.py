"""One client-side call over the WebSocket transport (``GET /ws``): what ``--ws`` uses.

``SocketCall`` has the same surface as ``peer.call.PeerCall`` (a source that streams audio
in real time, a recorder with arrival times, events, ``send``, ``wait_for``, ``end``), so
the headless peer reports a WebSocket call exactly as it reports a WebRTC one:

    async with SocketCall(url, audio, engine="echo") as call:
        await call.source.finished.wait()

It sends PCM16 (any of the server's rates) or Opus (``codec={"name": "opus"}``). It
plays what arrives as it arrives (the server paces its frames in real time) and
acknowledges every frame it has played, granting ``credit_ms`` of buffer. ``stall()`` stops
reading the socket (and so acknowledging), as a client that hangs would; ``cut()`` drops
the connection without a close, as a network that fails would.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import numpy as np

from media.audio.frames import FRAME_MS, RTC_RATE
from media.audio.opus import OpusDecoder, OpusEncoder
from media.audio.polyphase import streaming_resampler
from media.pipeline.base import ReceiveStats
from media.transports.socket_frames import SEQ_MOD, pack, unpack
from peer.events import EventLog
from peer.filetracks import PEER_BITRATE, FrameRecorder, RealTimeFrames
from signaling.client import SignalingError

CONNECT_TIMEOUT_S = 15.0
DEFAULT_CODEC: dict[str, Any] = {"name": "pcm16", "rate": RTC_RATE}
ACK_EVERY_FRAMES = 2  # one acknowledgement per 40 ms of audio played
_INT16_SCALE = 32768.0


class SocketSource(RealTimeFrames):
    """Streams samples as PCM16 (or Opus) messages, 20 ms at a time, in real time
    (``RealTimeFrames``)."""

    def __init__(
        self,
        samples: np.ndarray,
        rate: int,
        shape: Callable[[np.ndarray], np.ndarray] | None,
        encoder: OpusEncoder | None = None,
    ) -> None:
        super().__init__(samples, shape)
        self._encoder = encoder
        self._resampler = streaming_resampler(RTC_RATE, rate)
        self._timestamp = 0
        self.paused = False  # stops sending (a client that goes quiet)

    async def run(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        while not ws.closed:
            index = await self._clock.next_frame()
            if self.paused:
                continue
            frame = self._take(index)
            if self._encoder is not None:
                payload, samples = self._encoder.encode(frame), len(frame)
            else:
                pcm = self._resampler.process(frame)
                payload = np.clip(pcm * _INT16_SCALE, -32768, 32767).astype("<i2").tobytes()
                samples = len(pcm)
            try:
                await ws.send_bytes(pack(index, self._timestamp, payload))
            except (ConnectionError, RuntimeError):
                return
            self._timestamp += samples


class SocketCall(EventLog):
    """A call over ``/ws``; use as ``async with``. Raises ``SignalingError`` when refused."""

    def __init__(
        self,
        url: str,
        audio: np.ndarray,
        *,
        engine: str | None = None,
        options: dict[str, Any] | None = None,
        codec: dict[str, Any] | None = None,
        shape: Callable[[np.ndarray], np.ndarray] | None = None,
        token: str | None = None,
        credit_ms: int = 1000,
        resume: dict[str, Any] | None = None,
    ) -> None:
        base = url.rstrip("/")
        self.url = ("ws" + base[4:] if base.startswith("http") else base) + "/ws"
        self.engine = engine
        self.options = options
        self.codec = codec or DEFAULT_CODEC
        self.credit_ms = credit_ms
        self.resume = resume
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        opus = self.codec["name"] == "opus"
        rate: int = RTC_RATE if opus else self.codec.get("rate", RTC_RATE)
        self.rate = rate
        encoder = OpusEncoder(channels=1, bitrate=PEER_BITRATE) if opus else None
        self._decoder = OpusDecoder(channels=1) if opus else None
        self.source = SocketSource(audio, rate, shape, encoder)
        self.recorder = FrameRecorder()
        self.receive = _Received()
        self._to_48k = streaming_resampler(rate, RTC_RATE)
        super().__init__()
        self._reading = asyncio.Event()
        self._reading.set()
        self._http: aiohttp.ClientSession | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.ready: dict[str, Any] | None = None
        self.connect_ms: float | None = None
        self.played_seq: int | None = None  # the last frame played (acknowledged)
        self.seqs: list[int] = []  # every frame's sequence number, as received
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def session_id(self) -> str | None:
        return self.ready["session_id"] if self.ready else None

    def resume_info(self) -> dict[str, Any]:
        """What a new ``SocketCall`` passes as ``resume`` to continue this session."""
        assert self.ready is not None
        return {
            "session_id": self.ready["session_id"],
            "token": self.ready["resume_token"],
            "played_seq": self.played_seq,
        }

    async def __aenter__(self) -> SocketCall:
        try:
            await self.connect()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        started = time.monotonic()
        self._http = aiohttp.ClientSession(headers=self._headers)
        self.ws = await self._http.ws_connect(self.url, protocols=("cosyrtc",), heartbeat=5.0)
        hello: dict[str, Any] = {"type": "hello", "codec": self.codec, "credit_ms": self.credit_ms}
        if self.engine is not None:
            hello["engine"] = self.engine
        if self.options is not None:
            hello["options"] = self.options
        if self.resume is not None:
            hello["resume"] = self.resume
        await self.ws.send_str(json.dumps(hello))
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            reply = await self.ws.receive()
        answer = json.loads(reply.data) if reply.type is aiohttp.WSMsgType.TEXT else {}
        if answer.get("type") != "ready":
            code = self.ws.close_code or 4000
            raise SignalingError(
                code - 4000 if code >= 4000 else code,
                str(answer.get("error", "closed")),
                str(answer.get("message", "the server closed the socket")),
            )
        self.ready = answer
        self.connect_ms = (time.monotonic() - started) * 1000
        self._tasks = [
            asyncio.create_task(self._read(self.ws)),
            asyncio.create_task(self.source.run(self.ws)),
        ]

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        next_seq: int | None = None
        unacked = 0
        while True:
            await self._reading.wait()
            message = await ws.receive()
            if message.type is aiohttp.WSMsgType.BINARY:
                frame = unpack(message.data)
                if next_seq is not None and frame.seq != next_seq:
                    self.receive.stats.skipped += (frame.seq - next_seq) % SEQ_MOD
                next_seq = (frame.seq + 1) % SEQ_MOD
                self.seqs.append(frame.seq)
                self._play(frame.payload)
                self.played_seq = frame.seq
                unacked += 1
                if unacked >= ACK_EVERY_FRAMES:
                    unacked = 0
                    await self._send_json({"type": "ack", "seq": frame.seq})
            elif message.type is aiohttp.WSMsgType.TEXT:
                self._record_event(str(message.data))
            else:
                return

    def _play(self, payload: bytes) -> None:
        if payload and self._decoder is not None:
            pcm = self._decoder.decode(payload)
        elif payload:
            pcm = np.frombuffer(payload, dtype="<i2").astype(np.float32) / _INT16_SCALE
        else:
            pcm = np.zeros(self.rate * FRAME_MS // 1000, np.float32)
        self.receive.stats.packets += 1
        audio = self._to_48k.process(pcm)
        if len(audio):
            self.recorder(audio)

    async def _send_json(self, message: dict[str, Any]) -> None:
        if self.ws is not None and not self.ws.closed:
            try:
                await self.ws.send_str(json.dumps(message))
            except (ConnectionError, RuntimeError):
                return

    async def send(self, message: dict[str, Any] | str) -> float:
        """Send a control message; returns the monotonic time it was handed to the socket."""
        assert self.ws is not None
        await self.ws.send_str(message if isinstance(message, str) else json.dumps(message))
        return time.monotonic()

    def stall(self, stalled: bool = True) -> None:
        """Stop (or resume) reading the socket: nothing is played or acknowledged."""
        if stalled:
            self._reading.clear()
        else:
            self._reading.set()

    async def cut(self) -> None:
        """Drop the connection with no close handshake, as a failing network does."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._http is not None:
            await self._http.close()  # closes the TCP connection under the socket
            self._http = None

    async def end(self) -> int | None:
        """Hang up: the session ends on the server. Returns 200 once the socket closed."""
        if self.ws is None or self.ws.closed:
            return None
        await self._send_json({"type": "bye"})
        await self.ws.close()
        return 200

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self.ws is not None and not self.ws.closed:
            await self.ws.close()
        if self._http is not None:
            await self._http.close()
            self._http = None

    def received(self) -> np.ndarray:
        return self.recorder.audio()

    def sent(self) -> np.ndarray:
        return np.concatenate(self.source.sent) if self.source.sent else np.zeros(0, np.float32)


class _Received:
    """What the call counted of the audio it received (the report's receive stats)."""

    def __init__(self) -> None:
        self.stats = ReceiveStats()
