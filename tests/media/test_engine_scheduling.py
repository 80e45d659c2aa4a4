"""Who gets the engine threads next: the most urgent call across sessions, one per session.

A speak session's listener hears nothing until its utterance can start playing: its first
chunk, and any further chunks its pre-buffer waits for. Those calls go before every other
session's later chunks, so with many callers each caller's first audio waits for the
others' first audio, not for their whole sentences.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from media.engines.base import Capabilities
from media.engines.testing import FakeSpeak, FaultState
from media.pipeline.executor import NORMAL, URGENT, PriorityPool, SerialExecutor
from media.pipeline.speak.stats import SpeakStats
from media.pipeline.speak.synthesis import SynthesisBridge
from media.pipeline.speak.utterances import Utterance

LIMIT = 5.0


def blocked_pool() -> tuple[PriorityPool, threading.Event]:
    """A one-thread pool whose thread is held until the returned event is set."""
    pool = PriorityPool(1)
    release = threading.Event()
    pool.submit(release.wait)
    time.sleep(0.05)  # the blocker has the thread: everything after it queues
    return pool, release


def test_the_most_urgent_waiting_call_runs_first_then_the_oldest() -> None:
    pool, release = blocked_pool()
    order: list[str] = []
    futures = [
        pool.submit_at(NORMAL, order.append, "later chunk, first asked"),
        pool.submit_at(NORMAL, order.append, "later chunk, second asked"),
        pool.submit_at(URGENT, order.append, "first chunk, asked last"),
    ]
    release.set()
    for future in futures:
        future.result(LIMIT)
    pool.shutdown()
    assert order == [
        "first chunk, asked last",
        "later chunk, first asked",
        "later chunk, second asked",
    ]


def test_a_session_gives_the_thread_back_between_its_calls() -> None:
    """Two sessions, each with three calls queued: they alternate on the one thread, and
    neither session ever has two calls running at once."""
    pool, release = blocked_pool()
    order: list[str] = []
    running: dict[str, int] = {"a": 0, "b": 0}
    overlaps: list[str] = []

    def call(session: str) -> None:
        running[session] += 1
        if running[session] > 1:
            overlaps.append(session)
        order.append(session)
        time.sleep(0.005)
        running[session] -= 1

    sessions = {name: SerialExecutor(pool) for name in ("a", "b")}
    futures: list[Future[None]] = []
    for _ in range(3):
        for name, calls in sessions.items():
            futures.append(calls.submit(call, name))
    release.set()
    for future in futures:
        future.result(LIMIT)
    pool.shutdown()
    assert order == ["a", "b", "a", "b", "a", "b"]
    assert not overlaps


class RecordingCalls(SerialExecutor):
    """A session's engine queue that notes the priority of every call."""

    def __init__(self, pool: PriorityPool) -> None:
        super().__init__(pool)
        self.priorities: list[int] = []

    def submit_at(
        self, priority: int, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> Future[Any]:
        self.priorities.append(priority)
        return super().submit_at(priority, fn, *args, **kwargs)


async def test_chunks_the_listener_waits_for_are_urgent_and_later_ones_are_not() -> None:
    """The bridge asks the pipeline, before each chunk, whether the utterance can play yet
    (a pre-buffer holding it back says no): until then its chunks are URGENT."""
    engine = FakeSpeak()
    pool = PriorityPool(1)
    calls = RecordingCalls(pool)
    made: list[np.ndarray] = []
    held_for = 3  # chunks: the first, and two the pre-buffer waits for

    def accept(utterance: Utterance, chunk: np.ndarray, spent: float) -> None:
        made.append(chunk)
        utterance.start = 0

    bridge = SynthesisBridge(
        engine, calls, SpeakStats(), accept, waiting=lambda utterance: len(made) < held_for
    )
    utterance = Utterance("u1")
    utterance.add("Ten words of text are enough for a dozen chunks here.")
    utterance.close()
    state = FaultState(
        {"fail_after": -1, "failures": 0, "delay_ms": 0.0, "hang_after": -1, "hang_seconds": 0}
    )
    await asyncio.wait_for(bridge.speak(utterance, state), LIMIT)
    pool.shutdown()
    chunk_calls = calls.priorities[: len(made)]
    assert len(made) > held_for + 2
    assert chunk_calls[:held_for] == [URGENT] * held_for
    assert set(chunk_calls[held_for:]) == {NORMAL}


def test_calls_that_wait_on_work_done_elsewhere_leave_the_engine_threads_free() -> None:
    """Three sessions' calls wait for another worker at once while the one engine thread
    still runs a fourth session's call; a session's own calls stay in order, one at a time."""
    pool = PriorityPool(1)
    release = threading.Event()
    started: list[str] = []

    def wait_elsewhere(name: str) -> str:
        started.append(name)
        release.wait(LIMIT)
        return name

    waiting = [SerialExecutor(pool).submit_waiting(wait_elsewhere, str(i)) for i in range(3)]
    assert pool.submit(lambda: "computed").result(LIMIT) == "computed"
    deadline = time.monotonic() + LIMIT
    while len(started) < 3 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert sorted(started) == ["0", "1", "2"]  # all three at once, none queued behind another
    session = SerialExecutor(pool)
    order: list[str] = []
    after = session.submit(order.append, "after the wait")
    release.set()
    assert [future.result(LIMIT) for future in waiting] == ["0", "1", "2"]
    mine = SerialExecutor(pool)
    steps = [mine.submit_waiting(order.append, "a"), mine.submit(order.append, "b")]
    steps.append(mine.submit_waiting(order.append, "c"))
    for future in (after, *steps):
        future.result(LIMIT)
    pool.shutdown()
    assert order[0] == "after the wait" and order[1:] == ["a", "b", "c"]


async def test_a_speaker_whose_engine_computes_elsewhere_needs_no_engine_thread() -> None:
    """An engine that computes on its own worker (``own_compute``): the bridge waits for its
    chunks on the waiting threads, so it speaks while every engine thread is taken."""
    engine = FakeSpeak()
    engine.capabilities = Capabilities(own_compute=True)
    pool, release = blocked_pool()
    made: list[np.ndarray] = []
    bridge = SynthesisBridge(
        engine,
        SerialExecutor(pool),
        SpeakStats(),
        lambda utterance, chunk, spent: made.append(chunk),
        waiting=lambda utterance: False,
    )
    utterance = Utterance("u1")
    utterance.add("A short sentence.")
    utterance.close()
    state = FaultState(
        {"fail_after": -1, "failures": 0, "delay_ms": 0.0, "hang_after": -1, "hang_seconds": 0}
    )
    try:
        await asyncio.wait_for(bridge.speak(utterance, state), LIMIT)
    finally:
        release.set()
        pool.shutdown()
    assert len(made) > 3
