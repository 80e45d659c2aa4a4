"""An asyncio loop on a daemon thread of its own, for links that engine threads talk through.

A remote engine (a Triton server, the model host) keeps its connection on one loop so that
engine threads never touch sockets: they hand the loop coroutines and callbacks and wait on
the futures they get back. The loop never shares a thread with a session's media.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

JOIN_S = 5.0  # how long stopping waits for the loop's last work and its thread


class LoopThread:
    """The loop, its thread, and the three ways to reach it from any thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> Future[T]:
        """Run ``coroutine`` on the loop; the future is for the calling thread."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def call_soon(self, callback: Callable[..., object], *args: Any) -> None:
        """Run ``callback(*args)`` on the loop (a no-op once the loop is closed)."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing left to tell
            self.loop.call_soon_threadsafe(callback, *args)

    def stop(self, last: Coroutine[Any, Any, object]) -> None:
        """Run ``last`` (the link's shutdown) for up to :data:`JOIN_S`, then stop the loop.

        A loop that cannot finish in time is left to its daemon thread, unclosed.
        """
        try:
            self.submit(last).result(JOIN_S)
        finally:
            self.call_soon(self.loop.stop)
            self._thread.join(JOIN_S)
            if not self._thread.is_alive():
                self.loop.close()
