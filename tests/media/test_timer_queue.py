"""The shared timer heap of the receive paths: asyncio's call_at semantics on one loop timer."""

from __future__ import annotations

import asyncio
import logging

import pytest

from media.rtc.timer_queue import TimerQueue


async def test_timers_run_in_order_of_time_then_of_arming_and_never_early() -> None:
    loop = asyncio.get_running_loop()
    queue = TimerQueue(loop)
    start = loop.time()
    ran: list[tuple[str, float]] = []

    def note(name: str, when: float) -> None:
        queue.call_at(when, lambda: ran.append((name, loop.time() - when)))

    note("c", start + 0.03)
    note("a", start + 0.01)
    note("b1", start + 0.02)
    note("b2", start + 0.02)
    await asyncio.sleep(0.06)
    assert [name for name, _ in ran] == ["a", "b1", "b2", "c"]
    assert all(lateness >= -1e-6 for _, lateness in ran)


async def test_a_cancelled_timer_never_runs_and_many_at_once_share_one_firing() -> None:
    loop = asyncio.get_running_loop()
    queue = TimerQueue(loop)
    when = loop.time() + 0.02
    ran: list[int] = []
    timers = [queue.call_at(when, lambda k=k: ran.append(k)) for k in range(100)]
    for timer in timers[::2]:
        timer.cancel()
    assert timers[0].cancelled() and not timers[1].cancelled()
    await asyncio.sleep(0.05)
    assert ran == list(range(1, 100, 2))
    assert queue.firings == 1
    assert len(queue) == 0


async def test_a_timer_armed_by_a_callback_waits_for_the_next_firing() -> None:
    """As with ``loop.call_at``: a callback that arms one already due does not run it
    within its own turn (a receive path that re-arms for a passed slot cannot spin)."""
    loop = asyncio.get_running_loop()
    queue = TimerQueue(loop)
    ran: list[str] = []

    def first() -> None:
        ran.append("first")
        queue.call_at(loop.time() - 1, lambda: ran.append("second"))
        assert ran == ["first"]

    queue.call_at(loop.time(), first)
    await asyncio.sleep(0.01)
    assert ran == ["first", "second"]
    assert queue.firings == 2


async def test_an_earlier_timer_rearms_and_a_failing_callback_spares_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.get_running_loop()
    queue = TimerQueue(loop)
    ran: list[str] = []
    queue.call_at(loop.time() + 0.5, lambda: ran.append("late"))

    def fail() -> None:
        raise RuntimeError("boom")

    queue.call_at(loop.time() + 0.01, fail)
    queue.call_at(loop.time() + 0.01, lambda: ran.append("early"))
    with caplog.at_level(logging.ERROR):
        await asyncio.sleep(0.05)
    assert ran == ["early"]  # the half-second one is still pending: the queue re-armed
    assert "a timer's callback failed" in caplog.text
    assert len(queue) == 1


async def test_each_loop_has_its_own_queue() -> None:
    assert TimerQueue.of_running_loop() is TimerQueue.of_running_loop()
    other = await asyncio.to_thread(lambda: asyncio.run(_queue_of_a_new_loop()))
    assert other is not TimerQueue.of_running_loop()


async def _queue_of_a_new_loop() -> TimerQueue:
    return TimerQueue.of_running_loop()
