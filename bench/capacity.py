"""Capacity: sessions per server core, ours against a stock aiortc echo server, in one run.

    .venv/bin/python -m bench.capacity [--levels 10 20 40 60 80] [--engines echo denoise]
                                       [--servers ours stock] [--seconds 10]

Each server runs pinned to core 0 and this client to core 1, so figures are per server
core. At each level the client holds that many calls: load callers send pre-encoded speech
and only count what comes back; three probe callers per level send chirp markers and
decode, giving RTT. Per level: RTT p50/p95, packets lost, server CPU and RSS, client CPU.
A level is held when RTT p95 <= 100 ms, loss < 1 % and RTT does not grow during the level.
Writes bench/results/capacity.json and bench/results/capacity.png.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
from typing import Any

import aiohttp

from bench.common import (
    ROOT,
    free_port,
    percentile,
    print_table,
    process_cpu_seconds,
    process_rss_bytes,
    spawned_server,
    write_results,
)
from bench.loadclient import EncodedClip, LoadCaller
from signaling.ice import restrict_host_addresses
from tests.speech import speech_with_pauses

PROBES = 3
SETTLE_S = 3.0
CONNECT_BATCH = 5
HELD_RTT_P95_MS = 100.0
HELD_LOSS = 0.01
GROWTH_MS = 20.0  # second-half p95 above first-half p95 by more than this: latency grows


def server_command(kind: str, port: int, engine: str) -> list[str]:
    if kind == "stock":
        return [sys.executable, "-m", "bench.stock_server", "--port", str(port)]
    return [
        sys.executable, "-m", "server", "serve", "--host", "127.0.0.1", "--port", str(port),
        "--ice-host", "127.0.0.1", "--engine", engine, "--max-sessions", "1000",
        "--engine-threads", "1", "--workers", "1",
    ]  # fmt: skip


async def run_level(
    url: str,
    engine: str,
    callers: list[LoadCaller],
    level: int,
    load_clip: EncodedClip,
    probe_clip: EncodedClip,
    http: aiohttp.ClientSession,
    pid: int,
    seconds: float,
) -> dict[str, Any]:
    wanted_load = level - PROBES
    new = [
        LoadCaller(url, engine, load_clip, probe=False)
        for _ in range(wanted_load - len([c for c in callers if not c.probe]))
    ]
    new += [LoadCaller(url, engine, probe_clip, probe=True) for _ in range(PROBES)]
    failed = 0
    for start in range(0, len(new), CONNECT_BATCH):
        batch = new[start : start + CONNECT_BATCH]
        results = await asyncio.gather(*(c.connect(http) for c in batch), return_exceptions=True)
        for caller, result in zip(batch, results, strict=True):
            if isinstance(result, BaseException):
                failed += 1
                await caller.close(None)
            else:
                callers.append(caller)
    await asyncio.sleep(SETTLE_S)
    probes = [c for c in callers if c.probe][-PROBES:]
    loads = [c for c in callers if not c.probe]
    packets_before = sum(c.packets_received for c in loads)
    cpu_before, client_before, t0 = process_cpu_seconds(pid), time.process_time(), time.monotonic()
    await asyncio.sleep(seconds)
    elapsed = time.monotonic() - t0
    server_cpu = (process_cpu_seconds(pid) - cpu_before) / elapsed
    client_cpu = (time.process_time() - client_before) / elapsed
    packets = sum(c.packets_received for c in loads) - packets_before
    expected = len(loads) * elapsed * 50
    first_half: list[float] = []
    second_half: list[float] = []
    for probe in probes:
        whole = [r * 1000 for r in probe.rtts_since(t0)]
        late = [r * 1000 for r in probe.rtts_since(t0 + elapsed / 2)]
        first_half += whole[: len(whole) - len(late)]
        second_half += late
    rtts = first_half + second_half
    for probe in probes:  # probes are replaced each level: their recordings grow
        callers.remove(probe)
        await probe.close(http)
    return {
        "sessions": len(loads) + len(probes),
        "connect_failures": failed,
        "rtt_ms_p50": percentile(rtts, 50),
        "rtt_ms_p95": percentile(rtts, 95),
        "rtt_samples": len(rtts),
        "rtt_growth_ms": (
            round(percentile(second_half, 95) - percentile(first_half, 95), 1)
            if first_half and second_half
            else None
        ),
        "loss": round(max(0.0, 1 - packets / expected), 4) if expected else None,
        "server_cpu": round(server_cpu, 3),
        "server_rss_mb": round(process_rss_bytes(pid) / 2**20, 1),
        "client_cpu": round(client_cpu, 3),
    }


def held(row: dict[str, Any]) -> bool:
    return (
        row["rtt_ms_p95"] is not None
        and row["rtt_ms_p95"] <= HELD_RTT_P95_MS
        and (row["loss"] or 0) < HELD_LOSS
        and (row["rtt_growth_ms"] or 0) <= GROWTH_MS
        and row["connect_failures"] == 0
    )


async def run_server(kind: str, engine: str, levels: list[int], seconds: float) -> list[dict]:
    speech = speech_with_pauses().clean
    load_clip = EncodedClip.encode(speech, with_markers=False)
    probe_clip = EncodedClip.encode(speech, with_markers=True)
    port = free_port()
    rows: list[dict] = []
    with spawned_server(server_command(kind, port, engine), port, core=0) as handle:
        callers: list[LoadCaller] = []
        async with aiohttp.ClientSession() as http:
            try:
                for level in levels:
                    row = await run_level(
                        handle.url, engine, callers, level, load_clip, probe_clip,
                        http, handle.pid, seconds,
                    )  # fmt: skip
                    row.update(server=kind, engine=engine, held=held(row))
                    rows.append(row)
                    print_table([row], COLUMNS)
                    if not row["held"] and (row["rtt_ms_p95"] or 1e9) > 3 * HELD_RTT_P95_MS:
                        break  # far past the knee: higher levels only take longer to fail
            finally:
                await asyncio.gather(*(c.close(http) for c in callers), return_exceptions=True)
    return rows


COLUMNS = [
    "server", "engine", "sessions", "rtt_ms_p50", "rtt_ms_p95", "rtt_growth_ms", "loss",
    "server_cpu", "server_rss_mb", "client_cpu", "held",
]  # fmt: skip


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 5))
    for key in sorted({(r["server"], r["engine"]) for r in rows}):
        series = [r for r in rows if (r["server"], r["engine"]) == key and r["rtt_ms_p95"]]
        axis.plot(
            [r["sessions"] for r in series], [r["rtt_ms_p95"] for r in series],
            marker="o", label=f"{key[0]} {key[1]} (p95)",
        )  # fmt: skip
    axis.axhline(HELD_RTT_P95_MS, color="grey", linestyle="--", linewidth=1)
    axis.set_xlabel("concurrent sessions (server pinned to one core)")
    axis.set_ylabel("round-trip time p95 (ms)")
    axis.set_yscale("log")
    axis.legend()
    axis.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[10, 20, 40, 60, 80, 100])
    parser.add_argument("--engines", nargs="+", default=["echo", "denoise"])
    parser.add_argument("--servers", nargs="+", default=["ours", "stock"])
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    if (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {1})
    restrict_host_addresses(["127.0.0.1"])
    rows: list[dict] = []
    for kind in args.servers:
        for engine in args.engines:
            if kind == "stock" and engine != "echo":
                continue  # the stock server only echoes
            levels = args.levels
            if engine != "echo":  # a denoise stream costs ~5x an echo stream
                levels = [max(PROBES + 1, x // 5) for x in args.levels]
            rows += asyncio.run(run_server(kind, engine, sorted(set(levels)), args.seconds))
    print()
    print_table(rows, COLUMNS)
    summary = {}
    for key in sorted({(r["server"], r["engine"]) for r in rows}):
        series = [r for r in rows if (r["server"], r["engine"]) == key]
        summary[f"{key[0]}/{key[1]}"] = max((r["sessions"] for r in series if r["held"]), default=0)
    print("\nhighest level held (p95 <= 100 ms, loss < 1 %, no growth):", summary)
    results = write_results(
        "capacity",
        {
            "benchmark": "capacity",
            "machine": platform.platform(),
            "cores": os.cpu_count(),
            "seconds_per_level": args.seconds,
            "held": summary,
            "rows": rows,
        },
    )
    png = ROOT / "bench" / "results" / "capacity.png"
    plot(rows, str(png))
    print(f"wrote {results.relative_to(ROOT)} and {png.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
