"""Engine faults: one session's failures cost it a short silence and nobody else anything.

The faults are injected: a wrapper around the real echo engine raises from ``process``
while armed. Nothing else is fake: real peers, real sessions, the real recovery path.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from media.audio.frames import RTC_RATE
from media.engines.base import TransformEngine
from media.engines.registry import EngineRegistry
from peer.call import PeerCall
from server.sessions.breaker import CircuitBreaker
from signaling.client import SignalingError
from tests.clock import FakeClock
from tests.conftest import running_server
from tests.integration.test_transform_call import frame_levels_db

SILENT_DB = -60.0
FAULTS = 15  # consecutive failed engine calls: 300 ms of the faulty session's audio


class FailingEngine:
    """A real engine that raises from ``process`` while ``armed`` (an injected fault)."""

    def __init__(self, engine: TransformEngine[Any]) -> None:
        self._engine = engine
        self.armed = False
        self.raised = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def process(self, state: Any, chunk: np.ndarray) -> tuple[np.ndarray, Any]:
        if self.armed:
            self.raised += 1
            raise RuntimeError("injected fault")
        return self._engine.process(state, chunk)


def noise(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (0.1 * rng.standard_normal(int(seconds * RTC_RATE))).astype(np.float32)


def longest_silence_frames(received: np.ndarray) -> int:
    """The longest run of silent 20 ms frames after the echo first arrived."""
    levels = frame_levels_db(received)
    audible = np.flatnonzero(levels > SILENT_DB)
    if len(audible) == 0:
        return len(levels)
    longest = run = 0
    for level in levels[audible[0] :]:
        run = run + 1 if level <= SILENT_DB else 0
        longest = max(longest, run)
    return longest


async def test_a_failing_session_does_not_disturb_the_others(registry: EngineRegistry):
    async with running_server(registry, breaker_failures=0) as running:
        calls = [PeerCall(running.url, noise(12, seed), engine="echo") for seed in range(5)]
        try:
            for call in calls:
                await call.connect()
            faulty = running.server.sessions.get(calls[0].session_id or "")
            failing = FailingEngine(faulty.pipeline.engine)
            faulty.pipeline.engine = failing  # type: ignore[assignment]
            await asyncio.sleep(1.0)
            failing.armed = True
            async with asyncio.timeout(10):
                while failing.raised < FAULTS:
                    await asyncio.sleep(0.01)
            failing.armed = False
            await asyncio.sleep(1.0)
            error = await calls[0].wait_for("error", timeout=5, error="engine_failed")
        finally:
            for call in calls:
                await call.close()
    assert "reset" in error["message"]
    assert faulty.pipeline.stats.engine_errors == failing.raised
    assert longest_silence_frames(calls[0].received()) >= 10  # its own gap, as silence
    healthy = [longest_silence_frames(call.received()) for call in calls[1:]]
    for call in calls[1:]:
        assert not [e for e in call.events if e.get("type") == "error"]
    assert max(healthy) <= 2, f"a healthy call had a gap: longest silences {healthy} frames"


async def test_repeated_failures_open_the_breaker_until_the_cooldown(registry: EngineRegistry):
    async with (
        running_server(registry, breaker_failures=3, breaker_cooldown=1.0) as running,
        PeerCall(running.url, noise(10, 1), engine="echo") as call,
    ):
        session = running.server.sessions.get(call.session_id or "")
        failing = FailingEngine(session.pipeline.engine)
        session.pipeline.engine = failing  # type: ignore[assignment]
        failing.armed = True
        breaker = running.server.sessions.breakers["echo"]
        async with asyncio.timeout(5):
            while not breaker.is_open:
                await asyncio.sleep(0.02)
        failing.armed = False

        with pytest.raises(SignalingError) as refused:
            async with PeerCall(running.url, noise(1, 2), engine="echo"):
                pass
        assert (refused.value.status, refused.value.code) == (503, "engine_circuit_open")
        assert "echo" in refused.value.message
        assert not running.server.sessions.breakers["piper"].is_open  # per engine

        await asyncio.sleep(breaker.retry_after + 0.05)
        async with PeerCall(running.url, noise(1, 3), engine="echo") as again:
            assert again.session_id is not None
        assert session.connection is not None  # the failing session itself went on


def test_breaker_counts_failures_within_its_window():
    clock = FakeClock()
    breaker = CircuitBreaker(failures=3, cooldown=10, window=60, clock=clock)
    for _ in range(2):
        breaker.record_failure()
    clock.now = 61  # the first two are forgotten
    breaker.record_failure()
    assert not breaker.is_open
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.is_open and breaker.retry_after == pytest.approx(10)
    clock.now = 71.5
    assert not breaker.is_open and breaker.retry_after == 0
    breaker.record_failure()  # half-open: one more failure re-opens it
    assert breaker.is_open and breaker.times_opened == 2


def test_breaker_with_zero_failures_never_opens():
    breaker = CircuitBreaker(failures=0, cooldown=10)
    for _ in range(100):
        breaker.record_failure()
    assert not breaker.is_open
