"""One model call per tick for every session: the scheduler of batched engines.

An engine that can batch (``Capabilities.batched``) keeps every session's streaming state
in a slot of batch arrays, and runs one model step for many slots at once. Sessions hand
their audio to the engine's :class:`TickScheduler`, which, on its own thread:

- gathers the hops that are ready across all sessions;
- runs them as one batch as soon as every live slot has a hop waiting, or when the oldest
  waiting hop has waited ``max_wait_s`` (the batch closes at that deadline: a session whose
  audio is late is simply not in this batch and never delays the others);
- runs a session's second and later hops in further steps of the same round (a step takes
  at most one hop per slot: each step advances the streams' state by one hop);
- hands each session its output through a future, resolved on that thread.

Everything is bounded: a session may have at most ``max_hops_waiting`` hops queued (its
pipeline submits one chunk at a time); more is refused with :class:`SchedulerFull`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

log = logging.getLogger(__name__)

DEFAULT_MAX_WAIT_S = 0.008  # under one 10 ms hop: what a session may wait for company
DEFAULT_MAX_HOPS_WAITING = 16


class SchedulerFull(RuntimeError):
    """A session submitted more audio than its share of the queue."""


class SchedulerClosed(RuntimeError):
    """The engine is shutting down."""


class SlotLeft(RuntimeError):
    """The session left while its hops were in a round (its output is nobody's now)."""


class BatchModel(Protocol):
    """What the scheduler drives: a model with per-stream state in slots."""

    hop: int  # samples per step and stream

    def process(self, slots: Sequence[int], hops: np.ndarray) -> np.ndarray:
        """One step: ``hops[i]`` ([len(slots), hop] float32) is stream ``slots[i]``'s next
        hop; returns that many output hops, in the same order."""
        ...


@dataclass(eq=False)
class _Job:
    slot: int
    hops: np.ndarray  # [k, hop]
    future: Future[np.ndarray]
    submitted: float
    done: list[np.ndarray] = field(default_factory=list)

    @property
    def next_index(self) -> int:
        return len(self.done)


@dataclass
class SchedulerStats:
    steps: int = 0
    hops: int = 0
    rounds: int = 0
    largest_batch: int = 0

    @property
    def mean_batch(self) -> float:
        return self.hops / self.steps if self.steps else 0.0


class TickScheduler:
    """Runs ``model`` for all sessions' waiting hops, one batched step at a time."""

    def __init__(
        self,
        model: BatchModel,
        max_wait_s: float = DEFAULT_MAX_WAIT_S,
        max_hops_waiting: int = DEFAULT_MAX_HOPS_WAITING,
        clock: Callable[[], float] = time.monotonic,
        name: str = "batch",
    ) -> None:
        self._model = model
        self._max_wait = max_wait_s
        self._max_hops = max_hops_waiting
        self._clock = clock
        self._lock = threading.Condition()
        self._waiting: deque[_Job] = deque()
        self._live: set[int] = set()
        self._closed = False
        # Held while the model runs a step; slot changes (open, reset, close) take it too,
        # so the model never sees one beside a step. Taken before ``_lock`` where both are.
        self.model_lock = threading.Lock()
        self.stats = SchedulerStats()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # --- sessions ------------------------------------------------------------------------

    def join(self, slot: int) -> None:
        """``slot`` is live: rounds wait (up to the deadline) for its hops too."""
        with self._lock:
            self._live.add(slot)

    def leave(self, slot: int) -> None:
        """``slot`` is gone: rounds no longer wait for it; its queued hops are dropped."""
        with self._lock:
            self._live.discard(slot)
            for job in [j for j in self._waiting if j.slot == slot]:
                self._waiting.remove(job)
                job.future.cancel()
            self._lock.notify()

    def submit(self, slot: int, hops: np.ndarray) -> Future[np.ndarray]:
        """Queue ``hops`` ([k, hop]) of ``slot``; the future gets their output, joined."""
        future: Future[np.ndarray] = Future()
        if len(hops) == 0:
            future.set_result(np.zeros(0, np.float32))
            return future
        with self._lock:
            if self._closed:
                raise SchedulerClosed("the batched engine is closed")
            queued = sum(len(j.hops) - j.next_index for j in self._waiting if j.slot == slot)
            if queued + len(hops) > self._max_hops:
                raise SchedulerFull(f"slot {slot} has {queued} hops waiting already")
            self._waiting.append(_Job(slot, hops, future, self._clock()))
            self._lock.notify()
        return future

    def _step(self, step: list[_Job]) -> tuple[np.ndarray | list[np.ndarray], Exception | None]:
        """Under ``model_lock``: one model call for the next hop of each job of ``step``."""
        if not step:
            return [], None
        try:
            hops = np.stack([job.hops[job.next_index] for job in step])
            return self._model.process([job.slot for job in step], hops), None
        except Exception as exc:
            log.exception("batched step of %d streams failed", len(step))
            return [], exc

    def _left(self, step: list[_Job]) -> list[_Job]:
        """Under ``model_lock``: the jobs of ``step`` whose slot left since the round began
        (a session closed between two of its chunk's hops: its slot may be closed already,
        and the model would refuse the whole step for it)."""
        with self._lock:
            return [job for job in step if job.slot not in self._live]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._thread.join(timeout=5)
        with self._lock:
            for job in self._waiting:
                job.future.cancel()
            self._waiting.clear()

    # --- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._lock:
                jobs = self._next_round()
                if jobs is None:
                    return
            self._round(jobs)

    def _next_round(self) -> list[_Job] | None:
        """Under the lock: wait until a round is due; take its jobs (None: closed)."""
        while True:
            if self._closed:
                return None
            if self._waiting:
                waiting = {job.slot for job in self._waiting}
                oldest = self._waiting[0].submitted
                remaining = oldest + self._max_wait - self._clock()
                if waiting >= self._live or remaining <= 0:
                    # Running futures can no longer be cancelled: a session that gives up
                    # waiting does not pull its hops out of a step already being built.
                    jobs = [j for j in self._waiting if j.future.set_running_or_notify_cancel()]
                    self._waiting.clear()
                    return jobs
                self._lock.wait(timeout=remaining)
            else:
                self._lock.wait()

    def _round(self, jobs: list[_Job]) -> None:
        """Every hop of ``jobs``: step k takes the k-th hop of each job that has one.

        A slot with two jobs in one round (two chunks) has them run in order, in later
        steps, never side by side in one step.
        """
        self.stats.rounds += 1
        pending = jobs
        while pending:
            step: list[_Job] = []
            seen: set[int] = set()
            for job in pending:
                if job.slot not in seen:
                    step.append(job)
                    seen.add(job.slot)
            if not step:
                break
            with self.model_lock:
                left = self._left(step)
                step = [job for job in step if job not in left]
                out, failure = self._step(step)
            for job in left:
                job.future.set_exception(SlotLeft(f"slot {job.slot} left during its round"))
            if failure is not None:  # every session in the step learns of it
                for job in step:
                    job.future.set_exception(failure)
                step = []
            pending = [job for job in pending if not job.future.done()]
            if not step:
                continue
            self.stats.steps += 1
            self.stats.hops += len(step)
            self.stats.largest_batch = max(self.stats.largest_batch, len(step))
            for job, hop in zip(step, out, strict=True):
                job.done.append(hop)
                if job.next_index == len(job.hops):
                    job.future.set_result(np.concatenate(job.done))
            pending = [j for j in pending if not j.future.done()]
