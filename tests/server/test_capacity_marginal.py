"""bench.capacity's marginal CPU: the slope between levels, not the average per session."""

from __future__ import annotations

from typing import Any

import pytest

from bench.capacity import add_step_slopes, marginal_cpu_ms


def level(sessions: int, cpu: float, held: bool = True) -> dict[str, Any]:
    return {"sessions": sessions, "server_cpu": cpu, "held": held}


def test_the_slope_leaves_the_fixed_share_out() -> None:
    # 0.05 of a core whatever the load, then 12 ms per session-second.
    rows = [level(n, 0.05 + 0.012 * n) for n in (10, 20, 30, 40)]
    assert marginal_cpu_ms(rows) == pytest.approx(12.0)
    add_step_slopes(rows)
    assert rows[0]["marginal_cpu_ms"] is None
    assert [row["marginal_cpu_ms"] for row in rows[1:]] == pytest.approx([12.0] * 3)


def test_levels_past_the_knee_are_left_out_when_two_were_held() -> None:
    rows = [level(10, 0.2), level(20, 0.4), level(30, 0.98, held=False)]
    assert marginal_cpu_ms(rows) == pytest.approx(20.0)
    assert marginal_cpu_ms([level(10, 0.2), level(20, 0.5, held=False)]) == pytest.approx(30.0)
    assert marginal_cpu_ms([level(10, 0.2)]) is None
