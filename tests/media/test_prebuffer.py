"""The pre-buffer plans with the engine's steady pace, not a sentence's first chunk."""

from __future__ import annotations

import pytest

from media.engines.testing import FakeSpeak
from media.pipeline.speak.pace import PACE_WEIGHT, SynthesisPace, engine_pace
from media.pipeline.speak.prebuffer import OWN_PACE_AFTER_S, PreBuffer
from media.pipeline.speak.stats import SpeakStats
from media.pipeline.speak.utterances import Utterance


def test_the_pace_weighs_recent_chunks_and_knows_nothing_before_the_first() -> None:
    pace = SynthesisPace()
    assert pace.factor is None
    pace.observe(0.1, 1.0)
    assert pace.factor == pytest.approx(0.1)
    for _ in range(round(5 / PACE_WEIGHT)):  # the machine got busier: five memories later
        pace.observe(0.5, 1.0)
    assert pace.factor == pytest.approx(0.5, abs=0.01)


def test_each_loaded_engine_has_its_own_pace() -> None:
    first, second = FakeSpeak(), FakeSpeak()
    assert engine_pace(first) is engine_pace(first)
    assert engine_pace(first) is not engine_pace(second)


def test_a_first_chunk_heavy_with_fixed_costs_does_not_size_the_pre_buffer() -> None:
    """Piper's first chunk carries the sentence's encoder run: its own factor says 0.6,
    while the engine's sessions make the rest of their sentences at 0.1."""
    engine = FakeSpeak()
    stats = SpeakStats(synthesis_seconds=0.6, synthesised_seconds=1.0)
    prebuffer = PreBuffer(engine, stats)
    utterance = Utterance("u1", characters=200)
    assert prebuffer.real_time_factor == pytest.approx(0.6)  # nothing else is known yet
    engine_pace(engine).observe(0.1, 1.0)
    assert prebuffer.real_time_factor == pytest.approx(0.1)
    # Its own steady pace, once it has enough of it, over the other sessions'.
    stats.steady_synthesis_seconds = 0.3 * OWN_PACE_AFTER_S
    stats.steady_synthesised_seconds = OWN_PACE_AFTER_S
    assert prebuffer.real_time_factor == pytest.approx(0.3)
    # A pace above real time holds back the deficit for the rest of the text.
    stats.steady_synthesis_seconds = 1.5 * OWN_PACE_AFTER_S
    slow = prebuffer.needed(utterance, last_chunk=0.2)
    stats.steady_synthesis_seconds = 0.3 * OWN_PACE_AFTER_S
    fast = prebuffer.needed(utterance, last_chunk=0.2)
    assert slow > 48_000 > fast
