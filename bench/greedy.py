"""A caller cannot buy more than real time: other callers' round trip with and without one.

    .venv/bin/python -m bench.greedy [--engine denoise] [--speed 5] [--seconds 15]
                                     [--repeat 3] [--probes 3]

One server process (one worker) pinned to core 0, this client on core 1. ``--probes``
callers send speech with chirp markers and measure the round trip the whole time. Windows
of ``--seconds`` alternate: the probes alone, then the probes with a greedy caller that
sends ``--speed`` times real time (a fresh one per window, so each starts at the offer as a
real one would). Before the server dropped what is beyond real time, a 5x caller raised a
denoise caller's RTT p50 from 50 to 69.5 ms. Per window kind: the probes' RTT p50/p95; for
the greedy caller, the packets it sent and the server's count of those it dropped undecoded
(``over_real_time`` in the session's stats while it ran; ``cosyrtc_packets_over_real_time``
in the metrics, the window's whole increase, read once the session has closed). Alone and
with the greedy caller alternate within one run, so the machine's drift cancels. Writes
bench/results/greedy.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from typing import Any
from urllib.parse import urljoin

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from bench.capacity import Clips, server_command
from bench.common import free_port, percentile, print_table, spawned_server, write_results
from bench.loadclient import LoadCaller
from media.rtc.compat import restrict_host_addresses

SETTLE_S = 2.0  # after a caller joins or leaves, before a window's RTTs count
METRIC = "cosyrtc_packets_over_real_time"
FOLD_S = 1.5  # a closed session's counts join the metrics' totals within a second


def probe_rtts(probes: list[LoadCaller], start: float, end: float) -> list[float]:
    """The probes' RTTs (ms) of markers that came back between ``start`` and ``end``.

    Markers are found in the whole recording, which takes a while: done once the windows
    are over, so the search never stalls the callers' sending (a stalled sender catches up
    in a burst, and the server rightly drops what goes beyond real time plus 0.5 s).
    """
    rtts: list[float] = []
    for probe in probes:
        since_start, since_end = probe.rtts_since(start), probe.rtts_since(end)
        rtts += [1000 * r for r in since_start[: len(since_start) - len(since_end)]]
    return rtts


async def metric_total(http: aiohttp.ClientSession, url: str) -> float:
    async with http.get(urljoin(url, "metrics")) as response:
        text = await response.text()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == METRIC
        for sample in family.samples
        if sample.name.endswith("_total")
    )


async def over_real_time(http: aiohttp.ClientSession, url: str, caller: LoadCaller) -> int:
    """What the server dropped of ``caller``'s packets as beyond real time, so far."""
    assert caller.answer is not None and caller.answer.session_id is not None
    async with http.get(urljoin(url, f"sessions/{caller.answer.session_id}")) as response:
        return int((await response.json())["receive"]["over_real_time"])


async def greedy_window(
    url: str, args: argparse.Namespace, clips: Clips, http: aiohttp.ClientSession
) -> dict[str, Any]:
    """One window with a greedy caller; what it sent and what the server made of it."""
    caller = LoadCaller(url, args.engine, clips.load, probe=False, speed=args.speed)
    metric_before = await metric_total(http, url)
    await caller.connect(http)
    start = time.monotonic()
    try:
        await asyncio.sleep(args.seconds)
        end = time.monotonic()
        assert caller.answer is not None and caller.answer.session_id is not None
        async with http.get(urljoin(url, f"sessions/{caller.answer.session_id}")) as response:
            receive = (await response.json())["receive"]
    finally:
        await caller.close(http)
    await asyncio.sleep(FOLD_S)
    metric_after = await metric_total(http, url)
    return {
        "window": (start, end),
        "packets_sent": caller.track.timeline.total_samples // 960,
        "packets_received": receive["packets"],
        "dropped_over_real_time": receive["over_real_time"],
        "metric_over_real_time": metric_after - metric_before,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    restrict_host_addresses(["127.0.0.1"])
    clips = Clips.make()
    port = free_port()
    rtts: dict[str, list[float]] = {"alone": [], "with greedy": []}
    greedy: list[dict[str, Any]] = []
    with spawned_server(server_command("ours", port, args.engine, 16), port, core=0) as server:
        async with aiohttp.ClientSession() as http:
            probes = [
                LoadCaller(server.url, args.engine, clips.probe, probe=True)
                for _ in range(args.probes)
            ]
            for probe in probes:
                await probe.connect(http)
            windows: dict[str, list[tuple[float, float]]] = {"alone": [], "with greedy": []}
            try:
                for _ in range(args.repeat):
                    start = time.monotonic()
                    await asyncio.sleep(args.seconds)
                    windows["alone"].append((start, time.monotonic()))
                    greedy.append(await greedy_window(server.url, args, clips, http))
                    windows["with greedy"].append(greedy[-1].pop("window"))
                probes_dropped = [await over_real_time(http, server.url, p) for p in probes]
            finally:
                for probe in probes:
                    await probe.close(http)
    for name, spans in windows.items():
        for start, end in spans:
            rtts[name] += probe_rtts(probes, start + SETTLE_S, end)
    rows = [
        {
            "window": name,
            "rtt_ms_p50": percentile(values, 50),
            "rtt_ms_p95": percentile(values, 95),
            "rtt_samples": len(values),
        }
        for name, values in rtts.items()
    ]
    alone, crowded = (percentile(rtts[name], 50) for name in ("alone", "with greedy"))
    added = round(crowded - alone, 2) if alone is not None and crowded is not None else None
    return {
        "benchmark": "greedy",
        "command": " ".join(["python", "-m", "bench.greedy", *sys.argv[1:]]),
        "engine": args.engine,
        "speed": args.speed,
        "rows": rows,
        "rtt_p50_added_ms": added,
        "within_5_ms": added is not None and added <= 5.0,
        "greedy_callers": greedy,
        "probes_dropped_over_real_time": probes_dropped,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="denoise")
    parser.add_argument("--speed", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--probes", type=int, default=3)
    args = parser.parse_args()
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, {1})
    result = asyncio.run(run(args))
    print_table(result["rows"], list(result["rows"][0]))
    print_table(result["greedy_callers"], list(result["greedy_callers"][0]))
    print("RTT p50 added by the greedy caller (ms):", result["rtt_p50_added_ms"])
    print("probes' packets dropped as beyond real time:", result["probes_dropped_over_real_time"])
    print("wrote", write_results("greedy", result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
