"""InToOutMeter: which arrival a departing frame is matched with, drops included."""

from __future__ import annotations

import pytest

from media.pipeline.latency import InToOutMeter

FRAME = 960


def test_a_drop_after_a_frame_was_taken_does_not_shift_that_frame():
    """Guards the overload case: the engine took frames 0 and 1, then the queue dropped
    frame 2; frame 1 leaves later and must still be matched with its own packet (it showed
    as one frame less in-to-out time than the real one, with a backlog in the queue)."""
    meter = InToOutMeter()
    for index in range(4):
        meter.arrived(FRAME, at=index * 0.02)
    meter.dropped(FRAME, taken=2 * FRAME)  # frame 2 dropped after frames 0 and 1 were taken
    assert meter.departed(FRAME, at=0.1) == pytest.approx(0.1)
    assert meter.departed(2 * FRAME, at=0.12) == pytest.approx(0.1)  # frame 1
    assert meter.departed(3 * FRAME, at=0.14) == pytest.approx(0.08)  # frame 3, after the gap


def test_a_drop_before_a_frame_was_taken_shifts_it():
    meter = InToOutMeter()
    for index in range(3):
        meter.arrived(FRAME, at=index * 0.02)
    meter.dropped(FRAME, taken=0)  # frame 0 dropped before the engine took anything
    assert meter.departed(FRAME, at=0.05) == pytest.approx(0.03)  # frame 1
