"""What placing an offer through another node adds to its answer time.

    python -m bench.placement [--offers 200] [--repeat 3] [--pin]

A real Redis and two nodes (bench/cluster.py): ``n2`` is drained, so whatever it receives
it places on ``n3``, relaying the offer there and the answer back; ``n3`` answers its own
offers after the same Redis reservation. A single server without Redis shows what the
reservation itself costs. Offers are real aiortc offers made beforehand; each path gets
one offer in turn, in a shuffled order, so drift in the machine's speed hits all three
alike. The clock runs from the POST to the answer's headers; every session is deleted
straight away. Prints p50/p95 per path and the added time through another node; writes
bench/results/placement.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
from typing import Any

import aiohttp

from bench.cluster import RedisServer, cluster_of
from bench.common import free_port, percentile, print_table, server_process, write_results
from bench.overload import real_offers, timed_offer
from media.rtc.compat import restrict_host_addresses

ENGINE = "echo"
WARMUP_OFFERS = 10
NODE_FLAGS = ("--rate-limit", "0", "--max-client-sessions", "0")


async def measure(paths: dict[str, str], offers: int) -> dict[str, list[float]]:
    """Answer times (ms) per path, one offer to each path in turn, shuffled each round."""
    times: dict[str, list[float]] = {name: [] for name in paths}
    sdps = await real_offers(offers * len(paths))
    names = list(paths)
    async with aiohttp.ClientSession() as http:
        for round_index in range(offers):
            random.shuffle(names)
            for slot, name in enumerate(names):
                sdp = sdps[round_index * len(names) + slot]
                outcome = await timed_offer(http, paths[name], sdp, ENGINE)
                if outcome.session_id is None:
                    raise RuntimeError(f"{name}: offer refused with {outcome.status}")
                async with http.delete(f"{paths[name]}sessions/{outcome.session_id}"):
                    pass
                times[name].append(outcome.response_ms)
    return times


def summary(times: dict[str, list[float]]) -> list[dict[str, Any]]:
    rows = []
    for name, values in times.items():
        rows.append(
            {
                "path": name,
                "offers": len(values),
                "p50_ms": round(statistics.median(values), 2),
                "p95_ms": round(percentile(values, 95) or 0.0, 2),
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--offers", type=int, default=200, help="per path and repeat")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pin", action="store_true", help="servers on core 0, client on 1")
    args = parser.parse_args()
    core = 0 if args.pin and (os.cpu_count() or 1) >= 2 else None
    if core is not None:
        os.sched_setaffinity(0, {1})
    restrict_host_addresses(["127.0.0.1"])
    redis = RedisServer(free_port())
    redis.start()
    repeats: list[dict[str, Any]] = []
    all_times: dict[str, list[float]] = {}
    try:
        single_flags = ["--workers", "1", "--engine", ENGINE, "--engines", ENGINE, *NODE_FLAGS]
        with (
            cluster_of(redis, [64, 64], *NODE_FLAGS, core=core) as (entry, owner),
            server_process(single_flags, core=core) as single_url,
        ):
            asyncio.run(drain(entry.url))
            paths = {
                "single node, no Redis": single_url,
                "cluster, to the owner": owner.url,
                "cluster, via another node": entry.url,
            }
            asyncio.run(measure(paths, WARMUP_OFFERS))
            for _ in range(args.repeat):
                times = asyncio.run(measure(paths, args.offers))
                rows = summary(times)
                print_table(rows, list(rows[0]))
                repeats.append({"rows": rows, **added(times)})
                for name, values in times.items():
                    all_times.setdefault(name, []).extend(values)
    finally:
        redis.kill()
    rows = summary(all_times)
    overall = added(all_times)
    print()
    print_table(rows, list(rows[0]))
    print(
        f"via another node adds p50 {overall['added_p50_ms']} ms, p95 {overall['added_p95_ms']} ms"
        f" (per repeat p95: {[r['added_p95_ms'] for r in repeats]})"
    )
    path = write_results("placement", {"rows": rows, **overall, "repeats": repeats})
    print(f"wrote {path}", file=sys.stderr)
    return 0


def added(times: dict[str, list[float]]) -> dict[str, float]:
    """What the relay through another node adds over the owner answering directly."""
    via, direct = times["cluster, via another node"], times["cluster, to the owner"]
    return {
        "added_p50_ms": round(statistics.median(via) - statistics.median(direct), 2),
        "added_p95_ms": round((percentile(via, 95) or 0.0) - (percentile(direct, 95) or 0.0), 2),
    }


async def drain(url: str) -> None:
    """The entry node takes no sessions itself: every offer it gets is placed elsewhere."""
    async with aiohttp.ClientSession() as http, http.post(url + "admin/drain") as response:
        if response.status != 202:
            raise RuntimeError(f"drain refused: {response.status}")


if __name__ == "__main__":
    sys.exit(main())
