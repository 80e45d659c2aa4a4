"""One session's engine calls, one at a time and in order, on the process's shared threads.

An engine state is touched by one thread at a time: a transform's chunks, a speech
synthesis, a voice prompt upload and a state reset after an error all reach the engine
through the session's :class:`SerialExecutor`, so none can overlap another. The threads
themselves are the process's pool (``--engine-threads``): sessions do not get threads of
their own, they get a queue.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class SerialExecutor(Executor):
    """Runs what is submitted to it in submission order, never two things at once."""

    def __init__(self, pool: Executor) -> None:
        self._pool = pool
        self._lock = threading.Lock()
        self._queue: deque[tuple[Future[Any], Callable[[], Any]]] = deque()
        self._running = False

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            self._queue.append((future, lambda: fn(*args, **kwargs)))
            start, self._running = not self._running, True
        if start:
            self._pool.submit(self._drain)
        return future

    def _drain(self) -> None:
        """Runs on a pool thread: the queued calls, until none is left."""
        while True:
            with self._lock:
                if not self._queue:
                    self._running = False
                    return
                future, call = self._queue.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = call()
            except BaseException as exc:  # handed to whoever waits on the future
                future.set_exception(exc)
            else:
                future.set_result(result)
