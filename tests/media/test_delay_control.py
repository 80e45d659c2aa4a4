"""How a playout buffer steps toward its target delay (``media.audio.delay_control``)."""

from __future__ import annotations

from media.audio.delay_control import MAX_SHED, TOLERATED_EXCESS_S, DelayControl
from media.audio.splice import RATE

WANTED = 0.03  # a jittery link: the target is above the floor
PLENTY = 4 * 960  # samples held beyond the frame to play


def test_a_small_excess_is_kept_without_a_splice_or_a_grid_move():
    control = DelayControl()
    for excess in (0.002, TOLERATED_EXCESS_S / 2, 0.99 * TOLERATED_EXCESS_S):
        assert control.step(WANTED + excess, WANTED, PLENTY) == (0, 0.0)


def test_an_excess_beyond_the_tolerance_is_shed_by_accelerating_all_of_it():
    control = DelayControl()
    excess = TOLERATED_EXCESS_S + 0.002
    change, nudge = control.step(WANTED + excess, WANTED, PLENTY)
    assert (change, nudge) == (min(round(excess * RATE), MAX_SHED), 0.0)
    assert control.step(WANTED + 0.2, WANTED, PLENTY)[0] == MAX_SHED


def test_an_excess_the_buffer_cannot_pay_for_moves_the_grid_instead():
    control = DelayControl()
    change, nudge = control.step(WANTED + TOLERATED_EXCESS_S + 0.003, WANTED, 0)
    assert change == 0 and -0.01 <= nudge < 0


def test_a_shortfall_is_made_up_by_expanding_ahead_of_time():
    control = DelayControl()
    change, _ = control.step(WANTED - 0.008, WANTED, PLENTY)
    assert change == -round(0.008 * RATE)


def test_on_a_steady_link_even_a_small_excess_is_shed():
    """With the target at its floor (wanted 0) nothing is late, so the excess a stall left
    goes at once; keeping it would leave the call a few ms later for good."""
    control = DelayControl()
    assert control.step(0.004, 0.0, PLENTY)[0] == round(0.004 * RATE)
