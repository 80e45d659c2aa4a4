"""The audio of one utterance computed elsewhere, between a link's loop and the synthesis
thread: a Triton server's gRPC stream (``cosyvoice_triton``) or the model host's socket
(``hosted``).

The loop puts chunks in as they arrive (the official runtime's chunks grow from 0.6 s to
several seconds); the synthesis thread takes them out 20 ms at a time. The queue is
bounded: once ``limit`` samples wait, ``put`` waits until the thread has taken some, so a
session that stops pulling (its output is far ahead, or it stalls) holds at most ``limit``
samples plus one chunk, and the transport's flow control holds the rest on the far side
(gRPC's own; the model host's credit, for which ``push`` adds without waiting).

The speak pipeline's ``cancel`` is a plain ``threading.Event`` that nothing announces, so a
thread waiting for audio re-checks it every ``CANCEL_CHECK_S``; audio, the end and an error
wake it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque

import numpy as np

from media.engines.base import EngineError

CANCEL_CHECK_S = 0.01  # half a frame: a cancel is seen within this while waiting for audio


class NoAudioInTime(EngineError):
    """The server sent nothing for longer than the engine's chunk timeout."""


class FrameQueue:
    """Chunks in (on the loop), fixed frames out (on a thread), at most ``limit`` waiting."""

    def __init__(self, frame: int, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        if frame <= 0 or limit < frame:
            raise ValueError("frame must be positive and limit at least one frame")
        self.frame = frame
        self.limit = limit
        self._loop = loop
        self._changed = threading.Condition()
        self._chunks: deque[np.ndarray] = deque()
        self._offset = 0  # samples of _chunks[0] already taken
        self._held = 0
        self._ended = False
        self._error: BaseException | None = None
        self._space = asyncio.Event()  # loop side: set when there is room again
        self._space.set()
        self.peak = 0  # the most samples held at once (tests, stats)
        self.received = 0  # samples put in

    # --- the loop's side -------------------------------------------------------------------

    async def put(self, audio: np.ndarray) -> None:
        """Add a chunk once fewer than ``limit`` samples wait (or the queue has ended)."""
        while True:
            with self._changed:
                if self._held < self.limit or self._ended:
                    break
                self._space.clear()
            await self._space.wait()
        self.push(audio)

    def push(self, audio: np.ndarray) -> None:
        """Add a chunk now, whatever is held: for a sender that bounds what it sends."""
        with self._changed:
            if self._ended or not len(audio):
                return
            self._chunks.append(audio)
            self._held += len(audio)
            self.received += len(audio)
            self.peak = max(self.peak, self._held)
            self._changed.notify_all()

    def end(self, error: BaseException | None = None) -> None:
        """No more audio: the utterance is complete, failed (``error``) or closed. Any side."""
        with self._changed:
            if self._ended:
                return
            self._ended = True
            self._error = error
            self._changed.notify_all()
        self._wake_writer()

    # --- the synthesis thread's side -------------------------------------------------------

    def take(self, cancel: threading.Event, timeout: float) -> np.ndarray | None:
        """The next frame; the last one may be shorter. None at the end or once ``cancel``
        is set; raises the stream's error, or ``NoAudioInTime`` after ``timeout`` seconds
        without a frame."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._held < self.frame and not self._ended:
                if cancel.is_set():
                    return None
                left = deadline - time.monotonic()
                if left <= 0:
                    raise NoAudioInTime(f"no audio from the server for {timeout:g} s")
                self._changed.wait(min(CANCEL_CHECK_S, left))
            if cancel.is_set():
                return None
            if self._held < self.frame and self._error is not None:
                raise self._error
            if not self._held:
                return None
            frame = self._pop(min(self.frame, self._held))
        self._wake_writer()
        return frame

    def _pop(self, count: int) -> np.ndarray:
        out = np.empty(count, np.float32)
        filled = 0
        while filled < count:
            head = self._chunks[0]
            part = head[self._offset : self._offset + count - filled]
            out[filled : filled + len(part)] = part
            filled += len(part)
            self._offset += len(part)
            if self._offset == len(head):
                self._chunks.popleft()
                self._offset = 0
        self._held -= count
        return out

    @property
    def held(self) -> int:
        with self._changed:
            return self._held

    def _wake_writer(self) -> None:
        with self._changed:
            room = self._held < self.limit or self._ended
        if room:
            # A closed loop (the link is gone) has no writer left to wake.
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._space.set)
