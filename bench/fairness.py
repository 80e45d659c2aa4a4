"""Speak engines share a worker fairly: first audio for 8 callers at once vs 1 alone.

    python -m bench.fairness [--engine piper] [--callers 8] [--repeat 3] [--name NAME]
                             [-- SERVER FLAGS]

One server process (``--workers 1``; its engine threads may use every core unless
``--pin`` puts it on core 0 and this client on core 1). Each round
opens the callers' speak sessions, then every caller sends one sentence at the same moment;
a caller's first audio is the server's own figure (``first_audio_ms``: text received to its
first frame leaving on the track, from ``GET /sessions/{id}``). A single caller alone is
measured in the same run, between the rounds, so the machine's drift cancels. Prints p50
and max over all rounds and their ratio to the single caller's p50; writes
bench/results/fairness_<engine>.json (or NAME.json).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys

import aiohttp
import numpy as np

from bench.common import print_table, server_process, write_results
from peer.call import PeerCall

SENTENCE = "The train to the city leaves at half past nine, from platform four."
SILENCE = np.zeros(48_000 * 120, np.float32)


async def first_audio(url: str, engine: str, callers: int) -> list[dict[str, float]]:
    """Open ``callers`` sessions, send one sentence on each at once; for each, its first
    audio (ms), and the pre-buffer it waited for and the real-time factor it measured."""
    calls = [PeerCall(url, SILENCE, engine=engine) for _ in range(callers)]
    try:
        await asyncio.gather(*(call.connect() for call in calls))
        await asyncio.sleep(0.5)  # connections settled
        await asyncio.gather(*(call.send({"type": "speak", "text": SENTENCE}) for call in calls))
        await asyncio.gather(*(call.wait_for("speech_started", 60) for call in calls))
        async with aiohttp.ClientSession() as http:
            values = []
            for call in calls:
                async with http.get(f"{call.url}sessions/{call.session_id}") as response:
                    speak = (await response.json())["speak"]
                values.append(
                    {
                        "first_audio_ms": speak["first_audio_ms"][0],
                        "prebuffered_ms": speak["prebuffered_ms"],
                        "real_time_factor": round(speak["real_time_factor"], 3),
                    }
                )
        await asyncio.gather(*(call.wait_for("speech_finished", 60) for call in calls))
        return values
    finally:
        for call in calls:
            await call.end()
            await call.close()


async def run(
    url: str, engine: str, callers: int, repeat: int
) -> dict[str, list[dict[str, float]]]:
    alone: list[dict[str, float]] = []
    crowd: list[dict[str, float]] = []
    await first_audio(url, engine, 1)  # warm-up: first sessions allocate
    for _ in range(repeat):
        alone += await first_audio(url, engine, 1)
        crowd += await first_audio(url, engine, callers)
    return {"alone": alone, "crowd": crowd}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="piper")
    parser.add_argument("--callers", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--name", help="results file: bench/results/NAME.json")
    parser.add_argument("--pin", action="store_true", help="server on core 0, client on 1")
    parser.add_argument("server_flags", nargs="*", help="extra serve flags, after --")
    args = parser.parse_args()
    if args.pin and (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {1})
    flags = ["--workers", "1", "--engine", args.engine, *args.server_flags]
    with server_process(flags, core=0 if args.pin else None) as url:
        results = asyncio.run(run(url, args.engine, args.callers, args.repeat))
    first = {k: [v["first_audio_ms"] for v in results[k]] for k in ("alone", "crowd")}
    alone_p50 = statistics.median(first["alone"])
    rows = []
    for name, key in (("1 caller", "alone"), (f"{args.callers} callers", "crowd")):
        values = first[key]
        p50, worst = statistics.median(values), max(values)
        rows.append(
            {
                "callers": name,
                "n": len(values),
                "first_audio_ms_p50": round(p50, 1),
                "first_audio_ms_max": round(worst, 1),
                "p50_vs_alone": round(p50 / alone_p50, 2),
                "max_vs_alone": round(worst / alone_p50, 2),
                "prebuffered_ms_p50": statistics.median(v["prebuffered_ms"] for v in results[key]),
            }
        )
    print_table(rows, list(rows[0]))
    path = write_results(
        args.name or f"fairness_{args.engine}",
        {"engine": args.engine, "callers": args.callers, "rows": rows, "raw": results},
    )
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
