"""A worker that keeps dying is restarted after a growing pause, not in a tight loop.

The process-level behaviour (a killed worker replaced within 2 s, the other's calls going
on) is tests/server/test_worker_supervision.py; this checks the schedule of restarts when
deaths come in a burst, on the front's own clock.
"""

from __future__ import annotations

import pytest

from server.config import Settings
from server.deploy import workers
from server.deploy.workers import DEATH_WINDOW_S, DEATHS_BEFORE_BACKOFF, MAX_RESTART_DELAY_S, Front


def test_restarts_are_immediate_at_first_then_back_off_then_recover(
    monkeypatch: pytest.MonkeyPatch,
):
    now = [1000.0]
    monkeypatch.setattr(workers.time, "monotonic", lambda: now[0])
    front = Front(Settings(), [])
    delays = []
    for _ in range(DEATHS_BEFORE_BACKOFF + 8):
        front._record_death()
        delays.append(front._restart_delay())
        now[0] += 1.0
    assert delays[:DEATHS_BEFORE_BACKOFF] == [0.0] * DEATHS_BEFORE_BACKOFF
    growing = delays[DEATHS_BEFORE_BACKOFF:]
    assert growing[:4] == [1.0, 2.0, 4.0, 8.0]
    assert max(growing) == MAX_RESTART_DELAY_S  # capped
    # A worker that has stayed up for the whole window is forgiven its past deaths.
    now[0] += DEATH_WINDOW_S + 1
    front._record_death()
    assert front._restart_delay() == 0.0
