"""The ring buffer between the engine worker and the outgoing track: FIFO, bounded, counted."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

from media.audio.ringbuffer import RingBuffer, live_buffers


def ramp(start: int, n: int) -> np.ndarray:
    """Samples whose values are their own positions in the stream, so order is visible."""
    return np.arange(start, start + n, dtype=np.float32)


def test_a_buffer_without_room_is_refused() -> None:
    with pytest.raises(ValueError):
        RingBuffer(0)
    with pytest.raises(ValueError):
        RingBuffer(-5)


def test_a_new_buffer_is_empty_and_reads_nothing() -> None:
    buf = RingBuffer(8)
    assert buf.capacity == 8
    assert buf.available == 0
    assert buf.dropped == 0
    out = buf.read(4)
    assert out.dtype == np.float32
    assert len(out) == 0


def test_samples_come_out_in_the_order_they_went_in() -> None:
    buf = RingBuffer(16)
    assert buf.write(ramp(0, 5)) == 0
    assert buf.write(ramp(5, 6)) == 0
    assert buf.available == 11
    np.testing.assert_array_equal(buf.read(11), ramp(0, 11))
    assert buf.available == 0


def test_fifo_order_survives_many_wrap_arounds() -> None:
    """Writes and reads of odd sizes move the start around the end of the storage."""
    buf = RingBuffer(10)
    written = 0
    collected = []
    for size in [3, 7, 4, 8, 1, 6, 8, 2, 5, 8, 3, 7, 8, 8]:
        buf.write(ramp(written, size))
        written += size
        collected.append(buf.read(max(0, buf.available - 2)))  # keep two behind
    collected.append(buf.read(buf.available))
    assert buf.dropped == 0
    np.testing.assert_array_equal(np.concatenate(collected), ramp(0, written))
    assert written > 5 * buf.capacity


def test_read_of_fewer_than_available_leaves_the_rest_in_order() -> None:
    buf = RingBuffer(8)
    buf.write(ramp(0, 6))
    np.testing.assert_array_equal(buf.read(2), ramp(0, 2))
    assert buf.available == 4
    np.testing.assert_array_equal(buf.read(4), ramp(2, 4))


def test_read_of_more_than_available_returns_only_what_is_there() -> None:
    buf = RingBuffer(8)
    buf.write(ramp(0, 3))
    out = buf.read(100)
    np.testing.assert_array_equal(out, ramp(0, 3))
    assert buf.available == 0


def test_read_into_a_caller_array_fills_it_and_returns_a_view_of_the_samples() -> None:
    buf = RingBuffer(6)
    buf.write(ramp(0, 5))
    buf.read(4)
    buf.write(ramp(5, 4))  # wraps: stored as [6, 7, 8, _, 4, 5]
    out = np.full(10, -1.0, dtype=np.float32)
    got = buf.read(5, out=out)
    np.testing.assert_array_equal(got, ramp(4, 5))
    np.testing.assert_array_equal(out[:5], ramp(4, 5))
    assert np.shares_memory(got, out)


def test_write_beyond_capacity_drops_oldest_and_counts() -> None:
    buf = RingBuffer(8)
    assert buf.write(ramp(0, 6)) == 0
    assert buf.write(ramp(6, 5)) == 3
    assert buf.dropped == 3
    assert buf.available == 8
    np.testing.assert_array_equal(buf.read(8), ramp(3, 8))


def test_drops_accumulate_across_writes() -> None:
    buf = RingBuffer(4)
    buf.write(ramp(0, 4))
    buf.write(ramp(4, 1))
    buf.write(ramp(5, 2))
    assert buf.dropped == 3
    np.testing.assert_array_equal(buf.read(4), ramp(3, 4))


def test_overflow_after_wrap_around_keeps_the_newest_samples_in_order() -> None:
    buf = RingBuffer(5)
    buf.write(ramp(0, 4))
    buf.read(3)  # start is now in the middle of the storage
    assert buf.write(ramp(4, 6)) == 2
    np.testing.assert_array_equal(buf.read(5), ramp(5, 5))


def test_a_write_larger_than_capacity_keeps_only_its_newest_samples() -> None:
    """Everything else, old contents and the head of the write itself, counts as dropped."""
    buf = RingBuffer(4)
    buf.write(ramp(0, 3))
    buf.read(2)  # one old sample left, start off zero
    assert buf.write(ramp(3, 10)) == 1 + 6
    assert buf.dropped == 7
    assert buf.available == 4
    np.testing.assert_array_equal(buf.read(4), ramp(9, 4))


def test_a_write_of_exactly_capacity_replaces_everything() -> None:
    buf = RingBuffer(4)
    buf.write(ramp(0, 2))
    assert buf.write(ramp(2, 4)) == 2
    np.testing.assert_array_equal(buf.read(4), ramp(2, 4))


def test_the_buffer_keeps_writing_normally_after_an_oversized_write() -> None:
    buf = RingBuffer(4)
    buf.write(ramp(0, 9))
    buf.read(3)
    assert buf.write(ramp(9, 3)) == 0
    np.testing.assert_array_equal(buf.read(4), ramp(8, 4))


def test_an_empty_write_changes_nothing() -> None:
    buf = RingBuffer(4)
    buf.write(ramp(0, 2))
    assert buf.write(np.zeros(0, dtype=np.float32)) == 0
    assert buf.available == 2
    assert buf.dropped == 0


def test_float64_input_is_stored_as_float32() -> None:
    buf = RingBuffer(4)
    buf.write(np.array([0.25, -0.5], dtype=np.float64))
    out = buf.read(2)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [0.25, -0.5])


def test_peek_shows_the_oldest_samples_without_removing_them() -> None:
    buf = RingBuffer(5)
    buf.write(ramp(0, 4))
    buf.read(3)
    buf.write(ramp(4, 3))  # wraps
    np.testing.assert_array_equal(buf.peek(3), ramp(3, 3))
    np.testing.assert_array_equal(buf.peek(100), ramp(3, 4))
    assert buf.available == 4
    np.testing.assert_array_equal(buf.read(4), ramp(3, 4))


def test_peek_returns_a_copy_that_cannot_change_the_buffer() -> None:
    buf = RingBuffer(4)
    buf.write(ramp(0, 3))
    peeked = buf.peek(3)
    peeked[:] = 99
    np.testing.assert_array_equal(buf.read(3), ramp(0, 3))


def test_discard_skips_the_oldest_samples_and_reports_how_many() -> None:
    buf = RingBuffer(6)
    buf.write(ramp(0, 5))
    assert buf.discard(2) == 2
    assert buf.available == 3
    assert buf.discard(10) == 3
    assert buf.available == 0
    buf.write(ramp(5, 6))
    np.testing.assert_array_equal(buf.read(6), ramp(5, 6))


def test_discard_is_not_counted_as_dropped() -> None:
    """``dropped`` measures overflow; a deliberate discard is the caller's own accounting."""
    buf = RingBuffer(6)
    buf.write(ramp(0, 5))
    buf.discard(4)
    assert buf.dropped == 0


def test_clear_empties_the_buffer_and_reports_what_went() -> None:
    buf = RingBuffer(6)
    buf.write(ramp(0, 4))
    assert buf.clear() == 4
    assert buf.available == 0
    assert buf.clear() == 0
    buf.write(ramp(4, 2))
    np.testing.assert_array_equal(buf.read(2), ramp(4, 2))


def test_stream_positions_count_what_was_written_and_what_left() -> None:
    buf = RingBuffer(4)
    buf.write(ramp(0, 3))
    buf.read(2)
    buf.write(ramp(3, 4))  # one sample overwritten
    assert (buf.written, buf.consumed) == (7, 3)
    buf.discard(1)
    buf.write(ramp(7, 9))  # larger than capacity: the three queued and five new ones go
    assert (buf.written, buf.consumed) == (16, 12)
    buf.clear()
    assert (buf.written, buf.consumed) == (16, 16)


def test_stream_positions_always_differ_by_what_is_available() -> None:
    """Whatever the mix of operations, written - consumed is what is in the buffer."""
    rng = np.random.default_rng(11)
    buf = RingBuffer(64)
    taken = 0
    for _ in range(500):
        op = rng.integers(4)
        n = int(rng.integers(0, 100))
        if op == 0:
            buf.write(ramp(buf.written, n))
        elif op == 1:
            taken += len(buf.read(n))
        elif op == 2:
            taken += buf.discard(n)
        else:
            buf.peek(n)  # looks, takes nothing
        assert buf.written - buf.consumed == buf.available
        assert buf.consumed == taken + buf.dropped
    # The stream position also tells which samples are queued: the newest ``available``.
    np.testing.assert_array_equal(buf.peek(buf.available), ramp(buf.consumed, buf.available))


def test_live_buffers_counts_buffers_until_they_are_collected() -> None:
    """A closed session must not keep its buffers alive: the count goes back down."""
    gc.collect()
    before = live_buffers()
    a = RingBuffer(16)
    b = RingBuffer(32)
    assert live_buffers() == before + 2
    del a
    gc.collect()
    assert live_buffers() == before + 1
    del b
    gc.collect()
    assert live_buffers() == before


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads Linux's /proc")
def test_a_freed_buffer_gives_its_memory_back_to_the_system() -> None:
    """Found by fuzzing: RSS grew ~6 MB with every speak session opened and closed.

    A speak session's 120 s output buffer is 23 MB. glibc hands back the first block of a
    size it frees, then serves later ones from its heap and keeps them resident after free;
    the buffer now lives in its own mapping, returned whole when the buffer goes.
    """
    capacity = 120 * 48_000
    RingBuffer(capacity)  # the first one freed teaches the allocator its size
    gc.collect()
    before = resident_bytes()
    buf = RingBuffer(capacity)
    frame = np.ones(960, np.float32)
    for _ in range(capacity // len(frame)):  # filled a frame at a time, as a session does
        buf.write(frame)
    assert resident_bytes() - before > capacity * 4 // 2
    del buf
    gc.collect()
    assert resident_bytes() - before < capacity * 4 // 4


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads Linux's /proc")
def test_a_released_buffer_gives_its_memory_back_while_still_referenced() -> None:
    """A closed session's buffers may wait for the cyclic collector before they are freed
    (a closed connection is a tangle of reference cycles): ``release`` gives the memory
    back at close, and the buffer stays usable, reading silence where it was released."""
    capacity = 120 * 48_000
    buf = RingBuffer(capacity)
    before = resident_bytes()
    frame = np.ones(960, np.float32)
    for _ in range(capacity // len(frame)):
        buf.write(frame)
    assert resident_bytes() - before > capacity * 4 // 2
    buf.release()
    assert buf.available == 0
    assert resident_bytes() - before < capacity * 4 // 4
    buf.write(np.full(4, 0.5, np.float32))
    assert buf.read(4).tolist() == [0.5] * 4
