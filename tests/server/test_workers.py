"""Several worker processes behind one front: placement, routing and admission."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Iterator

import aiohttp
import numpy as np
import pytest

from bench.common import ServerHandle, free_port, spawned_server
from media.rtc.compat import restrict_host_addresses
from peer.call import PeerCall


@contextlib.contextmanager
def two_workers(max_sessions: int, *extra: str) -> Iterator[ServerHandle]:
    """``serve --workers 2 --max-sessions N`` as a real process tree (no spare unless
    ``extra`` asks for one: starting it costs every test seconds)."""
    port = free_port()
    command = [sys.executable, "-m", "server", "serve", "--port", str(port), "--workers", "2"]
    command += ["--max-sessions", str(max_sessions), "--engine", "echo", "--ice-host", "127.0.0.1"]
    command += ["--spare-workers", "0", *extra]
    with spawned_server(command, port, core=None, ready_path="engines", ready_timeout=120) as s:
        yield s


@pytest.fixture
def front() -> Iterator[str]:
    with two_workers(max_sessions=3) as server:
        yield server.url


async def test_sessions_spread_over_workers_and_excess_is_refused_at_once(front: str):
    restrict_host_addresses(["127.0.0.1"])
    silence = np.zeros(48_000 * 30, np.float32)
    calls = [PeerCall(front, silence, engine="echo") for _ in range(3)]
    try:
        for call in calls:
            await call.connect()
            await asyncio.sleep(0.6)  # let the front read the workers' load once
        prefixes = {call.session_id.split("-", 1)[0] for call in calls if call.session_id}
        assert prefixes == {"w0", "w1"}

        async with aiohttp.ClientSession() as http:
            extra = PeerCall(front, silence, engine="echo")
            await extra.pc.setLocalDescription(await extra.pc.createOffer())
            payload = {"sdp": extra.pc.localDescription.sdp, "type": "offer"}
            started = time.monotonic()
            async with http.post(front + "offer", json=payload) as response:
                refused_ms = (time.monotonic() - started) * 1000
                assert response.status == 503
                assert response.headers["Retry-After"]
                assert (await response.json())["error"] == "at_capacity"
            await extra.close()
            assert refused_ms < 50

            for call in calls:  # requests for a session reach the worker that owns it
                async with http.get(f"{front}sessions/{call.session_id}") as response:
                    assert response.status == 200
                    assert (await response.json())["session_id"] == call.session_id
                assert await call.end() == 200
            async with http.get(f"{front}sessions/w9-unknown") as response:
                assert response.status == 404
    finally:
        for call in calls:
            await call.close()
