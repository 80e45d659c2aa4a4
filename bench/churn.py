"""Churn: server memory per live session, and what many opened-and-closed sessions leave behind.

    .venv/bin/python -m bench.churn [--engines echo denoise] [--echo-sessions 1000]
                                    [--echo-wave 15] [--denoise-sessions 60]
                                    [--denoise-wave 3] [--settle 5]

One server process per engine, pinned to core 0 (this client on core 1), without a
per-address limit (every caller is 127.0.0.1). For each engine:

1. Ramp: hold W, 2W and 3W sessions (W: the engine's wave size) and sample the server's RSS
   at each; the slope is RSS per live session. The first wave's step from 0 is left out of
   the slope: it also pays one-off costs (allocator arenas, first use of code paths; for
   denoise the warm pool refilling). The ramp warms the server up, so the allocator has
   reached the high-water mark the churn will need before the baseline is taken.
2. Close them all, settle, sample the baseline RSS and open file descriptors.
3. Churn: open and close sessions in waves of W at once until the total reaches N. Every
   session connects and gets audio back before it is closed; one that does not is counted
   as failed: a session that never connects never ran its media path.
4. Settle, sample again. Drift is the end RSS against the baseline; the leak rate is the
   slope of RSS against sessions opened, sampled between waves over the churn, and the
   peak is the highest of those samples (closed sessions that wait for the cyclic garbage
   collector show up as a saw-tooth between baseline and peak).

For denoise the engine's own figure is reported too: native heap per DeepFilterNet state
(``per_session_bytes`` in ``GET /engines``), which RSS alone cannot attribute.
Writes bench/results/churn.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import aiohttp
import numpy as np

from bench.capacity import UNCAPPED_SESSIONS, server_command
from bench.common import (
    ROOT,
    free_port,
    print_table,
    process_rss_bytes,
    spawned_server,
    write_results,
)
from bench.loadclient import EncodedClip, LoadCaller
from media.rtc.compat import restrict_host_addresses
from peer.speech import speech_with_pauses

AUDIO_PACKETS = 25  # half a second of echoed audio proves the session carried media
AUDIO_TIMEOUT_S = 10.0
HOLD_S = 2.0  # time a ramp level runs before its sample: buffers reach their working size
RAMP_WAVES = 3
TRACE_EVERY_WAVES = 5
DRIFT_TARGET = 0.05
MB = 2**20


@dataclass(frozen=True)
class Plan:
    """How hard to churn one engine: total sessions and how many at once."""

    engine: str
    sessions: int
    wave: int


def open_fds(pid: int) -> int:
    """File descriptors the server holds: each session's UDP sockets show up here."""
    return len(os.listdir(f"/proc/{pid}/fd"))


async def wave(
    url: str, engine: str, count: int, clip: EncodedClip, http: aiohttp.ClientSession
) -> tuple[list[LoadCaller], int]:
    """Connect ``count`` callers at once and wait for audio back from each.

    Returns the callers (all still open) and how many of them failed to connect or to
    receive audio.
    """
    callers = [LoadCaller(url, engine, clip, probe=False) for _ in range(count)]
    results = await asyncio.gather(*(c.connect(http) for c in callers), return_exceptions=True)
    connected = [c for c, r in zip(callers, results, strict=True) if r is None]
    deadline = time.monotonic() + AUDIO_TIMEOUT_S
    while time.monotonic() < deadline and any(
        c.packets_received < AUDIO_PACKETS for c in connected
    ):
        await asyncio.sleep(0.1)
    with_audio = sum(1 for c in connected if c.packets_received >= AUDIO_PACKETS)
    return callers, count - with_audio


async def close_all(callers: list[LoadCaller], http: aiohttp.ClientSession) -> None:
    await asyncio.gather(*(c.close(http) for c in callers), return_exceptions=True)


async def engine_bytes(http: aiohttp.ClientSession, url: str, engine: str) -> int | None:
    """The engine's own per-session memory figure, when it reports one."""
    async with http.get(urljoin(url, "engines")) as response:
        document = await response.json()
    described: dict[str, Any] = next((e for e in document["engines"] if e["name"] == engine), {})
    return described.get("per_session_bytes")


def slope(xs: list[float], ys: list[float]) -> float | None:
    return float(np.polyfit(xs, ys, 1)[0]) if len(set(xs)) >= 2 else None


@dataclass
class Tally:
    """Sessions opened so far and how many of them never carried audio."""

    opened: int = 0
    failed: int = 0

    def add(self, count: int, lost: int) -> None:
        self.opened += count
        self.failed += lost


async def ramp_up(
    url: str, plan: Plan, clip: EncodedClip, http: aiohttp.ClientSession, pid: int, tally: Tally
) -> list[tuple[int, int]]:
    """Hold one more wave at a time; (live sessions, RSS) after each, then close them all."""
    held: list[LoadCaller] = []
    ramp = [(0, process_rss_bytes(pid))]
    try:
        for _ in range(RAMP_WAVES):
            callers, lost = await wave(url, plan.engine, plan.wave, clip, http)
            held += callers
            tally.add(len(callers), lost)
            await asyncio.sleep(HOLD_S)
            ramp.append((tally.opened - tally.failed, process_rss_bytes(pid)))
    finally:
        await close_all(held, http)
    return ramp


async def churn_to(
    url: str, plan: Plan, clip: EncodedClip, http: aiohttp.ClientSession, pid: int, tally: Tally
) -> list[tuple[int, int]]:
    """Open and close waves until ``plan.sessions`` have opened; (opened, RSS) every few."""
    trace = []
    waves = 0
    while tally.opened < plan.sessions:
        count = min(plan.wave, plan.sessions - tally.opened)
        callers, lost = await wave(url, plan.engine, count, clip, http)
        await close_all(callers, http)
        tally.add(count, lost)
        waves += 1
        if waves % TRACE_EVERY_WAVES == 0:
            trace.append((tally.opened, process_rss_bytes(pid)))
            print(f"  {plan.engine}: {tally.opened} sessions, RSS {trace[-1][1] / MB:.1f} MB")
    return trace


async def churn(plan: Plan, clip: EncodedClip, settle: float) -> dict[str, Any]:
    port = free_port()
    command = server_command("ours", port, plan.engine, UNCAPPED_SESSIONS)
    tally = Tally()
    with spawned_server(command, port, core=0) as handle:
        pid = handle.pid
        async with aiohttp.ClientSession() as http:
            ramp = await ramp_up(handle.url, plan, clip, http, pid, tally)
            await asyncio.sleep(settle)
            rss_base, fds_base = process_rss_bytes(pid), open_fds(pid)
            trace = [(tally.opened, rss_base)]
            trace += await churn_to(handle.url, plan, clip, http, pid, tally)
            await asyncio.sleep(settle)
            rss_end, fds_end = process_rss_bytes(pid), open_fds(pid)
            trace.append((tally.opened, rss_end))
            reported = await engine_bytes(http, handle.url, plan.engine)
    per_session = slope([float(n) for n, _ in ramp[1:]], [float(r) for _, r in ramp[1:]])
    leak = slope([float(n) for n, _ in trace], [float(r) for _, r in trace])
    drift = (rss_end - rss_base) / rss_base
    return {
        "engine": plan.engine,
        "sessions": tally.opened,
        "wave": plan.wave,
        "failed": tally.failed,
        "rss_start_mb": round(ramp[0][1] / MB, 1),
        "rss_per_session_mb": round(per_session / MB, 3) if per_session is not None else None,
        "engine_per_session_mb": round(reported / MB, 2) if reported is not None else None,
        "rss_base_mb": round(rss_base / MB, 1),
        "rss_end_mb": round(rss_end / MB, 1),
        "rss_peak_mb": round(max(r for _, r in trace) / MB, 1),
        "drift_pct": round(drift * 100, 2),
        "leak_kb_per_session": round(leak / 1024, 2) if leak is not None else None,
        "fds_base": fds_base,
        "fds_end": fds_end,
        "within_target": abs(drift) <= DRIFT_TARGET and tally.failed == 0,
        "ramp": [{"open": n, "rss_mb": round(r / MB, 1)} for n, r in ramp],
        "trace": [{"opened": n, "rss_mb": round(r / MB, 1)} for n, r in trace],
    }


COLUMNS = [
    "engine", "sessions", "wave", "failed", "rss_per_session_mb", "engine_per_session_mb",
    "rss_start_mb", "rss_base_mb", "rss_peak_mb", "rss_end_mb", "drift_pct", "leak_kb_per_session",
    "fds_base", "fds_end", "within_target",
]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", default=["echo", "denoise"])
    parser.add_argument("--echo-sessions", type=int, default=1000)
    parser.add_argument(
        "--echo-wave", type=int, default=15, help="the ramp holds up to 3 waves: 45 sessions"
    )
    parser.add_argument("--denoise-sessions", type=int, default=60)
    parser.add_argument(
        "--denoise-wave", type=int, default=3, help="a few: each costs ~20 %% of a core"
    )
    parser.add_argument("--settle", type=float, default=5.0, help="seconds before a sample")
    args = parser.parse_args()
    if (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {1})
    restrict_host_addresses(["127.0.0.1"])
    plans = {
        "echo": Plan("echo", args.echo_sessions, args.echo_wave),
        "denoise": Plan("denoise", args.denoise_sessions, args.denoise_wave),
    }
    clip = EncodedClip.encode(speech_with_pauses().clean, with_markers=False)
    rows = [asyncio.run(churn(plans[engine], clip, args.settle)) for engine in args.engines]
    print()
    print_table(rows, COLUMNS)
    path: Path = write_results(
        "churn",
        {
            "benchmark": "churn",
            "command": " ".join(["python -m bench.churn", *sys.argv[1:]]),
            "machine": platform.platform(),
            "cores": os.cpu_count(),
            "settle_s": args.settle,
            "drift_target_pct": DRIFT_TARGET * 100,
            "rows": rows,
        },
    )
    print(f"\nwrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
