"""Where engine calls run: the process's engine threads, shared fairly by every session.

Two rules, each with its own class:

- A state is touched by one thread at a time. A transform's chunks, a synthesis step, a
  voice prompt upload and a state reset after an error all reach the engine through the
  session's :class:`SerialExecutor`, so none can overlap another.
- The threads go to whatever matters most first. :class:`PriorityPool` runs, whenever a
  thread is free, the most urgent call waiting across all sessions: a synthesis that has not
  produced its first audio yet comes before later chunks of other utterances, so a caller's
  first audio waits for other callers' first chunks, not for their whole sentences. Among
  calls of equal urgency, the earliest deadline goes first (``submit_by``: when a listener
  would run out of audio); a call without one has its submission time as its deadline, so
  the oldest goes first. A session's calls go out one at a time (a
  thread is given back between two of them), so no session keeps a thread to itself.

A call that only waits for work done elsewhere (a chunk from an engine's own batch worker or
from a remote server) goes to the pool's *waiting* threads instead (``submit_waiting``): held
on an engine thread, it would keep other sessions from even handing that worker their
utterances (two engine threads, eight callers of a Triton runtime that takes 200 ms to first
audio: all heard it at ~825 ms, against ~223 ms with the waits off the engine threads).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

URGENT = 0  # a first chunk: someone is waiting to hear anything at all
NORMAL = 1  # everything else
# Calls waiting on work done elsewhere at once, at most (one per speaking session); more
# queue in order.
WAITING_THREADS = 256


class PriorityPool(Executor):
    """A fixed set of threads running the most urgent waiting call first."""

    def __init__(self, max_workers: int, thread_name_prefix: str = "engine") -> None:
        self._threads = ThreadPoolExecutor(max_workers, thread_name_prefix=thread_name_prefix)
        self._waiting_threads = ThreadPoolExecutor(
            WAITING_THREADS, thread_name_prefix=f"{thread_name_prefix}-wait"
        )
        self._lock = threading.Lock()
        self._waiting: list[tuple[int, float, int, Callable[[], None]]] = []
        self._order = itertools.count()

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        return self.submit_at(NORMAL, fn, *args, **kwargs)

    def submit_at(
        self, priority: int, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> Future[T]:
        """Run ``fn`` when a thread is free and nothing more urgent (lower) is waiting."""
        return self._push(priority, time.monotonic(), lambda: fn(*args, **kwargs))

    def submit_by(self, deadline: float, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` at NORMAL urgency, before calls whose deadline (``time.monotonic()``)
        is later."""
        return self._push(NORMAL, deadline, fn)

    def _push(self, priority: int, deadline: float, fn: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()

        def call() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn()
            except BaseException as exc:  # handed to whoever waits on the future
                future.set_exception(exc)
            else:
                future.set_result(result)

        with self._lock:
            heapq.heappush(self._waiting, (priority, deadline, next(self._order), call))
        # One thread task per waiting call: which call a task runs is decided when it runs.
        self._threads.submit(self._run_most_urgent)
        return future

    def submit_waiting(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Run ``fn``, a call that mostly waits for work done elsewhere, off the engine threads."""
        return self._waiting_threads.submit(fn, *args, **kwargs)

    def _run_most_urgent(self) -> None:
        with self._lock:
            *_, call = heapq.heappop(self._waiting)
        call()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._threads.shutdown(wait=wait, cancel_futures=cancel_futures)
        self._waiting_threads.shutdown(wait=wait, cancel_futures=cancel_futures)


class SerialExecutor(Executor):
    """One session's engine calls: in submission order, never two at once.

    Each call goes to the shared pool only when the previous one has finished, at its own
    priority, so other sessions' calls interleave with this session's.
    """

    def __init__(self, pool: Executor) -> None:
        self._pool = pool
        self._lock = threading.Lock()
        # (priority, or None for a call that waits on work done elsewhere; its deadline, or
        # None for its submission time; future; call)
        self._queue: deque[tuple[int | None, float | None, Future[Any], Callable[[], Any]]]
        self._queue = deque()
        self._running = False

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        return self.submit_at(NORMAL, fn, *args, **kwargs)

    def submit_at(
        self, priority: int, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> Future[T]:
        return self._enqueue(priority, lambda: fn(*args, **kwargs))

    def submit_by(self, deadline: float, fn: Callable[[], T]) -> Future[T]:
        """In order with the session's other calls; in the pool, by ``deadline``."""
        return self._enqueue(NORMAL, fn, deadline)

    def submit_waiting(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """In order with the session's other calls, on the pool's waiting threads."""
        return self._enqueue(None, lambda: fn(*args, **kwargs))

    def _enqueue(
        self, priority: int | None, call: Callable[[], T], deadline: float | None = None
    ) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            self._queue.append((priority, deadline, future, call))
            start, self._running = not self._running, True
        if start:
            self._dispatch_next()
        return future

    def _dispatch_next(self) -> None:
        with self._lock:
            if not self._queue:
                self._running = False
                return
            priority, deadline, future, call = self._queue.popleft()
        if not isinstance(self._pool, PriorityPool):
            self._pool.submit(self._run, future, call)
        elif priority is None:
            self._pool.submit_waiting(self._run, future, call)
        elif deadline is not None:
            self._pool.submit_by(deadline, lambda: self._run(future, call))
        else:
            self._pool.submit_at(priority, self._run, future, call)

    def _run(self, future: Future[Any], call: Callable[[], Any]) -> None:
        """Runs on a pool thread: one call, then the next one is sent to the pool."""
        try:
            if future.set_running_or_notify_cancel():
                try:
                    result = call()
                except BaseException as exc:  # handed to whoever waits on the future
                    future.set_exception(exc)
                else:
                    future.set_result(result)
        finally:
            self._dispatch_next()
