"""A bounded queue that drops the oldest item when full.

Between the event loop and an engine worker, a queue that grows converts overload into
latency that never comes back. This one keeps at most ``maxsize`` items: a new item pushes
out the oldest, and every drop is counted so it shows in the session's stats.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class DropOldestQueue(Generic[T]):
    """Single-consumer FIFO for the event loop thread; ``put`` never blocks."""

    def __init__(self, maxsize: int) -> None:
        if maxsize <= 0:
            raise ValueError("maxsize must be positive")
        self._items: deque[T] = deque(maxlen=maxsize)
        self._not_empty = asyncio.Event()
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def maxsize(self) -> int:
        return self._items.maxlen or 0

    def put(self, item: T) -> bool:
        """Append ``item``; return False when the oldest item was dropped to make room."""
        return self.push(item) is None

    def push(self, item: T) -> T | None:
        """Append ``item``; return the oldest item if it was dropped to make room."""
        evicted = None
        if len(self._items) == self._items.maxlen:
            evicted = self._items.popleft()
            self.dropped += 1
        self._items.append(item)
        self._not_empty.set()
        return evicted

    async def get(self) -> T:
        while not self._items:
            self._not_empty.clear()
            await self._not_empty.wait()
        return self._items.popleft()

    def pop(self) -> T:
        """The oldest item, taken at once (``IndexError`` when there is none)."""
        return self._items.popleft()

    def clear(self) -> int:
        """Discard everything queued; return how many items went."""
        n = len(self._items)
        self._items.clear()
        return n
