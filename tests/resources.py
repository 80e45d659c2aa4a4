"""What a finished session must give back: asyncio tasks, threads and audio buffers.

Counts, not logs: a test takes them before a call and checks they come back after it.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from dataclasses import dataclass

from media.audio.ringbuffer import live_buffers

SETTLE_TRIES = 50
SETTLE_PAUSE_S = 0.1


def non_pool_threads() -> int:
    """Threads other than thread-pool workers, which stay alive by design between jobs."""
    return sum(
        1
        for thread in threading.enumerate()
        if not thread.name.startswith(("engine", "asyncio", "ThreadPoolExecutor"))
    )


@dataclass(frozen=True)
class Resources:
    tasks: int
    threads: int
    buffers: int

    @classmethod
    async def count(cls) -> Resources:
        await asyncio.sleep(0)
        gc.collect()
        return cls(len(asyncio.all_tasks()), non_pool_threads(), live_buffers())

    def within(self, before: Resources) -> bool:
        return (
            self.tasks <= before.tasks
            and self.threads <= before.threads
            and self.buffers <= before.buffers
        )


async def settled(before: Resources) -> Resources:
    """The counts once they are back within ``before``, or as they are after ~5 s.

    aiortc's threads and tasks wind down asynchronously after a connection closes.
    """
    for _ in range(SETTLE_TRIES):
        now = await Resources.count()
        if now.within(before):
            return now
        await asyncio.sleep(SETTLE_PAUSE_S)
    return await Resources.count()
