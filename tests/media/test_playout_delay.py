"""The target playout delay under synthetic arrival traces.

A trace is one 20 ms packet per slot, sent at ``20 ms * k`` with RTP timestamp
``first_timestamp + 960 k``, arriving after a chosen network delay; packets reach the
estimator in arrival order, as they would the receive path. Time is only what the trace
says, so every check is exact and nothing sleeps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from media.audio.playout_delay import (
    CEILING_S,
    FLOOR_S,
    TS_MOD,
    PlayoutDelayEstimator,
)

SLOT = 0.02
FRAME = 960
BASE_DELAY = 0.04  # the link's one-way delay: never visible, only its variation is
WRAP_SOON = TS_MOD - 500 * FRAME  # a first timestamp that wraps 10 s into the trace


@dataclass
class Run:
    slots: np.ndarray  # which packet arrived, in the order they arrived
    arrivals: np.ndarray  # when
    targets: np.ndarray  # the target after each of them
    late: np.ndarray  # each one's lateness: its delay beyond the smallest delay so far

    def at(self, moment: float) -> float:
        """The target as it stood at ``moment`` (after the last packet that had arrived)."""
        return float(self.targets[np.searchsorted(self.arrivals, moment, side="right") - 1])

    def between(self, start: float, end: float) -> np.ndarray:
        return self.targets[(self.arrivals >= start) & (self.arrivals < end)]


def play(
    delays: np.ndarray,
    *,
    start: float = 0.0,
    first_timestamp: int = 1_000,
    lost: np.ndarray | None = None,
    estimator: PlayoutDelayEstimator | None = None,
) -> Run:
    """Feed packet ``k`` (sent at ``start + SLOT * k``, ``delays[k]`` late) unless ``lost[k]``."""
    estimator = estimator or PlayoutDelayEstimator()
    arrivals = start + np.arange(len(delays)) * SLOT + BASE_DELAY + delays
    order = np.argsort(arrivals, kind="stable")
    if lost is not None:
        order = order[~lost[order]]
    targets = [
        estimator.add((first_timestamp + FRAME * int(k)) % TS_MOD, float(arrivals[k]))
        for k in order
    ]
    late = delays[order] - np.minimum.accumulate(delays[order])
    return Run(order, arrivals[order], np.array(targets), late)


def calm(seconds: float, seed: int = 0, jitter: float = 0.005) -> np.ndarray:
    """Delays of a steady link: uniform jitter of a few milliseconds."""
    return np.random.default_rng(seed).uniform(0, jitter, round(seconds / SLOT))


def stall(delays: np.ndarray, at: float, hold: float) -> tuple[float, float]:
    """Hold every packet sent in ``[at, at + hold)`` until ``at + hold``, then release them
    together (0.1 ms apart), as Wi-Fi does when it retransmits or scans. Returns when the
    first of them arrived and its lateness."""
    first = round(at / SLOT)
    release = at + hold
    for index, k in enumerate(range(first, round(release / SLOT))):
        delays[k] = max(delays[k], release - k * SLOT + 1e-4 * index)
    return release + BASE_DELAY, float(delays[first])


def test_a_clean_link_keeps_the_target_at_the_floor() -> None:
    run = play(calm(20, jitter=0.002))
    assert np.all(run.targets == FLOOR_S)


def test_uniform_jitter_of_30ms_gives_a_target_around_30ms() -> None:
    run = play(calm(30, seed=1, jitter=0.03))
    steady = run.between(3, 30)
    assert np.all((steady >= 0.02) & (steady <= 0.04))
    assert np.median(steady) == pytest.approx(0.03, abs=0.01)
    # It covers the packets: at most 5 % of them came later than the target they found.
    uncovered = run.late[1:] > run.targets[:-1] + 1e-9
    assert uncovered[150:].mean() <= 0.05


@pytest.mark.parametrize("seed", range(3))
def test_a_wifi_stall_raises_the_target_at_once_and_it_decays_within_3s(seed: int) -> None:
    """Fast attack and slow decay alone (the peak mode would hold these stalls: see below)."""
    rng = np.random.default_rng(seed)
    delays = calm(25, seed=seed)
    stalls = [stall(delays, at, rng.uniform(0.15, 0.3)) for at in (5.0, 10.0, 15.0, 20.0)]
    run = play(delays, estimator=PlayoutDelayEstimator(peak_mode=False))
    calm_level = run.at(4.9)
    assert calm_level == FLOOR_S
    for release, lateness in stalls:
        first = np.searchsorted(run.arrivals, release)
        assert run.targets[first] >= lateness, "raised by the very packet that showed it"
        after = run.between(release, release + 3.0)
        assert np.all(np.diff(after) <= 1e-12), "then it only comes down"
        assert run.at(release + 0.5) >= calm_level + 0.05, "and not at once"
        assert run.at(release + 3.0) <= calm_level + 0.02, "back near calm within 3 s"


def test_a_lone_stall_does_not_start_the_peak_mode() -> None:
    delays = calm(15, seed=3)
    release, lateness = stall(delays, 5.0, 0.17)
    estimator = PlayoutDelayEstimator()
    run = play(delays, estimator=estimator)
    assert run.at(release) >= lateness
    assert run.at(release + 3.0) <= FLOOR_S + 0.02
    assert not estimator.peak_mode


@pytest.mark.parametrize("seed", range(3))
def test_stalls_that_recur_hold_the_target_over_the_highest_until_they_stop(seed: int) -> None:
    """Stalls of 110-170 ms every 3 s: from the second on the target stays over the highest
    seen, so no later stall finds the buffer short; 6 s (twice the period) after the last
    one it lets go and decays as after any spike."""
    rng = np.random.default_rng(seed)
    delays = calm(32, seed=seed)
    starts = (3.0, 6.0, 9.0, 12.0, 15.0)
    stalls = [stall(delays, at, rng.uniform(0.11, 0.17)) for at in starts]
    estimator = PlayoutDelayEstimator()
    run = play(delays, estimator=estimator)
    first_release = stalls[0][0]
    assert run.at(first_release + 2.5) <= FLOOR_S + 0.02, "one stall is no pattern yet"
    for index, (release, _) in enumerate(stalls[1:], start=1):
        highest = max(height for _, height in stalls[: index + 1])
        held = run.between(release, stalls[-1][0] + 5.9)
        assert np.all(held >= highest - 0.005), "held over every peak seen so far"
        if index + 1 < len(stalls):
            next_release = stalls[index + 1][0]
            before = run.between(next_release - 0.5, next_release)
            assert np.all(before >= stalls[index + 1][1] - 0.03), "the next one finds it ready"
    last_release = stalls[-1][0]
    assert run.at(last_release + 6.5) < run.at(last_release + 5.5), "let go after 2 periods"
    assert run.at(last_release + 6.2 + 3.0) <= FLOOR_S + 0.02
    assert not estimator.peak_mode


def test_stalls_more_than_10s_apart_are_no_pattern() -> None:
    delays = calm(40, seed=4)
    stalls = [stall(delays, at, 0.15) for at in (2.0, 12.5, 23.0, 33.5)]
    run = play(delays)
    for release, lateness in stalls:
        assert run.at(release) >= lateness - 1e-9
        assert run.at(release + 3.0) <= FLOOR_S + 0.02, "each decays as a lone spike"


def test_jitter_and_reordering_are_not_peaks() -> None:
    """Uniform jitter of 30 ms, which reorders packets sent 20 ms apart, stays under the
    margin a peak needs: the target is the histogram's, as without the peak mode."""
    delays = calm(30, seed=6, jitter=0.03)
    held = play(delays)
    plain = play(delays, estimator=PlayoutDelayEstimator(peak_mode=False))
    np.testing.assert_array_equal(held.targets, plain.targets)


def test_reordered_packets_count_with_their_lateness() -> None:
    rng = np.random.default_rng(2)
    delays = calm(30, seed=2)
    swapped = rng.random(len(delays)) < 0.1
    delays[swapped] += 0.035  # arrive after the packet sent next: 10 % of them, 35 ms late
    run = play(delays)
    assert np.any(np.diff(run.slots) < 0), "timestamps go back now and then"
    steady = run.between(3, 30)
    assert np.median(steady) == pytest.approx(0.04)
    assert steady.max() <= 0.05
    uncovered = run.late[1:] > run.targets[:-1] + 1e-9
    assert uncovered[150:].mean() <= 0.05, "95 % of packets find their lateness covered"


def test_one_very_late_packet_raises_the_target_at_once_then_it_decays() -> None:
    delays = calm(10, seed=3)
    delays[250] = 0.2  # sent at 5 s, overtaken by nine packets
    run = play(delays)
    arrived = np.flatnonzero(np.isclose(run.arrivals, 250 * SLOT + BASE_DELAY + 0.2))[0]
    assert run.targets[arrived - 1] == FLOOR_S
    assert run.targets[arrived] >= 0.2
    assert run.at(run.arrivals[arrived] + 3.0) <= FLOOR_S + 0.02


@pytest.mark.parametrize("jitter", [0.002, 0.03])
def test_a_timestamp_wrap_changes_nothing(jitter: float) -> None:
    rng = np.random.default_rng(4)
    delays = calm(20, seed=4, jitter=jitter)
    delays[rng.random(len(delays)) < 0.05] += 0.05  # reordering...
    delays[495:500] += 0.15  # ...and the last packets before the wrap overtaken by the first
    plain = play(delays)
    wrapped = play(delays, first_timestamp=WRAP_SOON)
    assert np.array_equal(plain.targets, wrapped.targets)


def test_the_target_follows_the_link_when_it_calms_down() -> None:
    """The histogram forgets: 20 s of 30 ms jitter weigh nothing 4 s into a calm spell."""
    delays = np.concatenate([calm(20, seed=12, jitter=0.03), calm(20, seed=13)])
    run = play(delays)
    assert np.median(run.between(10, 20)) == pytest.approx(0.03)
    assert np.all(run.between(24, 40) == FLOOR_S)


def test_loss_does_not_raise_the_target() -> None:
    rng = np.random.default_rng(5)
    for jitter in (0.002, 0.03):
        delays = calm(30, seed=5, jitter=jitter)
        lost = rng.random(len(delays)) < 0.05
        lost[500:510] = True  # and one burst of ten
        whole, lossy = play(delays), play(delays, lost=lost)
        assert lossy.between(3, 30).max() <= whole.between(3, 30).max()
        if jitter < FLOOR_S:
            assert np.all(lossy.targets == FLOOR_S)


def test_silence_without_packets_does_not_raise_the_target() -> None:
    """Opus DTX sends nothing in pauses: timestamps and arrivals jump together."""
    estimator = PlayoutDelayEstimator()
    play(calm(5, seed=6), estimator=estimator)
    resumed = 13.0  # 8 s later
    run = play(
        calm(5, seed=7),
        start=resumed,
        first_timestamp=1_000 + FRAME * round(resumed / SLOT),
        estimator=estimator,
    )
    assert np.all(run.targets == FLOOR_S)


@pytest.mark.parametrize("media_jump", [-2.0, -30.0, 1e4, -1e4])
def test_a_sender_restart_does_not_raise_the_target(media_jump: float) -> None:
    """A new stream's timestamps start anywhere: a jump of media time that the arrivals do
    not show is a new timing, not seconds of lateness."""
    estimator = PlayoutDelayEstimator()
    play(calm(5, seed=8), estimator=estimator)
    restarted = 1_000 + round((5.0 + media_jump) / SLOT) * FRAME
    run = play(calm(3, seed=9), start=5.0, first_timestamp=restarted, estimator=estimator)
    assert np.all(run.targets == FLOOR_S)


def test_a_slow_sender_clock_does_not_raise_the_target() -> None:
    """A sender clock 100 ppm slow drifts the transit by 30 ms in 5 minutes: not a delay."""
    estimator = PlayoutDelayEstimator()
    delays = calm(300, seed=9, jitter=0.002) + np.arange(round(300 / SLOT)) * SLOT * 1e-4
    assert np.all(play(delays, estimator=estimator).targets == FLOOR_S)


def test_the_target_stays_between_floor_and_ceiling() -> None:
    delays = calm(10, seed=10)
    stall(delays, 5.0, 0.8)  # beyond any sensible buffer
    run = play(delays)
    assert run.targets.max() == CEILING_S
    assert run.targets.min() == FLOOR_S
    custom = play(delays, estimator=PlayoutDelayEstimator(floor=0.04, ceiling=0.1))
    assert custom.targets.min() == 0.04
    assert custom.targets.max() == 0.1


def test_the_quantile_sets_how_many_late_packets_are_covered() -> None:
    """20 % of packets 55 ms late: a 0.95 target covers them, a 0.7 one leaves them out.

    With a very short peak half-life, fast attack only lifts the target for the late packet
    itself, so the targets the on-time packets see are the histogram's alone.
    """
    rng = np.random.default_rng(11)
    delays = calm(30, seed=11)
    late = rng.random(len(delays)) < 0.2
    delays[late] += 0.055
    for quantile, expected in ((0.7, FLOOR_S), (0.95, 0.06)):
        estimator = PlayoutDelayEstimator(quantile=quantile, peak_half_life=0.002, peak_mode=False)
        run = play(delays, estimator=estimator)
        on_time = run.targets[~late[run.slots]][150:]
        assert np.median(on_time) == pytest.approx(expected)


def test_the_target_is_the_quantile_of_the_forgetting_histogram_over_a_long_call() -> None:
    """Against the histogram computed in full at every packet (NetEq's definition): 15
    minutes of a link that turns from calm to jittery and back, with 300 ms stragglers,
    long enough for the running scale to be folded back into the weights. Every tenth
    packet comes with no delay, so each packet's relative delay is its own delay; with the
    peak's half-life near 0 the peak is the latest packet's bucket, held while packets sent
    after a straggler arrive before it."""
    rng = np.random.default_rng(5)
    minutes = [calm(60, seed=m, jitter=0.019 if m % 2 else 0.005) for m in range(15)]
    delays = np.concatenate(minutes) + (rng.random(45_000) < 0.01) * 0.3
    delays[::10] = 0.0
    bucket = 0.005
    estimator = PlayoutDelayEstimator(
        peak_half_life=1e-9, floor=0.0, bucket=bucket, peak_mode=False
    )
    histogram = np.zeros(round(1.0 / bucket))
    peak, peak_at = 0.0, 0.0  # a straggler's peak holds until the packets sent after it
    wrong = []
    for k, delay in enumerate(delays):
        arrival = k * SLOT + float(delay)
        target = estimator.add(1_000 + FRAME * k, arrival)
        keep = min(0.983, 1 - 1 / (k + 1))
        histogram *= keep
        own = int(delay / bucket)
        histogram[own] += 1 - keep
        quantile = (int(np.searchsorted(np.cumsum(histogram), 0.95)) + 1) * bucket
        if arrival > peak_at or (own + 1) * bucket > peak:
            peak, peak_at = (own + 1) * bucket, arrival
        expected = min(CEILING_S, max(quantile, peak))
        if abs(target - expected) > 1e-9:
            wrong.append((k, target, expected))
    assert not wrong, wrong[:5]


@pytest.mark.parametrize(
    "settings",
    [
        {"quantile": 1.0},
        {"quantile": 0.0},
        {"forget_factor": 1.0},
        {"floor": 0.1, "ceiling": 0.05},
        {"floor": -0.01},
        {"clock_rate": 0},
        {"peak_half_life": 0.0},
    ],
)
def test_bad_settings_are_refused(settings: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        PlayoutDelayEstimator(**settings)
