"""A stand-in for Twilio's side of a Media Stream, speaking its published protocol.

It plays what Twilio would: ``connected`` and ``start`` (with the custom parameters the
webhook's TwiML carried), the caller's audio as base64 mu-law in 20 ms ``media`` messages
in real time; it plays the server's ``media`` in real time too, echoes each ``mark`` once
the audio queued before it has played, and on ``clear`` drops what it has not played and
echoes the pending marks at once, as Twilio documents.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

import aiohttp
import numpy as np

from media.audio import mulaw

CHUNK = 160  # 20 ms of 8 kHz mu-law
FRAME_S = 0.02


class PhoneStream:
    def __init__(self, url: str, parameters: dict[str, str], caller: np.ndarray) -> None:
        self.url = url
        self.parameters = parameters
        self.caller = caller  # 8 kHz float32 mono, sent in real time, then silence
        self.received: list[tuple[float, bytes]] = []  # (arrival, mu-law) of each media
        self.marks_echoed: list[str] = []
        self.clears: list[float] = []
        self.messages: list[dict[str, Any]] = []
        self._play_until = 0.0  # when what is queued to play has played
        self._pending_marks: list[tuple[float, str]] = []
        self._http: aiohttp.ClientSession | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._echoes: set[asyncio.Future[None]] = set()
        self.sid = "MZ" + "0" * 32

    async def __aenter__(self) -> PhoneStream:
        self._http = aiohttp.ClientSession()
        self.ws = await self._http.ws_connect(self.url)
        await self._send({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        await self._send(
            {
                "event": "start",
                "sequenceNumber": "1",
                "streamSid": self.sid,
                "start": {
                    "accountSid": "AC" + "1" * 32,
                    "streamSid": self.sid,
                    "callSid": self.parameters.pop("call_sid"),
                    "tracks": ["inbound"],
                    "customParameters": self.parameters,
                    "mediaFormat": {
                        "encoding": "audio/x-mulaw",
                        "sampleRate": 8000,
                        "channels": 1,
                    },
                },
            }
        )
        self._tasks = [asyncio.create_task(self._talk()), asyncio.create_task(self._listen())]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.ws is not None and not self.ws.closed:
            await self._send({"event": "stop", "streamSid": self.sid, "stop": {}})
            await self.ws.close()
        if self._http is not None:
            await self._http.close()

    async def _send(self, message: dict[str, Any]) -> None:
        assert self.ws is not None
        await self.ws.send_str(json.dumps(message))

    async def send_dtmf(self, digit: str) -> None:
        await self._send(
            {
                "event": "dtmf",
                "streamSid": self.sid,
                "dtmf": {"track": "inbound_track", "digit": digit},
            }
        )

    async def _talk(self) -> None:
        start = time.monotonic()
        chunk = 0
        while True:
            begin = chunk * CHUNK
            samples = self.caller[begin : begin + CHUNK]
            samples = np.pad(samples, (0, CHUNK - len(samples)))
            chunk += 1
            await self._send(
                {
                    "event": "media",
                    "sequenceNumber": str(chunk + 1),
                    "streamSid": self.sid,
                    "media": {
                        "track": "inbound",
                        "chunk": str(chunk),
                        "timestamp": str(chunk * 20),
                        "payload": base64.b64encode(mulaw.encode(samples)).decode(),
                    },
                }
            )
            self._echo_due_marks()
            await asyncio.sleep(max(0.0, start + chunk * FRAME_S - time.monotonic()))

    def _echo_due_marks(self) -> None:
        now = time.monotonic()
        while self._pending_marks and self._pending_marks[0][0] <= now:
            _, name = self._pending_marks.pop(0)
            self._echo(name)

    def _echo(self, name: str) -> None:
        self.marks_echoed.append(name)
        echo = {"event": "mark", "streamSid": self.sid, "mark": {"name": name}}
        task = asyncio.ensure_future(self._send(echo))
        self._echoes.add(task)
        task.add_done_callback(self._echoes.discard)

    async def _listen(self) -> None:
        assert self.ws is not None
        async for message in self.ws:
            if message.type is not aiohttp.WSMsgType.TEXT:
                return
            event = json.loads(message.data)
            self.messages.append(event)
            now = time.monotonic()
            kind = event.get("event")
            if kind == "media":
                payload = base64.b64decode(event["media"]["payload"])
                self.received.append((now, payload))
                self._play_until = max(self._play_until, now) + len(payload) / 8000
            elif kind == "mark":
                self._pending_marks.append((max(self._play_until, now), event["mark"]["name"]))
            elif kind == "clear":
                self.clears.append(now)
                self._play_until = now
                for _, name in self._pending_marks:
                    self._echo(name)
                self._pending_marks.clear()

    def audio(self) -> np.ndarray:
        """Everything the server sent, decoded, back to back (8 kHz float32)."""
        if not self.received:
            return np.zeros(0, np.float32)
        return mulaw.decode(b"".join(payload for _, payload in self.received))
