"""A front with a model host beside its workers: the host killed under live speak calls.

Real processes throughout: ``serve --workers 2`` starts the host and the workers, Piper
runs in the host only, and the callers are aiortc peers over loopback.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import aiohttp
import numpy as np

from media.rtc.compat import restrict_host_addresses
from peer.call import PeerCall
from tests.server.test_workers import two_workers

LONG = "The train to the city leaves at half past nine, from platform four, every day. " * 3


async def readiness(http: aiohttp.ClientSession, url: str) -> dict:
    async with http.get(url + "readyz") as response:
        return await response.json()


async def test_a_killed_host_gives_each_call_one_error_and_is_back_within_two_seconds():
    restrict_host_addresses(["127.0.0.1"])
    with two_workers(8, "--engines", "echo", "piper") as server:
        url = server.url
        silence = np.zeros(48_000 * 60, np.float32)
        calls = [PeerCall(url, silence, engine="piper") for _ in range(4)]
        async with aiohttp.ClientSession() as http:
            ready = await readiness(http, url)
            assert ready["ready"], ready
            host = ready["model_host"]
            assert host["serving"] and host["restarts"] == 0
            try:
                await asyncio.gather(*(call.connect() for call in calls))
                await asyncio.gather(
                    *(call.send({"type": "speak", "text": LONG}) for call in calls)
                )
                await asyncio.gather(*(call.wait_for("speech_started", 20) for call in calls))
                marks = [len(call.events) for call in calls]
                os.kill(host["pid"], signal.SIGKILL)
                killed = time.monotonic()
                errors = await asyncio.gather(
                    *(c.wait_for("error", 10, since=m) for c, m in zip(calls, marks, strict=True))
                )
                assert all(error["error"] == "synthesis_failed" for error in errors)
                seen_down = False
                while True:
                    ready = await readiness(http, url)
                    if ready["ready"]:
                        break
                    seen_down = seen_down or "host_down" in ready["reasons"]
                    assert time.monotonic() - killed < 10, ready
                    await asyncio.sleep(0.05)
                back_s = time.monotonic() - killed
                assert ready["model_host"]["restarts"] == 1
                assert ready["model_host"]["pid"] != host["pid"]
                assert seen_down or back_s < 0.2
                assert back_s <= 2.0, f"the host was back after {back_s:.2f} s"
                await asyncio.sleep(0.3)  # the workers' links reconnect (every 0.1 s)
                for call, mark in zip(calls, marks, strict=True):
                    one = [e for e in call.events[mark:] if e.get("type") == "error"]
                    assert len(one) == 1, one  # one error per call, not one per sentence
                    assert call.pc.connectionState == "connected"
                marks = [len(call.events) for call in calls]
                await asyncio.gather(
                    *(c.send({"type": "speak", "text": "Hello again."}) for c in calls)
                )
                await asyncio.gather(
                    *(
                        c.wait_for("speech_finished", 20, since=m)
                        for c, m in zip(calls, marks, strict=True)
                    )
                )
            finally:
                for call in calls:
                    await call.end()
                    await call.close()


def level(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(samples)))) if len(samples) else 0.0


def loudest_frame(samples: np.ndarray) -> float:
    frames = samples[: len(samples) // 960 * 960].reshape(-1, 960)
    return max((level(frame) for frame in frames), default=0.0)


async def test_denoise_runs_in_the_host_and_a_killed_host_leaves_the_calls_up_and_heard():
    """Denoise is hosted: four calls' audio comes back denoised; with the host killed each
    call gets one error, stays connected and hears its own voice passed through until the
    host is back, then denoised again."""
    restrict_host_addresses(["127.0.0.1"])
    rng = np.random.default_rng(7)
    noise = (0.05 * rng.standard_normal(48_000 * 40)).astype(np.float32)
    with two_workers(8, "--engines", "echo", "denoise", "--host-engines", "denoise") as server:
        url = server.url
        calls = [PeerCall(url, noise, engine="denoise") for _ in range(4)]
        async with aiohttp.ClientSession() as http:
            ready = await readiness(http, url)
            assert ready["ready"], ready
            host = ready["model_host"]
            async with http.get(url + "engines") as response:
                engines = {e["name"]: e for e in (await response.json())["engines"]}
            assert "denoise" in engines
            try:
                await asyncio.gather(*(call.connect() for call in calls))
                await asyncio.sleep(3)
                denoised = [level(call.received()[-48_000:]) for call in calls]
                assert all(0 < heard < 0.3 * 0.05 for heard in denoised), denoised
                marks = [len(call.events) for call in calls]
                os.kill(host["pid"], signal.SIGKILL)
                errors = await asyncio.gather(
                    *(c.wait_for("error", 10, since=m) for c, m in zip(calls, marks, strict=True))
                )
                assert all(error["error"] == "engine_failed" for error in errors)
                heard_at = [len(call.received()) for call in calls]
                await asyncio.sleep(0.6)  # down, or just back: the noise passes through meanwhile
                loudest = [
                    loudest_frame(c.received()[n:]) for c, n in zip(calls, heard_at, strict=True)
                ]
                assert all(heard > 0.6 * 0.05 for heard in loudest), loudest  # raw noise
                deadline = time.monotonic() + 10
                while not (await readiness(http, url))["ready"]:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.05)
                await asyncio.sleep(2)  # the states are opened again on the new host
                again = [level(call.received()[-48_000:]) for call in calls]
                assert all(0 < heard < 0.3 * 0.05 for heard in again), again
                for call, mark in zip(calls, marks, strict=True):
                    one = [e for e in call.events[mark:] if e.get("type") == "error"]
                    assert len(one) == 1, one
                    assert call.pc.connectionState == "connected"
            finally:
                for call in calls:
                    await call.end()
                    await call.close()
