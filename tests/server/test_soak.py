"""Soak: sessions churning for a while leave no threads, sockets or queued audio behind.

The full soak (30 minutes at 80 % of one core's capacity, ``python -m bench.soak``) runs
only on demand (``pytest -m slow``); CI runs a short one with the same code.
"""

from __future__ import annotations

import argparse

import pytest

from bench.soak import run

# Frames queued across all sessions that still count as "not growing": each session may
# hold a frame or two in its input queue and its output slot at any moment.
QUEUED_FRAMES_PER_SESSION = 3


def soak_args(seconds: float, sessions: int, sample_every: float) -> argparse.Namespace:
    return argparse.Namespace(
        seconds=seconds,
        sessions=sessions,
        engine="echo",
        min_life=3.0 if seconds < 600 else 5.0,
        max_life=8.0 if seconds < 600 else 20.0,
        sample_every=sample_every,
    )


def check(result: dict, sessions: int) -> None:
    assert result["failed"] == 0
    assert result["opened"] > sessions
    end = result["after_all_closed"]
    assert end["live"] == 0
    assert end["threads"] <= result["threads_after_warm_up"]
    assert end["fds"] <= result["fds_after_warm_up"]
    assert result["queued_frames_max"] <= QUEUED_FRAMES_PER_SESSION * sessions


async def test_short_soak_leaves_nothing_behind():
    result = await run(soak_args(seconds=30, sessions=4, sample_every=10))
    check(result, sessions=4)


@pytest.mark.slow
@pytest.mark.timeout(2400)
async def test_thirty_minute_soak_at_eighty_percent_of_capacity():
    result = await run(soak_args(seconds=1800, sessions=24, sample_every=30))
    check(result, sessions=24)
    assert abs(result["rss_drift_percent"]) <= 5
    assert result["queued_frames_mean_second_half"] <= result["queued_frames_mean_first_half"] + 2
