"""A message socket's incoming audio: decoded, framed, held to real time, fed to a pipeline.

A WebSocket is reliable and ordered, so there is nothing to reorder or conceal; what it
cannot do is keep a client honest about time. A client may send faster than real time (a
file, a backlog after a stall) or faster than the engine keeps up with. Either way the
oldest audio is dropped and counted, and the client is told (``backpressure``, with the
queue level), instead of the session's latency growing without bound:

- frames within the real-time budget (real time plus a short burst allowance) are fed at
  once, so a steady client pays no delay;
- frames beyond it wait in a short backlog released at real time; when the backlog is full
  its oldest frame goes;
- the engine's own input queue drops its oldest frame when the engine falls behind.

It is an ``AudioInput`` of the pipeline it feeds.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from media.audio.frames import FRAME_MS, FRAME_SAMPLES
from media.audio.realtime import RealTimeBudget
from media.pipeline.base import ReceiveStats
from media.transports.codecs import SocketCodec, UndecodableAudio
from media.transports.socket_frames import SEQ_MOD, MalformedFrame, unpack

log = logging.getLogger(__name__)

FRAME_SECONDS = FRAME_MS / 1000
# How far ahead of real time a client's burst is fed at once: as much as the RTP path allows
# (media.rtc.receive), so a client that stalled (its loop, its network) and catches up
# loses nothing; past it, the backlog and then the drops begin.
BURST_ALLOWANCE_S = 0.5
BACKLOG_FRAMES = 10  # 200 ms waiting for real time, at most
# Tell the client once this much waits for real time, or the engine holds this many frames.
BACKPRESSURE_AT_FRAMES = BACKLOG_FRAMES // 2
ENGINE_BEHIND_AT_FRAMES = 4
BACKPRESSURE_INTERVAL_S = 0.25  # one ``backpressure`` message per this, at most
ERROR_INTERVAL_S = 10.0  # one ``undecodable_audio`` error per this, at most
UNDECODABLE_AUDIO = "undecodable_audio"

FrameSink = Callable[[np.ndarray], None]
MessageSink = Callable[[dict[str, Any]], None]
ErrorSink = Callable[[str, str], None]


class SocketInput:
    """One socket connection's audio into a pipeline (``feed``), at most real time."""

    def __init__(
        self,
        codec: SocketCodec,
        feed: FrameSink,
        tell: MessageSink,
        engine_load: Callable[[], tuple[int, int]],
        on_error: ErrorSink | None = None,
    ) -> None:
        self._codec = codec
        self._feed = feed
        self._tell = tell
        self._engine_load = engine_load
        self.on_error = on_error
        self._loop = asyncio.get_running_loop()
        self._budget = RealTimeBudget(BURST_ALLOWANCE_S, self._loop.time())
        self._partial = np.zeros(0, np.float32)
        self._backlog: deque[tuple[np.ndarray, float]] = deque()
        self._release_timer: asyncio.TimerHandle | None = None
        self._next_seq: int | None = None
        self._pressing = False
        self._engine_dropped = 0
        self._told_at = -BACKPRESSURE_INTERVAL_S
        self._error_at = -ERROR_INTERVAL_S
        self._closed = False
        self.stats = ReceiveStats()
        self.arrived_at = 0.0

    # --- messages ------------------------------------------------------------------------

    def receive(self, data: bytes) -> None:
        """One binary message from the client (``socket_frames``: header and payload)."""
        try:
            message = unpack(data)
        except MalformedFrame as exc:
            self.stats.packets += 1
            self._undecodable(str(exc), self._loop.time())
            return
        self.receive_payload(message.seq, message.payload)

    def receive_payload(self, seq: int, payload: bytes) -> None:
        """One message's audio, numbered ``seq`` by the client (gaps are counted)."""
        if self._closed:
            return
        now = self._loop.time()
        self.stats.packets += 1
        try:
            pcm = self._codec.decode(payload)
        except UndecodableAudio as exc:
            self._undecodable(str(exc), now)
            return
        if self._next_seq is not None and seq != self._next_seq:
            self.stats.skipped += (seq - self._next_seq) % SEQ_MOD
        self._next_seq = (seq + 1) % SEQ_MOD
        self._frame(pcm, now)

    def _undecodable(self, why: str, now: float) -> None:
        self.stats.undecodable += 1
        if now - self._error_at >= ERROR_INTERVAL_S:
            self._error_at = now
            log.info("socket audio message dropped: %s", why)
            if self.on_error is not None:
                self.on_error(UNDECODABLE_AUDIO, f"An audio message was dropped: {why}.")

    def _frame(self, pcm: np.ndarray, now: float) -> None:
        """Cut the decoded audio into 20 ms frames and pass each to the gate."""
        if len(self._partial):
            pcm = np.concatenate([self._partial, pcm])
        whole = len(pcm) // FRAME_SAMPLES * FRAME_SAMPLES
        self._partial = pcm[whole:].copy()
        for start in range(0, whole, FRAME_SAMPLES):
            self._admit(pcm[start : start + FRAME_SAMPLES], now)
        self._check_pressure(now)

    # --- real time -----------------------------------------------------------------------

    def _admit(self, frame: np.ndarray, now: float) -> None:
        if not self._backlog and self._budget.spend(FRAME_SECONDS, now):
            self._deliver(frame, now)
            return
        if len(self._backlog) == BACKLOG_FRAMES:
            self._backlog.popleft()
            self.stats.over_real_time += 1
            self.stats.dropped_ms += FRAME_MS
        self._backlog.append((frame, now))
        self._arm_release()

    def _deliver(self, frame: np.ndarray, arrived: float) -> None:
        self.stats.frames += 1
        self.arrived_at = arrived
        self._feed(frame)

    def _arm_release(self) -> None:
        if self._release_timer is None and not self._closed:
            self._release_timer = self._loop.call_later(FRAME_SECONDS, self._release)

    def _release(self) -> None:
        """Feed what the budget allows of the backlog, oldest first."""
        self._release_timer = None
        now = self._loop.time()
        while self._backlog and self._budget.spend(FRAME_SECONDS, now):
            frame, arrived = self._backlog.popleft()
            self._deliver(frame, arrived)
        if self._backlog:
            self._arm_release()
        self._check_pressure(now)

    # --- telling the client --------------------------------------------------------------

    @property
    def queued_ms(self) -> int:
        return len(self._backlog) * FRAME_MS

    def _check_pressure(self, now: float) -> None:
        engine, self._engine_dropped = self._engine_load()
        if len(self._backlog) >= BACKPRESSURE_AT_FRAMES:
            reason = "faster_than_real_time"
        elif engine >= ENGINE_BEHIND_AT_FRAMES:
            reason = "engine_behind"
        else:
            if self._pressing and not self._backlog:
                self._pressing = False
                self._send_pressure("relieved", engine, now)
            return
        if not self._pressing or now - self._told_at >= BACKPRESSURE_INTERVAL_S:
            self._pressing = True
            self._send_pressure(reason, engine, now)

    def _send_pressure(self, reason: str, engine: int, now: float) -> None:
        self._told_at = now
        self._tell(
            {
                "type": "backpressure",
                "reason": reason,
                "queued_ms": self.queued_ms + engine * FRAME_MS,
                "dropped_ms": self.stats.dropped_ms + self._engine_dropped * FRAME_MS,
            }
        )

    def close(self) -> None:
        self._closed = True
        if self._release_timer is not None:
            self._release_timer.cancel()
            self._release_timer = None
        self._backlog.clear()
