"""Engine faults: one session's failures cost it a short silence and nobody else anything.

The faults are injected by the test engine ``fake-transform`` (``media.engines.testing``):
each session's options say which of its calls fail. Nothing else is fake: real peers, real
sessions, the real recovery path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

from media.audio.frames import RTC_RATE
from media.engines.registry import EngineRegistry
from media.engines.testing import FAKE_TRANSFORM
from peer.call import PeerCall
from server.sessions.breaker import CircuitBreaker
from signaling.client import SignalingError
from tests.clock import FakeClock
from tests.conftest import running_server
from tests.integration.test_transform_call import frame_levels_db

SILENT_DB = -60.0
FAULTS = 15  # consecutive failed engine calls: 300 ms of the faulty session's audio
FAULTY = {"fail_after": 50, "failures": FAULTS}  # after a second of clean audio


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


@pytest.fixture(scope="module")
def fault_registry() -> Iterator[EngineRegistry]:
    loaded = EngineRegistry.load(["echo", "piper", "fake-transform"], extra=[FAKE_TRANSFORM])
    yield loaded
    loaded.close()


async def test_a_failing_session_does_not_disturb_the_others(fault_registry: EngineRegistry):
    async with running_server(fault_registry, breaker_failures=0) as running:
        calls = [
            PeerCall(
                running.url,
                noise(12, seed),
                engine="fake-transform",
                options=FAULTY if seed == 0 else None,
            )
            for seed in range(5)
        ]
        try:
            for call in calls:
                await call.connect()
            faulty = running.server.sessions.get(calls[0].session_id or "")
            async with asyncio.timeout(10):
                while faulty.pipeline.state.raised < FAULTS:
                    await asyncio.sleep(0.01)
            await asyncio.sleep(1.0)
            error = await calls[0].wait_for("error", timeout=5, error="engine_failed")
        finally:
            for call in calls:
                await call.close()
    assert "reset" in error["message"]
    assert faulty.pipeline.counters().engine_errors == FAULTS
    assert longest_silence_frames(calls[0].received()) >= 10  # its own gap, as silence
    healthy = [longest_silence_frames(call.received()) for call in calls[1:]]
    for call in calls[1:]:
        assert not [e for e in call.events if e.get("type") == "error"]
    assert max(healthy) <= 2, f"a healthy call had a gap: longest silences {healthy} frames"


async def test_repeated_failures_open_the_breaker_until_the_cooldown(
    fault_registry: EngineRegistry,
):
    failing = {"fail_after": 0, "failures": 3}
    async with (
        running_server(fault_registry, breaker_failures=3, breaker_cooldown=1.0) as running,
        PeerCall(running.url, noise(10, 1), engine="fake-transform", options=failing) as call,
    ):
        session = running.server.sessions.get(call.session_id or "")
        breaker = running.server.sessions.breakers["fake-transform"]
        async with asyncio.timeout(5):
            while not breaker.is_open:
                await asyncio.sleep(0.02)

        with pytest.raises(SignalingError) as refused:
            async with PeerCall(running.url, noise(1, 2), engine="fake-transform"):
                pass
        assert (refused.value.status, refused.value.code) == (503, "engine_circuit_open")
        assert "fake-transform" in refused.value.message
        assert not running.server.sessions.breakers["echo"].is_open  # per engine

        await asyncio.sleep(breaker.retry_after + 0.05)
        async with PeerCall(running.url, noise(1, 3), engine="fake-transform") as again:
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
