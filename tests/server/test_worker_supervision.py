"""A worker that dies is replaced; the others' calls and the server's readiness go on.

Tried before: kill -9 one of two workers, and ``/readyz`` answered 503 ``worker_down`` from
then on, so a load balancer dropped the whole node, and half its capacity was gone until
someone restarted the server.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import aiohttp
import numpy as np

from media.rtc.compat import restrict_host_addresses
from peer.call import PeerCall
from tests.server.test_engine_faults import longest_silence_frames
from tests.server.test_workers import two_workers

REPLACED_WITHIN_S = 2.0
MAX_GAP_FRAMES = 2  # 40 ms: what a healthy call may lose to a busy machine


def worker_pid(front_pid: int, index: int) -> int:
    """The process id of worker ``index`` among the front's children (from /proc)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == front_pid and b"worker" in argv and str(index).encode() in argv:
            position = argv.index(b"--index")
            if argv[position + 1] == str(index).encode():
                return int(entry.name)
    raise LookupError(f"no worker {index} under {front_pid}")


async def readiness(http: aiohttp.ClientSession, url: str) -> tuple[int, dict]:
    async with http.get(url + "readyz") as response:
        return response.status, await response.json()


async def test_a_killed_worker_is_replaced_at_once_and_the_others_calls_go_on():
    restrict_host_addresses(["127.0.0.1"])
    tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(20 * 48_000) / 48_000)).astype(np.float32)
    with two_workers(8, "--spare-workers", "1") as front:
        calls = [PeerCall(front.url, tone, engine="echo") for _ in range(2)]
        async with aiohttp.ClientSession() as http:
            try:
                for call in calls:
                    await call.connect()
                    await asyncio.sleep(0.6)  # the front reads the workers' load
                by_worker = {call.session_id.split("-", 1)[0]: call for call in calls}  # type: ignore[union-attr]
                assert set(by_worker) == {"w0", "w1"}
                victim, survivor = by_worker["w0"], by_worker["w1"]
                await asyncio.sleep(1.0)
                os.kill(worker_pid(front.pid, 0), signal.SIGKILL)
                killed = time.monotonic()
                statuses, replaced_after = [], None
                while time.monotonic() - killed < 4.0:
                    status, body = await readiness(http, front.url)
                    statuses.append(status)
                    back = body.get("worker_restarts") == 1 and body["workers_serving"] == 2
                    if replaced_after is None and back:
                        replaced_after = time.monotonic() - killed
                    await asyncio.sleep(0.05)
                async with http.get(front.url + f"sessions/{victim.session_id}") as gone:
                    assert gone.status == 404
                async with http.get(front.url + "metrics") as metrics:
                    text = await metrics.text()
                    assert 'cosyrtc_worker_restarts_total{worker="front"} 1.0' in text
                # A new session can go to the replacement.
                async with PeerCall(front.url, tone[:48_000], engine="echo") as extra:
                    assert extra.session_id is not None
                await asyncio.sleep(1.0)
            finally:
                for call in calls:
                    await call.close()
    assert set(statuses) == {200}, statuses  # ready throughout
    assert replaced_after is not None and replaced_after <= REPLACED_WITHIN_S
    longest = longest_silence_frames(survivor.received())
    assert longest <= MAX_GAP_FRAMES, f"the survivor's call had a {longest}-frame gap"
