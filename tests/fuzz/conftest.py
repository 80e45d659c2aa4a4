"""Fuzzing budgets (a short CI run, a long one behind ``-m slow``) and the input tally."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, Phase, settings

from tests.fuzz.harness import INPUTS, OPENED

F = TypeVar("F", bound=Callable[..., Any])
# Inputs per hypothesis example (a list of up to this many): amortises hypothesis's own cost
# per example, which is several times that of drawing one more input.
BATCH = 8


@dataclass(frozen=True)
class Budget:
    """How many inputs each family gets: ``scale`` times its CI count.

    The CI run is derandomised (the same inputs every run, so a red build is reproducible);
    the long run draws new ones each time and is the one that explores.
    """

    name: str
    scale: int

    def __call__(self, examples: int) -> Callable[[F], F]:
        return settings(
            max_examples=examples * self.scale,
            deadline=None,
            database=None,
            derandomize=self.scale == 1,
            print_blob=True,
            phases=(Phase.explicit, Phase.generate, Phase.shrink),
            suppress_health_check=(HealthCheck.too_slow, HealthCheck.data_too_large),
        )


@pytest.fixture(
    params=[
        pytest.param(Budget("ci", 1), id="ci"),
        pytest.param(Budget("full", 10), id="full", marks=pytest.mark.slow),
    ]
)
def budget(request: pytest.FixtureRequest) -> Budget:
    return request.param


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not INPUTS:
        return
    terminalreporter.section("fuzz inputs")
    for family, count in sorted(INPUTS.items()):
        terminalreporter.write_line(f"{family:<32} {count:>8}")
    terminalreporter.write_line(f"{'total':<32} {sum(INPUTS.values()):>8}")
    for family, count in sorted(OPENED.items()):
        terminalreporter.write_line(f"sessions opened by valid inputs, {family}: {count}")
