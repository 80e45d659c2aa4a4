"""Server CPU of two checkouts under the same load at the same time: before against after.

    .venv/bin/python -m bench.paired BEFORE AFTER [--levels 2 12] [--seconds 10]
                                     [--rounds 3] [--engine echo] [--name paired]

This machine's speed drifts by up to 2x within minutes, more than most changes to the media
path save, so two runs one after the other compare the minutes more than the code. Here
both servers run at once, pinned to the same core (0), each with the same number of load
callers from this process (core 1), and the CPU each used over the same window is read from
/proc: a drift hits both alike and their ratio holds. Per level: each one's CPU (cores) and
the ratio after/before; per checkout, the marginal CPU per session-second between the
lowest and the highest level (what one more session costs, without the fixed cost). Each
round runs every level on fresh servers; the table shows medians over rounds. Together the
two servers must stay below one core (a saturated core is shared unevenly): keep the
levels low. ``BEFORE`` and ``AFTER`` are checkouts (``git worktree add``) whose
``python -m server`` this interpreter runs. Writes bench/results/paired.json (``--name``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.capacity import SETTLE_S, UNCAPPED_SESSIONS, Clips, open_callers, server_command
from bench.common import (
    free_port,
    print_table,
    process_cpu_seconds,
    spawned_server,
    write_results,
)
from media.rtc.compat import restrict_host_addresses


async def one_level(
    urls: list[str], pids: list[int], engine: str, sessions: int, seconds: float, clips: Clips
) -> list[float]:
    """The CPU (cores) each server used while ``sessions`` load callers called each."""
    async with aiohttp.ClientSession() as http:
        callers = []
        try:
            for url in urls:
                connected, failed = await open_callers(url, engine, sessions, 0, clips, http)
                callers += connected
                if failed:
                    raise RuntimeError(f"{failed} of {sessions} callers did not connect to {url}")
            await asyncio.sleep(SETTLE_S)
            before, began = [process_cpu_seconds(pid) for pid in pids], time.monotonic()
            await asyncio.sleep(seconds)
            elapsed = time.monotonic() - began
            used = [process_cpu_seconds(pid) - b for pid, b in zip(pids, before, strict=True)]
            return [seconds_used / elapsed for seconds_used in used]
        finally:
            await asyncio.gather(*(c.close(http) for c in callers), return_exceptions=True)


async def one_round(args: argparse.Namespace, clips: Clips) -> dict[int, list[float]]:
    cpu: dict[int, list[float]] = {}
    for level in args.levels:
        with contextlib.ExitStack() as stack:
            handles = []
            for tree in (args.before, args.after):
                port = free_port()
                command = server_command("ours", port, args.engine, UNCAPPED_SESSIONS)
                handles.append(stack.enter_context(spawned_server(command, port, 0, cwd=tree)))
            urls, pids = [h.url for h in handles], [h.pid for h in handles]
            cpu[level] = await one_level(urls, pids, args.engine, level, args.seconds, clips)
    return cpu


def summarise(levels: list[int], rounds: list[dict[int, list[float]]]) -> dict[str, Any]:
    rows = []
    for level in levels:
        before = statistics.median(r[level][0] for r in rounds)
        after = statistics.median(r[level][1] for r in rounds)
        ratios = [r[level][1] / r[level][0] for r in rounds if r[level][0] > 0]
        rows.append(
            {
                "sessions": level,
                "before_cpu": round(before, 3),
                "after_cpu": round(after, 3),
                "ratio_median": round(statistics.median(ratios), 3) if ratios else None,
                "ratios": [round(x, 3) for x in ratios],
            }
        )
    low, high = min(levels), max(levels)
    marginal: dict[str, Any] = {}
    if high > low:
        for index, side in enumerate(("before", "after")):
            slopes = [(r[high][index] - r[low][index]) / (high - low) * 1000 for r in rounds]
            marginal[side] = round(statistics.median(slopes), 2)
            marginal[f"{side}_rounds"] = [round(x, 2) for x in slopes]
    return {"rows": rows, "marginal_cpu_ms_per_session_s": marginal}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--levels", type=int, nargs="+", default=[2, 12])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engine", default="echo")
    parser.add_argument("--name", default="paired")
    args = parser.parse_args()
    for tree in (args.before, args.after):
        if not (tree / "server" / "__main__.py").exists():
            parser.error(f"{tree} is not a checkout of this server")
    if (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {1})
    restrict_host_addresses(["127.0.0.1"])
    clips = Clips.make()
    rounds = []
    for number in range(args.rounds):
        rounds.append(asyncio.run(one_round(args, clips)))
        print(f"round {number + 1}: " + ", ".join(
            f"{level}: {cpu[0]:.3f} / {cpu[1]:.3f}" for level, cpu in rounds[-1].items()
        ), flush=True)  # fmt: skip
    result = summarise(sorted(args.levels), rounds)
    print()
    print_table(result["rows"], ["sessions", "before_cpu", "after_cpu", "ratio_median"])
    print("marginal CPU per session-second (ms):", result["marginal_cpu_ms_per_session_s"])
    path = write_results(
        args.name,
        {
            "benchmark": "paired",
            "command": " ".join(["python -m bench.paired", *sys.argv[1:]]),
            "before": str(args.before.resolve()),
            "after": str(args.after.resolve()),
            "machine": platform.platform(),
            "engine": args.engine,
            "seconds": args.seconds,
            "rounds": [{str(k): v for k, v in r.items()} for r in rounds],
            **result,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
