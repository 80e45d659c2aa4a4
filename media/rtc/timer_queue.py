"""Many sessions' timers on one ``asyncio`` timer: what every receive path's slots wait on.

Each receive path arms a timer for every 20 ms slot (the deadline of the next packet) and,
on a clean link, cancels it when that packet comes: one ``TimerHandle`` made, pushed,
cancelled and popped per session per frame. asyncio keeps them in one heap whose
comparisons are a Python ``__lt__``, and cancelled handles stay in it until they reach the
top, so with tens of sessions each frame cost some fifteen Python comparisons besides the
handle itself. Here a timer is a small entry in a heap of ``(when, order, entry)`` tuples,
compared in C, cancelled by clearing its callback; one loop timer is armed for the earliest
entry. A cancelled entry at the top is dropped when the loop timer is next armed; one
cancelled after its loop timer was armed costs that timer's firing.

Callbacks run as the loop would run them: in order of their time (then of their arming),
each from the loop, an exception logged and the others run on.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import weakref
from collections.abc import Callable
from typing import ClassVar

log = logging.getLogger(__name__)


class QueuedTimer:
    """One armed timer; :meth:`cancel` stops it (like ``asyncio.TimerHandle.cancel``)."""

    __slots__ = ("callback",)

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback: Callable[[], None] | None = callback

    def cancel(self) -> None:
        self.callback = None

    def cancelled(self) -> bool:
        return self.callback is None


class TimerQueue:
    """The timers of every receive path on one event loop."""

    _instances: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, TimerQueue]] = (
        weakref.WeakKeyDictionary()
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._heap: list[tuple[float, int, QueuedTimer]] = []
        self._order = itertools.count()
        self._handle: asyncio.TimerHandle | None = None
        self._armed_at = math.inf
        self._firing = False  # running the due callbacks: the queue is armed after them
        self.firings = 0  # loop timer firings: the wake-ups all the queue's timers share

    @classmethod
    def of_running_loop(cls) -> TimerQueue:
        loop = asyncio.get_running_loop()
        queue = cls._instances.get(loop)
        if queue is None:
            queue = cls._instances[loop] = cls(loop)
        return queue

    def __len__(self) -> int:
        """Entries in the heap, cancelled ones included until they are dropped."""
        return len(self._heap)

    def call_at(self, when: float, callback: Callable[[], None]) -> QueuedTimer:
        """Run ``callback`` once the loop's clock reaches ``when`` (as ``loop.call_at``)."""
        timer = QueuedTimer(callback)
        heapq.heappush(self._heap, (when, next(self._order), timer))
        if when < self._armed_at and not self._firing:
            self._arm(when)
        return timer

    def _arm(self, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._armed_at = when
        self._handle = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._handle, self._armed_at = None, math.inf
        self.firings += 1
        heap = self._heap
        # As the loop's own timers: due once within the clock's resolution of their time;
        # what a callback arms meanwhile waits for the next turn, however soon it is due.
        due_by = self._loop.time() + self._loop._clock_resolution  # type: ignore[attr-defined]
        due = []
        while heap and heap[0][0] <= due_by:
            due.append(heapq.heappop(heap)[2])
        self._firing = True
        try:
            for timer in due:
                callback = timer.callback
                if callback is None:
                    continue
                timer.callback = None
                try:
                    callback()
                except Exception:
                    log.exception("a timer's callback failed")
        finally:
            self._firing = False
        while heap and heap[0][2].callback is None:
            heapq.heappop(heap)
        if heap:
            self._arm(heap[0][0])
