"""Soak: hours of churning calls must leave the server as they found it.

    .venv/bin/python -m bench.soak [--seconds 1800] [--sessions 24] [--engine echo]
                                   [--min-life 5] [--max-life 20] [--sample-every 30]

One server process pinned to core 0, this client on core 1. ``--sessions`` calls are kept
up the whole time (default 24: 80 % of the 30 echo sessions one core holds, see
bench/results/capacity.json); each lives a random ``--min-life``..``--max-life`` seconds,
is ended with DELETE and replaced at once, so thousands of sessions open and close. Two
of the callers are probes that measure the round trip with chirp markers.

Every ``--sample-every`` seconds: the server's RSS, threads, open file descriptors, live
sessions, the audio queued in its sessions (``cosyrtc_queued_frames`` from ``/metrics``)
and the RTT of the last window. Drift is measured from the first sample after a warm-up
(the allocator and the engines' pools reach their working size first) to the end, and,
less at the mercy of where one sample falls, from the median of the first
``DRIFT_WINDOW_S`` after the warm-up to the median of the last: RSS rises and falls by
tens of MB between two full runs of the cyclic garbage collector (a closed connection is
freed only by one), so a single sample can land on a crest or in a trough.
Writes bench/results/soak.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import aiohttp
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from bench.capacity import server_command
from bench.common import free_port, print_table, process_rss_bytes, spawned_server, write_results
from bench.loadclient import EncodedClip, LoadCaller
from media.rtc.compat import restrict_host_addresses
from peer.speech import speech_with_pauses

PROBES = 2
WARM_UP_S = 60.0
DRIFT_WINDOW_S = 300.0
MB = 2**20


@dataclass
class Soak:
    """The calls kept up, and what happened to them."""

    url: str
    engine: str
    clips: tuple[EncodedClip, EncodedClip]  # (load, probe)
    life: tuple[float, float]
    rng: random.Random
    opened: int = 0
    failed: int = 0
    window_start: float = field(default_factory=time.monotonic)
    probes_rtts: list[float] = field(default_factory=list)  # seconds, since window_start

    async def keep_one_up(self, http: aiohttp.ClientSession, probe: bool, until: float) -> None:
        """One slot of the load: a call, then another when it ends, until ``until``."""
        while time.monotonic() < until:
            caller = LoadCaller(self.url, self.engine, self.clips[probe], probe=probe)
            try:
                await caller.connect(http)
                self.opened += 1
                life = self.rng.uniform(*self.life)
                await asyncio.sleep(min(life, max(0.0, until - time.monotonic())))
            except Exception:  # a refused or failed call is counted; the soak goes on
                self.failed += 1
                await asyncio.sleep(1.0)
            finally:
                await caller.close(http)
            if probe:
                self.probes_rtts.extend(caller.rtts_since(self.window_start))


def read_proc(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    threads = next(int(line.split()[1]) for line in status if line.startswith("Threads:"))
    return {
        "rss_mb": round(process_rss_bytes(pid) / MB, 1),
        "threads": threads,
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
    }


async def read_queues(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """Audio queued in all sessions, in frames, by queue ('input', 'output')."""
    async with http.get(urljoin(url, "metrics")) as response:
        text = await response.text()
    queued: dict[str, float] = {"input": 0.0, "output": 0.0}
    for family in text_string_to_metric_families(text):
        if family.name == "cosyrtc_queued_frames":
            for sample in family.samples:
                queued[sample.labels["queue"]] += sample.value
    return queued


async def read_live(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(urljoin(url, "sessions")) as response:
        return len((await response.json())["sessions"])


async def run(args: argparse.Namespace) -> dict[str, Any]:
    restrict_host_addresses(["127.0.0.1"])
    audio = speech_with_pauses().clean
    clips = (EncodedClip.encode(audio, False), EncodedClip.encode(audio, True))
    port = free_port()
    command = server_command("ours", port, args.engine, 4 * args.sessions)
    samples: list[dict[str, Any]] = []
    with spawned_server(command, port, core=0) as server:
        soak = Soak(server.url, args.engine, clips, (args.min_life, args.max_life),
                    random.Random(7))  # fmt: skip
        started = time.monotonic()
        until = started + args.seconds
        async with aiohttp.ClientSession() as http:
            slots = [
                asyncio.create_task(soak.keep_one_up(http, index < PROBES, until))
                for index in range(args.sessions)
            ]
            while time.monotonic() < until:
                await asyncio.sleep(min(args.sample_every, max(0.0, until - time.monotonic())))
                rtts = np.array(soak.probes_rtts) * 1000
                soak.probes_rtts.clear()
                queues = await read_queues(http, server.url)
                soak.window_start = time.monotonic()
                samples.append(
                    {
                        "t_s": round(time.monotonic() - started),
                        **read_proc(server.pid),
                        "live": await read_live(http, server.url),
                        **{f"queued_{k}": v for k, v in queues.items()},
                        "opened": soak.opened,
                        "failed": soak.failed,
                        "rtt_p50": float(np.percentile(rtts, 50)) if len(rtts) else None,
                        "rtt_p95": float(np.percentile(rtts, 95)) if len(rtts) else None,
                    }
                )
                print_table(samples[-1:], list(samples[-1]))
            await asyncio.gather(*slots)
            await asyncio.sleep(3.0)  # closes settle
            end = {**read_proc(server.pid), "live": await read_live(http, server.url)}
    return summarize(args, samples, end)


def summarize(
    args: argparse.Namespace, samples: list[dict[str, Any]], end: dict[str, Any]
) -> dict[str, Any]:
    warm = [s for s in samples if s["t_s"] >= WARM_UP_S] or samples
    first, last = warm[0], warm[-1]
    queued = [s["queued_input"] + s["queued_output"] for s in warm]
    half = len(queued) // 2
    return {
        "command": " ".join([sys.executable.rsplit("/", 1)[-1], "-m", "bench.soak", *sys.argv[1:]]),
        "seconds": args.seconds,
        "engine": args.engine,
        "sessions": args.sessions,
        "opened": samples[-1]["opened"] if samples else 0,
        "failed": samples[-1]["failed"] if samples else 0,
        "rss_mb_after_warm_up": first["rss_mb"],
        "rss_mb_last_sample": last["rss_mb"],
        "rss_drift_percent": round(100 * (last["rss_mb"] / first["rss_mb"] - 1), 2),
        **windowed_drift(warm),
        "threads_after_warm_up": first["threads"],
        "threads_last_sample": last["threads"],
        "fds_after_warm_up": first["fds"],
        "fds_last_sample": last["fds"],
        "queued_frames_mean_first_half": float(np.mean(queued[: half or 1])),
        "queued_frames_mean_second_half": float(np.mean(queued[half:] or [0])),
        "queued_frames_max": max(queued, default=0),
        "after_all_closed": end,
        "samples": samples,
    }  # fmt: skip


def windowed_drift(warm: list[dict[str, Any]]) -> dict[str, float]:
    """RSS medians of the first and last ``DRIFT_WINDOW_S`` after the warm-up, and their
    drift (the windows overlap on a run shorter than two of them)."""
    start, end = warm[0]["t_s"], warm[-1]["t_s"]
    early = [s["rss_mb"] for s in warm if s["t_s"] <= start + DRIFT_WINDOW_S]
    late = [s["rss_mb"] for s in warm if s["t_s"] >= end - DRIFT_WINDOW_S]
    first, last = float(np.median(early)), float(np.median(late))
    return {
        "rss_mb_median_first_window": first,
        "rss_mb_median_last_window": last,
        "rss_drift_percent_windowed": round(100 * (last / first - 1), 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=1800)
    parser.add_argument("--sessions", type=int, default=24)
    parser.add_argument("--engine", default="echo")
    parser.add_argument("--min-life", type=float, default=5.0)
    parser.add_argument("--max-life", type=float, default=20.0)
    parser.add_argument("--sample-every", type=float, default=30.0)
    args = parser.parse_args()
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, {1})  # the callers stay off the server's core
    result = asyncio.run(run(args))
    keys = [k for k in result if k not in ("samples", "after_all_closed", "command")]
    print_table([{k: result[k] for k in keys}], keys)
    print("after all closed:", result["after_all_closed"])
    print("wrote", write_results("soak", result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
