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
