"""Echoed speech through both receive paths of a call on a virtual clock (bench/playout_sim.py).

The live network tests (tests/netfaults) judge holes and round trips on the real event
loop, where the machine's timing moves one call's PESQ-WB by up to a point. On the virtual
clock a call is the same every run, so the quality the playout code delivers through an
impaired link can be held to a floor. With 2 % loss and 0-30 ms jitter each way, six 8 s
calls scored a median of 3.85 (3.31-4.33); the floor, 3.5, fails each of these breakages of
the receive path, measured the same way: FEC copies never used 2.72, the delay kept at the
edge of lateness (no tolerated excess, media/audio/delay_control.py) 3.23, no frame held for
FEC copies once the link has lost one (media/rtc/receive.py's LOSS_HOLD_S) 3.38.
"""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from bench.netimpair import PROFILES, speech
from bench.playout_sim import measure, simulate

SECONDS = 8.0
SEEDS = 6
CLEAN_PESQ_FLOOR = 4.0  # 4.085 measured: the codec's own loss, twice
CLEAN_DELAY_MS = 20.0  # 13.0 measured: Opus's look-ahead and one frame, twice
IMPAIRED_MEDIAN_FLOOR = 3.5
IMPAIRED_DELAY_MS = 80.0  # median 70 ms measured: the jitter and a frame held, both legs


@pytest.fixture(scope="module")
def audio() -> np.ndarray:
    return speech(SECONDS).astype(np.float32)


def test_a_clean_link_echoes_speech_as_the_codec_leaves_it(audio: np.ndarray) -> None:
    call = simulate(audio, PROFILES["clean"], seed=0)
    measured = measure(audio, call)
    assert measured["pesq_wb"] >= CLEAN_PESQ_FLOOR, measured
    assert measured["delay_ms"] is not None and measured["delay_ms"] <= CLEAN_DELAY_MS, measured
    for leg in (call.server, call.client):
        assert leg.concealed == leg.late_dropped == 0
        assert leg.accelerated_ms == leg.preemptive_ms == 0.0


def test_loss_and_jitter_leave_echoed_speech_above_a_floor(audio: np.ndarray) -> None:
    calls = [simulate(audio, PROFILES["loss2_jitter30"], seed) for seed in range(SEEDS)]
    measured = [measure(audio, call) for call in calls]
    scores = [m["pesq_wb"] for m in measured]
    assert statistics.median(scores) >= IMPAIRED_MEDIAN_FLOOR, scores
    delays = [m["delay_ms"] for m in measured if m["delay_ms"] is not None]
    assert statistics.median(delays) <= IMPAIRED_DELAY_MS, delays
    for leg in ("server", "client"):  # both links lost packets, and FEC rebuilt some
        assert all(getattr(call, leg).concealed > 0 for call in calls)
        assert sum(getattr(call, leg).recovered_fec for call in calls) > 0


def test_a_simulated_call_is_the_same_every_run(audio: np.ndarray) -> None:
    first, second = (simulate(audio, PROFILES["loss2_jitter30"], seed=3) for _ in range(2))
    assert first.played_at == second.played_at
    assert np.array_equal(np.concatenate(first.played), np.concatenate(second.played))


def test_a_stall_of_both_legs_is_held_once_by_the_listener_not_by_both_buffers(
    audio: np.ndarray,
) -> None:
    """The server's leg relays a stall (media/rtc/receive.py's ``relay_stalls``): only the
    listener's buffer holds it, so the call's playout delay is one stall, not two."""
    relayed, held = (
        simulate(audio, PROFILES["stalls_both_ways"], seed=0, server_leg=leg)
        for leg in ("relay", "buffer")
    )
    assert relayed.server.relayed_stalls >= 2 and held.server.relayed_stalls == 0
    assert relayed.server.target_ms <= 40.0 < 100.0 <= held.server.target_ms
    assert relayed.client.target_ms >= 100.0  # the listener covers the stalls
    playout = [sum(call.playout_ms) for call in (relayed, held)]
    assert playout[0] < 0.7 * playout[1], playout
