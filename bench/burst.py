"""A burst of callers: many offers at the same moment, each timed to its answer.

    python -m bench.burst [--offers 40] [--engines echo denoise denoise-libdf] [--repeat 3]
                          [-- SERVER FLAGS]

One server per engine (default workers, so the front places the offers on its workers),
``--offers`` real offers posted at once. Tried before: echo answered all 40 within 0.5 s,
the libDF denoise engine answered the median after 4.1 s and the last after 8.3 s (each
session waits for a native state that takes ~0.5 s to build; the warm pool holds 2). The
batched ``denoise`` engine opens a session by taking a slot of its batch arrays. Prints
answer-time p50/max per engine; writes bench/results/burst.json.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys

import aiohttp

from bench.common import print_table, server_process, write_results
from bench.overload import real_offers, timed_offer
from media.rtc.compat import restrict_host_addresses


async def burst(url: str, engine: str, offers: list[str]) -> list[float]:
    """Every offer at once; the milliseconds each took to be answered (all must be 200)."""
    async with aiohttp.ClientSession() as http:
        outcomes = await asyncio.gather(*(timed_offer(http, url, sdp, engine) for sdp in offers))
        for outcome in outcomes:
            if outcome.session_id is not None:
                async with http.delete(f"{url}sessions/{outcome.session_id}"):
                    pass
    refused = [o.status for o in outcomes if o.status != 200]
    if refused:
        raise RuntimeError(f"{len(refused)} offers refused: {sorted(set(refused))}")
    return [o.response_ms for o in outcomes]


async def run(url: str, engine: str, count: int, repeat: int) -> list[float]:
    times: list[float] = []
    for _ in range(repeat):
        offers = await real_offers(count)
        times += await burst(url, engine, offers)
        await asyncio.sleep(2.0)  # the sessions' sockets closed
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--offers", type=int, default=40)
    parser.add_argument("--engines", nargs="+", default=["echo", "denoise", "denoise-libdf"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("server_flags", nargs="*", help="extra serve flags, after --")
    args = parser.parse_args()
    restrict_host_addresses(["127.0.0.1"])
    rows = []
    for engine in args.engines:
        flags = ["--engine", engine, "--max-sessions", str(2 * args.offers), *args.server_flags]
        with server_process(flags, core=None) as url:
            times = asyncio.run(run(url, engine, args.offers, args.repeat))
        rows.append(
            {
                "engine": engine,
                "offers": args.offers,
                "bursts": args.repeat,
                "answer_ms_p50": round(statistics.median(times), 1),
                "answer_ms_max": round(max(times), 1),
            }
        )
        print_table(rows[-1:], list(rows[0]))
    print()
    print_table(rows, list(rows[0]))
    path = write_results("burst", {"rows": rows})
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
