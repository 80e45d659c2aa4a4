"""The queue in front of the engine: bounded, oldest out first, every drop counted."""

from __future__ import annotations

import asyncio
from typing import TypeVar

import pytest

from media.audio.queues import DropOldestQueue

T = TypeVar("T")


async def drain(queue: DropOldestQueue[T]) -> list[T]:
    return [await queue.get() for _ in range(len(queue))]


def test_a_queue_without_room_is_refused() -> None:
    with pytest.raises(ValueError):
        DropOldestQueue(0)


async def test_items_come_out_in_the_order_they_were_put() -> None:
    queue: DropOldestQueue[int] = DropOldestQueue(5)
    for item in range(4):
        assert queue.put(item) is True
    assert len(queue) == 4
    assert await drain(queue) == [0, 1, 2, 3]
    assert queue.dropped == 0


async def test_put_on_a_full_queue_drops_the_oldest_and_counts() -> None:
    queue: DropOldestQueue[int] = DropOldestQueue(3)
    assert [queue.put(item) for item in range(3)] == [True, True, True]
    assert queue.put(3) is False
    assert queue.put(4) is False
    assert queue.dropped == 2
    assert len(queue) == queue.maxsize == 3
    assert await drain(queue) == [2, 3, 4]


async def test_push_hands_back_the_item_it_pushed_out() -> None:
    """The caller may need the evicted item (to account for it, or to release it)."""
    queue: DropOldestQueue[str] = DropOldestQueue(2)
    assert queue.push("a") is None
    assert queue.push("b") is None
    assert queue.push("c") == "a"
    assert queue.push("d") == "b"
    assert queue.dropped == 2
    assert await drain(queue) == ["c", "d"]


async def test_put_never_blocks_even_far_beyond_maxsize() -> None:
    """An overloaded engine must cost old input, never growing latency."""
    queue: DropOldestQueue[int] = DropOldestQueue(4)
    for item in range(1000):
        queue.put(item)
    assert len(queue) == 4
    assert queue.dropped == 996
    assert await drain(queue) == [996, 997, 998, 999]


async def test_get_returns_at_once_when_an_item_is_waiting() -> None:
    queue: DropOldestQueue[str] = DropOldestQueue(2)
    queue.put("ready")
    assert await asyncio.wait_for(queue.get(), timeout=1) == "ready"


async def test_get_waits_for_a_put() -> None:
    queue: DropOldestQueue[str] = DropOldestQueue(2)
    getter = asyncio.create_task(queue.get())
    await asyncio.sleep(0.01)
    assert not getter.done()
    queue.put("late")
    assert await asyncio.wait_for(getter, timeout=1) == "late"
    assert len(queue) == 0


async def test_get_keeps_waiting_after_a_clear_empties_the_queue() -> None:
    """A wake-up for an item that was cleared away must not return a missing item."""
    queue: DropOldestQueue[int] = DropOldestQueue(2)
    getter = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    queue.put(1)
    queue.clear()
    await asyncio.sleep(0.01)
    assert not getter.done()
    queue.put(2)
    assert await asyncio.wait_for(getter, timeout=1) == 2


async def test_a_waiting_get_is_cancelled_cleanly() -> None:
    queue: DropOldestQueue[int] = DropOldestQueue(2)
    getter = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    getter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await getter
    queue.put(7)
    assert await queue.get() == 7


async def test_a_consumer_sees_every_item_of_a_producer_that_stays_within_maxsize() -> None:
    queue: DropOldestQueue[int] = DropOldestQueue(3)
    received: list[int] = []

    async def consume() -> None:
        while len(received) < 20:
            received.append(await queue.get())

    consumer = asyncio.create_task(consume())
    for item in range(20):
        queue.put(item)
        if item % 3 == 2:
            await asyncio.sleep(0)
    await asyncio.wait_for(consumer, timeout=1)
    assert received == list(range(20))
    assert queue.dropped == 0


def test_clear_discards_everything_and_reports_how_many() -> None:
    queue: DropOldestQueue[int] = DropOldestQueue(4)
    for item in range(3):
        queue.put(item)
    assert queue.clear() == 3
    assert len(queue) == 0
    assert queue.clear() == 0
    assert queue.dropped == 0  # a clear is not an overflow
