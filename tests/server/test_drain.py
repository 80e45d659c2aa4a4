"""Graceful shutdown and session age: calls end cleanly, never by surprise.

SIGTERM makes the server stop admitting (503 ``draining``, readiness false) while live
sessions go on until they end or the drain timeout passes; then the process exits 0.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time

import aiohttp
import numpy as np
import pytest

from bench.common import free_port, spawned_server
from media.audio.frames import RTC_RATE
from media.engines.registry import EngineRegistry
from media.rtc.compat import restrict_host_addresses
from peer.call import PeerCall
from signaling.client import SignalingError
from tests.conftest import LOOPBACK, running_server


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * RTC_RATE), np.float32)


async def offer_status(url: str) -> tuple[int, str]:
    """Status and error code of a fresh offer (the session, if any, is ended at once)."""
    try:
        async with PeerCall(url, silence(1), engine="echo") as call:
            await call.end()
            return 200, ""
    except SignalingError as refused:
        return refused.status, refused.code


async def test_drain_waits_for_live_sessions_then_returns(registry: EngineRegistry):
    async with running_server(registry) as running:
        sessions = running.server.sessions
        async with PeerCall(running.url, silence(20), engine="echo") as call:
            draining = asyncio.create_task(sessions.drain(timeout=20))
            await call.wait_for("server_draining", timeout=5)
            assert await offer_status(running.url) == (503, "draining")
            assert not draining.done()  # the live call goes on
            started = time.monotonic()
            assert await call.end() == 200
            await asyncio.wait_for(draining, timeout=5)
            assert time.monotonic() - started < 2  # done when the last call ended
        assert len(sessions) == 0


async def test_drain_closes_what_is_left_at_the_timeout(registry: EngineRegistry):
    async with running_server(registry) as running:
        sessions = running.server.sessions
        async with PeerCall(running.url, silence(20), engine="echo") as call:
            session = sessions.get(call.session_id or "")
            started = time.monotonic()
            await sessions.drain(timeout=0.5)
            assert 0.4 < time.monotonic() - started < 3
            assert session.closed.is_set() and len(sessions) == 0


async def test_sessions_end_at_their_maximum_age(registry: EngineRegistry):
    async with (
        running_server(registry, max_session_seconds=1.0) as running,
        PeerCall(running.url, silence(10), engine="echo") as call,
    ):
        session = running.server.sessions.get(call.session_id or "")
        ended = await call.wait_for("session_ended", timeout=5)
        assert ended["reason"] == "max_duration"
        async with asyncio.timeout(5):
            await session.closed.wait()


@pytest.mark.parametrize("workers", [1, 2])
async def test_sigterm_drains_the_process(workers: int):
    restrict_host_addresses([LOOPBACK])
    port = free_port()
    command = [sys.executable, "-m", "server", "serve", "--engine", "echo", "--port", str(port)]
    command += ["--ice-host", LOOPBACK, "--workers", str(workers), "--drain-timeout", "20"]
    with spawned_server(command, port, core=None, ready_path="readyz", ready_timeout=120) as s:
        async with PeerCall(s.url, silence(30), engine="echo") as call:
            s.process.send_signal(signal.SIGTERM)
            await call.wait_for("server_draining", timeout=10)
            async with aiohttp.ClientSession() as http:
                async with http.get(s.url + "readyz") as ready:
                    assert ready.status == 503
                assert await offer_status(s.url) == (503, "draining")
                async with http.get(f"{s.url}sessions/{call.session_id}") as live:
                    assert live.status == 200  # the live call is still served
            assert await call.end() == 200
        exit_code = await asyncio.to_thread(s.process.wait, 15)
    assert exit_code == 0
