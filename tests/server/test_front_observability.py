"""A front with two workers answers /metrics, /sessions and /readyz for the whole server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
import numpy as np
import pytest

from media.rtc.compat import restrict_host_addresses
from peer.call import PeerCall
from tests.server.test_metrics import parse, value
from tests.server.test_workers import two_workers

LOAD_SETTLE_S = 1.2  # the front reads the workers' load every 0.5 s


@pytest.fixture
def front() -> Iterator[str]:
    with two_workers(max_sessions=1) as server:
        yield server.url


async def get_json(http: aiohttp.ClientSession, url: str) -> tuple[int, dict]:
    async with http.get(url) as response:
        return response.status, await response.json()


async def test_front_merges_workers_metrics_sessions_and_readiness(front: str):
    restrict_host_addresses(["127.0.0.1"])
    async with aiohttp.ClientSession() as http:
        await asyncio.sleep(LOAD_SETTLE_S)
        status, ready = await get_json(http, front + "readyz")
        assert (status, ready["reasons"]) == (200, []), ready

        silence = np.zeros(48_000 * 20, np.float32)
        async with PeerCall(front, silence, engine="echo") as call:
            await asyncio.sleep(LOAD_SETTLE_S)
            status, listed = await get_json(http, front + "sessions")
            assert status == 200
            assert [s["session_id"] for s in listed["sessions"]] == [call.session_id]
            assert listed["unreachable_workers"] == []
            status, ready = await get_json(http, front + "readyz")
            assert (status, ready["reasons"]) == (503, ["at_capacity"]), ready

            extra = PeerCall(front, silence, engine="echo")
            await extra.pc.setLocalDescription(await extra.pc.createOffer())
            offer = {"sdp": extra.pc.localDescription.sdp, "type": "offer"}
            async with http.post(front + "offer", json=offer) as response:
                assert response.status == 503
            await extra.close()

            async with http.get(front + "metrics") as response:
                assert response.status == 200
                text = await response.text()
            assert await call.end() == 200

    samples = parse(text)
    owner = (call.session_id or "").split("-", 1)[0].removeprefix("w")
    for worker in ("0", "1"):
        assert value(samples, "cosyrtc_worker_up", worker=worker) == 1
        assert value(samples, "process_cpu_seconds_total", worker=worker) > 0
        assert value(samples, "process_resident_memory_bytes", worker=worker) > 10_000_000
    assert value(samples, "process_resident_memory_bytes", worker="front") > 0
    live = [
        value(samples, "cosyrtc_sessions_live", engine="echo", kind="transform", worker=w)
        for w in ("0", "1")
    ]
    assert sorted(live) == [0, 1]
    assert value(samples, "cosyrtc_frames_sent_total", engine="echo", worker=owner) > 0
    at_front = {"reason": "at_capacity", "worker": "front"}
    assert value(samples, "cosyrtc_sessions_rejected_total", **at_front) == 1
    for family in ("process_cpu_seconds_total", "cosyrtc_frames_sent_total"):
        assert text.count(f"# TYPE {family} ") == 1, family
