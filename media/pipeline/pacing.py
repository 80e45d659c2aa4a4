"""The slot schedule that decides when each outgoing 20 ms frame may leave.

aiortc's sender does no pacing: it sends whatever ``recv()`` returns as soon as it returns.
The pacer gives every frame a slot ``anchor + index * 20 ms``. A frame that is ready goes
out at once, but never before its slot starts, so a burst (TTS faster than real time, a
jitter buffer releasing a backlog) still leaves at 50 frames per second. When a slot ends
with nothing ready, the slot is filled with silence and counted as an underrun.

Phase lock: a frame that is ready before its slot waits, and waiting until the time a frame
normally arrives costs nothing, while a frame later than its slot's end costs an underrun.
So slots start where frames normally become ready: the first frame anchors the schedule,
and whenever every frame of the last second had to wait, the schedule moves earlier by the
shortest wait. Frames then leave the moment they are ready, a frame may be up to a whole
slot late before silence is sent, and a transform adds no pacing delay on a steady input.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import numpy as np

from media.audio.frames import FRAME_MS, FRAME_SAMPLES
from media.audio.ringbuffer import RingBuffer

FRAME_SECONDS = FRAME_MS / 1000
# Frames per phase check: if all of them waited for their slot, the slots move earlier.
PHASE_WINDOW_FRAMES = 50
# A transform keeps up to this many frames standing behind the one being sent: a jitter
# allowance, so bursty arrival does not cost a drop (a gap in the audio) every window.
STANDING_BACKLOG_ALLOWANCE = 1
# Waits shorter than this are timer noise, not a phase error worth correcting.
PHASE_TOLERANCE_SECONDS = 0.001


class FramePacer:
    """Hands out one frame of samples per slot from a ring buffer fed by the engine worker.

    ``max_backlog`` bounds the audio waiting in the buffer at the moment a frame is taken:
    beyond it the oldest audio is dropped (counted), so latency cannot grow without bound.
    ``None`` keeps everything (speech synthesised ahead of time must all be played).
    """

    def __init__(
        self,
        source: RingBuffer,
        *,
        frame_samples: int = FRAME_SAMPLES,
        frame_seconds: float = FRAME_SECONDS,
        max_backlog: int | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._source = source
        self._frame_samples = frame_samples
        self._frame_seconds = frame_seconds
        self._max_backlog = max_backlog
        self._clock = clock or asyncio.get_running_loop().time
        self._ready = asyncio.Event()
        self._silence = np.zeros(frame_samples, dtype=np.float32)
        self._anchor: float | None = None
        self.index = -1  # slot of the frame handed out last
        self.frames = 0
        self.underruns = 0
        self.skipped_slots = 0
        self.backlog_dropped = 0  # samples
        # The last audio frame's times: found ready for its slot, and taken from the buffer
        # once the slot had started (between them: the wait for the slot).
        self.ready_at = 0.0
        self.taken_at = 0.0
        self._window_frames = 0
        self._window_min_wait = float("inf")
        self._window_min_left = 1 << 62
        self.phase_corrections = 0

    def notify(self) -> None:
        """Called after audio was written to the source, to wake a waiting ``next_frame``."""
        self._ready.set()

    def restart(self) -> None:
        """Forget the schedule: the next frame that becomes ready anchors a new one."""
        self._anchor = None

    @property
    def pts(self) -> int:
        """Timestamp of the last frame, in samples: slots, not frames, so gaps stay gaps."""
        return self.index * self._frame_samples

    def _has_frame(self) -> bool:
        return self._source.available >= self._frame_samples

    async def _wait_for_frame(self, deadline: float | None) -> bool:
        while not self._has_frame():
            self._ready.clear()
            if deadline is None:
                await self._ready.wait()
                continue
            remaining = deadline - self._clock()
            if remaining <= 0:
                return False
            try:
                async with asyncio.timeout(remaining):
                    await self._ready.wait()
            except TimeoutError:
                return self._has_frame()
        return True

    async def next_frame(self) -> tuple[np.ndarray, bool]:
        """Wait for the next slot; return its samples and whether they are filler silence."""
        # A frame already queued when asked for waits behind a backlog, not for its audio:
        # that wait says nothing about phase, and counting it would move the slots a slot
        # earlier every window (one frame a window faster than real time).
        queued = self._has_frame()
        if self._anchor is None:
            await self._wait_for_frame(deadline=None)
            first_index = self.index + 1
            self._anchor = self._clock() - first_index * self._frame_seconds
            self.index = first_index
        else:
            self.index += 1
            current = math.floor((self._clock() - self._anchor) / self._frame_seconds)
            if current > self.index:
                # Slots that passed while nobody asked: their time is gone, not their audio.
                # A transform's backlog bound still caps what that leaves queued.
                self.skipped_slots += current - self.index
                self.index = current
        slot_start = self._anchor + self.index * self._frame_seconds
        self.frames += 1
        if not await self._wait_for_frame(deadline=slot_start + self._frame_seconds):
            self.underruns += 1
            return self._silence, True
        self.ready_at = self._clock()
        early = slot_start - self.ready_at
        if early > 0:
            await asyncio.sleep(early)
        self._trim_backlog()
        frame = self._source.read(self._frame_samples)
        self.taken_at = self._clock()
        self._track_phase(0.0 if queued else early, left=self._source.available)
        return frame, False

    def _track_phase(self, wait: float, left: int) -> None:
        """Once a window, remove latency the stream did not need in that window.

        If every frame had to wait for its slot, the slots move earlier by the shortest
        wait. With a backlog bound (transforms), audio that stayed queued behind every frame
        of the window (a burst after a stall leaves such a standing backlog) is dropped,
        beyond a one-frame jitter allowance.
        """
        self._window_min_wait = min(self._window_min_wait, wait)
        self._window_min_left = min(self._window_min_left, left)
        self._window_frames += 1
        if self._window_frames < PHASE_WINDOW_FRAMES:
            return
        if self._window_min_wait > PHASE_TOLERANCE_SECONDS and self._anchor is not None:
            self._anchor -= self._window_min_wait
            self.phase_corrections += 1
        standing = self._window_min_left - STANDING_BACKLOG_ALLOWANCE * self._frame_samples
        if self._max_backlog is not None and standing > 0:
            self.backlog_dropped += self._source.discard(standing)
        self._window_frames = 0
        self._window_min_wait = float("inf")
        self._window_min_left = 1 << 62

    def _trim_backlog(self) -> None:
        if self._max_backlog is None:
            return
        excess = self._source.available - max(self._max_backlog, self._frame_samples)
        if excess > 0:
            self.backlog_dropped += self._source.discard(excess)
