"""The worker's one batched Silero VAD: every speak session's windows in one call per tick.

Barge-in runs the VAD on every speak session's caller audio. Each session's windows go to
one :class:`~media.audio.vad.BatchedVad` driven by a tick scheduler, so many sessions cost
one model call per tick instead of one each (``media.engines.batching``).
"""

from __future__ import annotations

import asyncio

import numpy as np

from media.audio.vad import BatchedVad, WindowCutter
from media.engines.batching import TickScheduler

MAX_WAIT_S = 0.01  # what a session's windows may wait for the others': a third of a window


class SharedVad:
    def __init__(self, model: BatchedVad | None = None) -> None:
        self._model = model if model is not None else BatchedVad()
        self._scheduler = TickScheduler(self._model, max_wait_s=MAX_WAIT_S, name="vad")

    def open(self) -> VadStream:
        with self._scheduler.model_lock:
            slot = self._model.open_slot()
        self._scheduler.join(slot)
        return VadStream(self, slot)

    def release(self, slot: int) -> None:
        self._scheduler.leave(slot)
        with self._scheduler.model_lock:
            self._model.close_slot(slot)

    async def score(self, slot: int, windows: np.ndarray) -> np.ndarray:
        """``slot``'s windows ([k, 512] at 16 kHz), scored in the next steps."""
        return await asyncio.wrap_future(self._scheduler.submit(slot, windows))

    def close(self) -> None:
        self._scheduler.close()


class VadStream:
    """One session's stream through the shared VAD."""

    def __init__(self, shared: SharedVad, slot: int) -> None:
        self._shared = shared
        self._slot = slot
        self._cutter = WindowCutter()
        self._closed = False

    async def probabilities(self, chunks: list[np.ndarray]) -> list[list[float]]:
        """Each 48 kHz chunk's window probabilities (windows it completed), in one step."""
        windows = [self._cutter.cut(chunk) for chunk in chunks]
        flat = [window for per_chunk in windows for window in per_chunk]
        if not flat:
            return [[] for _ in chunks]
        scores = (await self._shared.score(self._slot, np.stack(flat))).ravel().tolist()
        out, start = [], 0
        for per_chunk in windows:
            out.append(scores[start : start + len(per_chunk)])
            start += len(per_chunk)
        return out

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._shared.release(self._slot)
