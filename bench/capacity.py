"""Capacity: sessions per server core, ours against a stock aiortc echo server, in one run.

    .venv/bin/python -m bench.capacity [--levels 10 20 30 40 50 60 70 80]
                                       [--denoise-levels 2 4 6 8 10 12 16]
                                       [--engines echo denoise denoise-libdf]
                                       [--servers ours stock ours-hosted]
                                       [--seconds 10] [--no-overload | --overload-at H]

Each server runs pinned to core 0 and this client to core 1, so figures are per server
core. At each level the client holds that many calls: load callers send pre-encoded speech
and only count what comes back; up to three probe callers per level send chirp markers and
decode, giving RTT. Per level: RTT p50/p95, packets lost, server CPU and RSS, client CPU,
and the server CPU each session added over the level before (``marginal_cpu_ms``, per
session-second); per engine, the slope of server CPU over the levels held: what one more
session costs, beside how many were held.
A level is held when RTT p95 <= 100 ms, loss < 1 % and RTT does not grow during the level.
Echo and denoise have their own level lists: a denoise stream costs several echo streams.
``denoise`` (every session in one model call per hop) and ``denoise-libdf`` (libDF's C
runtime, one model copy per session) run the same model, in the same run.

``ours-hosted`` is our server with its hostable engines (denoise) in a model host process
(``python -m server host``), pinned to the same core: the server CPU and RSS of its rows
are both processes' together, so a session's cost includes the trip to the host and back.
``workers`` and ``workers-hosted`` are the default deployment's shape on both cores:
``serve --workers 2`` (no spare), its engines in each worker or (``-hosted``) the engine in
the front's model host; the figures are the front's and all its children's. The callers
share core 1 with it, so these rows compare the two with each other, not per core.

Overload (our server only): once the sweep has found the highest level held H for an
engine, a fresh server started with ``--max-sessions H`` holds H calls and is offered H
more, spread over one measuring window. Each extra offer should be refused within 50 ms
(503 with Retry-After) while the admitted calls keep RTT p95 <= 150 ms.
Writes bench/results/capacity.json and bench/results/capacity.png (``--name N``: N.json and
N.png instead; ``--overload-at H``:
only the overload phase, at H, written to bench/results/overload.json).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from bench.common import (
    ROOT,
    child_pids,
    free_port,
    percentile,
    pinned,
    print_table,
    process_cpu_seconds,
    process_rss_bytes,
    spawned_server,
    stop_process,
    write_results,
)
from bench.loadclient import EncodedClip, LoadCaller
from bench.overload import offer_spread, real_offers, summarise
from media.rtc.compat import restrict_host_addresses
from peer.speech import speech_with_pauses

PROBES = 3
SETTLE_S = 3.0
CONNECT_BATCH = 5
HELD_RTT_P95_MS = 100.0
HELD_LOSS = 0.01
GROWTH_MS = 20.0  # second-half p95 above first-half p95 by more than this: latency grows
OVERLOAD_REFUSAL_MS = 50.0
OVERLOAD_RTT_P95_MS = 150.0
UNCAPPED_SESSIONS = 1000  # the sweep's servers admit every level it tries
WORKER_KINDS = ("workers", "workers-hosted")  # serve --workers 2, on both cores


def server_command(
    kind: str, port: int, engine: str, max_sessions: int, host: Path | None = None
) -> list[str]:
    """The server under test; ours single-process (one core), without a per-address limit,
    and with ``host``, its hostable engines served by the model host on that socket.

    Every caller comes from 127.0.0.1, so the per-address rate limit would refuse the
    sweep's own connections.
    """
    if kind == "stock":
        return [sys.executable, "-m", "bench.stock_server", "--port", str(port)]
    hosted = ["--model-host", f"unix:{host}", "--host-engines", engine] if host is not None else []
    if kind in WORKER_KINDS:
        hosted = ["--workers", "2", "--spare-workers", "0"]
        hosted += (
            ["--model-host", "auto", "--host-engines", engine]
            if kind == "workers-hosted"
            else ["--model-host", "none"]
        )
    # Children inherit this process's affinity (core 1): a server on both cores says so.
    both_cores = ["taskset", "-c", "0,1"] if kind in WORKER_KINDS else []
    return [*both_cores,
        sys.executable, "-m", "server", "serve", "--host", "127.0.0.1", "--port", str(port),
        "--ice-host", "127.0.0.1", "--engine", engine, "--max-sessions", str(max_sessions),
        "--engine-threads", "1", *([] if kind in WORKER_KINDS else ["--workers", "1"]),
        "--rate-limit", "0",
        "--max-client-sessions", "0", *hosted,
    ]  # fmt: skip


@contextlib.contextmanager
def spawned_host(kind: str, engine: str) -> Iterator[tuple[Path | None, list[int]]]:
    """For ``ours-hosted``, a model host serving ``engine``, pinned to the server's core: its
    socket and process id (nothing for the other kinds)."""
    if kind != "ours-hosted":
        yield None, []
        return
    with tempfile.TemporaryDirectory(prefix="capacity-host-") as folder:
        socket = Path(folder) / "host.sock"
        command = [sys.executable, "-m", "server", "host", "--socket", str(socket)]
        command += ["--engines", engine, "--engine", engine, "--host-engines", engine]
        command += ["--host-loops", "1"]
        process = subprocess.Popen(pinned(command, 0), cwd=ROOT, stdout=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while not socket.exists():
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the model host did not start")
                time.sleep(0.05)
            yield socket, [process.pid]
        finally:
            stop_process(process)


def probes_for(level: int) -> int:
    """Probe callers at a level: three, or every caller of a level below that."""
    return min(PROBES, level)


@dataclass(frozen=True)
class Clips:
    """Speech encoded once: plain for load callers, with chirp markers for probes."""

    load: EncodedClip
    probe: EncodedClip

    @classmethod
    def make(cls) -> Clips:
        speech = speech_with_pauses().clean
        return cls(
            EncodedClip.encode(speech, with_markers=False),
            EncodedClip.encode(speech, with_markers=True),
        )


async def open_callers(
    url: str, engine: str, loads: int, probes: int, clips: Clips, http: aiohttp.ClientSession
) -> tuple[list[LoadCaller], int]:
    """Connect ``loads`` load and ``probes`` probe callers, a few at a time.

    Returns the connected callers and how many failed (those are closed already).
    """
    new = [LoadCaller(url, engine, clips.load, probe=False) for _ in range(loads)]
    new += [LoadCaller(url, engine, clips.probe, probe=True) for _ in range(probes)]
    connected: list[LoadCaller] = []
    failed = 0
    for start in range(0, len(new), CONNECT_BATCH):
        batch = new[start : start + CONNECT_BATCH]
        results = await asyncio.gather(*(c.connect(http) for c in batch), return_exceptions=True)
        for caller, result in zip(batch, results, strict=True):
            if isinstance(result, BaseException):
                failed += 1
                await caller.close(None)
            else:
                connected.append(caller)
    return connected, failed


async def measure(
    callers: list[LoadCaller],
    pids: Sequence[int],
    seconds: float,
    during: Awaitable[Any] | None = None,
) -> tuple[dict[str, Any], Any]:
    """RTT, loss and CPU over one window of ``seconds``, with ``during`` running inside it;
    the server's CPU and RSS are those of ``pids`` together (the server, and its host).

    Returns the row's measurements and what ``during`` returned.
    """
    probes = [c for c in callers if c.probe]
    packets_before = sum(c.packets_received for c in callers)
    cpu_before, client_before, t0 = server_cpu_seconds(pids), time.process_time(), time.monotonic()
    side = asyncio.ensure_future(during) if during is not None else None
    await asyncio.sleep(seconds)
    side_result = await side if side is not None else None
    elapsed = time.monotonic() - t0
    server_cpu = (server_cpu_seconds(pids) - cpu_before) / elapsed
    client_cpu = (time.process_time() - client_before) / elapsed
    packets = sum(c.packets_received for c in callers) - packets_before
    expected = len(callers) * elapsed * 50
    first_half: list[float] = []
    second_half: list[float] = []
    for probe in probes:
        whole = [r * 1000 for r in probe.rtts_since(t0)]
        late = [r * 1000 for r in probe.rtts_since(t0 + elapsed / 2)]
        first_half += whole[: len(whole) - len(late)]
        second_half += late
    rtts = first_half + second_half
    row = {
        "sessions": len(callers),
        "rtt_ms_p50": percentile(rtts, 50),
        "rtt_ms_p95": percentile(rtts, 95),
        "rtt_samples": len(rtts),
        "rtt_growth_ms": (
            round(float(np.percentile(second_half, 95) - np.percentile(first_half, 95)), 1)
            if first_half and second_half
            else None
        ),
        "loss": round(max(0.0, 1 - packets / expected), 4) if expected else None,
        "server_cpu": round(server_cpu, 3),
        "server_rss_mb": round(sum(process_rss_bytes(pid) for pid in pids) / 2**20, 1),
        "client_cpu": round(client_cpu, 3),
    }
    return row, side_result


def server_cpu_seconds(pids: Sequence[int]) -> float:
    return sum(process_cpu_seconds(pid) for pid in pids)


async def run_level(
    url: str,
    engine: str,
    callers: list[LoadCaller],
    level: int,
    clips: Clips,
    http: aiohttp.ClientSession,
    pids: Sequence[int],
    seconds: float,
) -> dict[str, Any]:
    """Top the held load callers up to ``level`` with fresh probes; measure one window."""
    probes = probes_for(level)
    loads = level - probes - sum(1 for c in callers if not c.probe)
    opened, failed = await open_callers(url, engine, max(0, loads), probes, clips, http)
    callers += opened
    await asyncio.sleep(SETTLE_S)
    row, _ = await measure(callers, pids, seconds)
    for probe in [c for c in callers if c.probe]:  # replaced each level: recordings grow
        callers.remove(probe)
        await probe.close(http)
    return {**row, "connect_failures": failed}


def held(row: dict[str, Any]) -> bool:
    return (
        row["rtt_ms_p95"] is not None
        and row["rtt_ms_p95"] <= HELD_RTT_P95_MS
        and (row["loss"] or 0) < HELD_LOSS
        and (row["rtt_growth_ms"] or 0) <= GROWTH_MS
        and row["connect_failures"] == 0
    )


def marginal_cpu_ms(rows: list[dict[str, Any]]) -> float | None:
    """Server CPU per session-second added by one more session, in milliseconds: the
    least-squares slope of server CPU (cores) over sessions across the levels held (all
    levels when fewer than two were held). What a session costs beyond the server's fixed
    share (its loop, timers, the process), which the average over a level hides."""
    series = [row for row in rows if row["held"]]
    if len(series) < 2:
        series = rows
    if len({row["sessions"] for row in series}) < 2:
        return None
    sessions = np.array([row["sessions"] for row in series], dtype=np.float64)
    cpu = np.array([row["server_cpu"] for row in series], dtype=np.float64)
    slope = np.polyfit(sessions, cpu, 1)[0]
    return round(1000 * float(slope), 2)


def add_step_slopes(rows: list[dict[str, Any]]) -> None:
    """Each level's CPU per session-second beyond the level before it (ms), in place."""
    for before, row in zip([None, *rows], rows, strict=False):
        if before is None or row["sessions"] == before["sessions"]:
            row["marginal_cpu_ms"] = None
            continue
        step = (row["server_cpu"] - before["server_cpu"]) / (row["sessions"] - before["sessions"])
        row["marginal_cpu_ms"] = round(1000 * step, 2)


async def run_sweep(
    kind: str, engine: str, levels: list[int], seconds: float, clips: Clips
) -> list[dict]:
    port = free_port()
    rows: list[dict] = []
    with (
        spawned_host(kind, engine) as (host, host_pids),
        spawned_server(
            server_command(kind, port, engine, UNCAPPED_SESSIONS, host),
            port,
            core=None if kind in WORKER_KINDS else 0,
            ready_path="engines",
            ready_timeout=120,
        ) as handle,
    ):
        pids = [handle.pid, *host_pids, *child_pids(handle.pid)]
        callers: list[LoadCaller] = []
        async with aiohttp.ClientSession() as http:
            try:
                for level in levels:
                    row = await run_level(
                        handle.url, engine, callers, level, clips, http, pids, seconds
                    )
                    row.update(server=kind, engine=engine, held=held(row))
                    rows.append(row)
                    add_step_slopes(rows)
                    print_table([row], COLUMNS)
                    if not row["held"] and (row["rtt_ms_p95"] or 1e9) > 3 * HELD_RTT_P95_MS:
                        break  # far past the knee: higher levels only take longer to fail
            finally:
                await asyncio.gather(*(c.close(http) for c in callers), return_exceptions=True)
    return rows


async def run_overload(engine: str, limit: int, seconds: float, clips: Clips) -> dict[str, Any]:
    """Hold ``limit`` calls on a server capped there; offer ``limit`` more during one window."""
    offers = await real_offers(limit)
    port = free_port()
    with spawned_server(server_command("ours", port, engine, limit), port, core=0) as handle:
        async with aiohttp.ClientSession() as http:
            probes = probes_for(limit)
            callers, failed = await open_callers(
                handle.url, engine, limit - probes, probes, clips, http
            )
            try:
                await asyncio.sleep(SETTLE_S)
                spread = offer_spread(http, handle.url, offers, engine, seconds * 0.8)
                row, outcomes = await measure(callers, [handle.pid], seconds, during=spread)
            finally:
                await asyncio.gather(*(c.close(http) for c in callers), return_exceptions=True)
    row = {"engine": engine, "max_sessions": limit, **row, **summarise(outcomes)}
    row["connect_failures"] = failed
    row["ok"] = (
        failed == 0
        and row["refused_503_retry_after"] == row["offered"]
        and (row["refusal_ms_p95"] or 0) <= OVERLOAD_REFUSAL_MS
        and row["rtt_ms_p95"] is not None
        and row["rtt_ms_p95"] <= OVERLOAD_RTT_P95_MS
    )
    return row


COLUMNS = [
    "server", "engine", "sessions", "rtt_ms_p50", "rtt_ms_p95", "rtt_growth_ms", "loss",
    "server_cpu", "marginal_cpu_ms", "server_rss_mb", "client_cpu", "held",
]  # fmt: skip
OVERLOAD_COLUMNS = [
    "engine", "max_sessions", "sessions", "offered", "refused_503_retry_after",
    "admitted_over_limit", "refusal_ms_p50", "refusal_ms_p95", "refusal_ms_max",
    "rtt_ms_p50", "rtt_ms_p95", "loss", "server_cpu", "ok",
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


async def run_sweeps(
    args: argparse.Namespace, clips: Clips
) -> tuple[list[dict], dict[str, int], dict[str, float | None]]:
    """Every server and engine's level sweep: the rows, the highest level each held and the
    marginal CPU per session-second of each."""
    rows: list[dict] = []
    for kind in args.servers:
        for engine in args.engines:
            if kind == "stock" and engine != "echo":
                continue  # the stock server only echoes
            levels = args.levels if engine == "echo" else args.denoise_levels
            rows += await run_sweep(kind, engine, sorted(set(levels)), args.seconds, clips)
    summary, marginal = {}, {}
    for key in sorted({(r["server"], r["engine"]) for r in rows}):
        series = [r for r in rows if (r["server"], r["engine"]) == key]
        summary[f"{key[0]}/{key[1]}"] = max((r["sessions"] for r in series if r["held"]), default=0)
        marginal[f"{key[0]}/{key[1]}"] = marginal_cpu_ms(series)
    return rows, summary, marginal


Sweeps = tuple[list[dict], dict[str, int], dict[str, float | None], list[dict]]


async def run_all(args: argparse.Namespace) -> Sweeps:
    clips = Clips.make()
    rows: list[dict] = []
    summary: dict[str, int] = {}
    marginal: dict[str, float | None] = {}
    if args.overload_at:  # no sweep: the level to double is given
        limits = dict.fromkeys(args.engines, args.overload_at)
    else:
        rows, summary, marginal = await run_sweeps(args, clips)
        skip = args.no_overload or "ours" not in args.servers
        limits = {} if skip else {e: summary.get(f"ours/{e}", 0) for e in args.engines}
    overload = []
    for engine, limit in limits.items():
        if limit > 0:  # nothing held: there is no level to double
            overload.append(await run_overload(engine, limit, args.seconds, clips))
            print_table(overload[-1:], OVERLOAD_COLUMNS)
    return rows, summary, marginal, overload


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--levels", type=int, nargs="+", default=[10, 20, 30, 40, 50, 60, 70, 80],
        help="session levels for echo (ours and stock)",
    )  # fmt: skip
    parser.add_argument(
        "--denoise-levels", type=int, nargs="+", default=[2, 4, 6, 8, 10, 12, 16],
        help="session levels for the denoise engines (batched and libDF's; a level far past "
        "an engine's knee ends its sweep)",
    )  # fmt: skip
    parser.add_argument("--engines", nargs="+", default=["echo", "denoise", "denoise-libdf"])
    parser.add_argument("--servers", nargs="+", default=["ours", "stock"])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--name", default="capacity", help="the results' file name")
    parser.add_argument("--no-overload", action="store_true", help="skip the overload phase")
    parser.add_argument(
        "--overload-at", type=int, metavar="H", help="no sweep: only the overload phase at H"
    )
    args = parser.parse_args()
    if (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {1})
    restrict_host_addresses(["127.0.0.1"])
    rows, summary, marginal, overload = asyncio.run(run_all(args))
    if rows:
        print()
        print_table(rows, COLUMNS)
        print("\nhighest level held (p95 <= 100 ms, loss < 1 %, no growth):", summary)
        print("marginal server CPU per session-second (ms, slope over the levels held):", marginal)
    if overload:
        print("\noverload: held level H as --max-sessions, H more offered")
        print_table(overload, OVERLOAD_COLUMNS)
    # An overload-only run keeps the sweep's results: it writes a file of its own.
    results = write_results(
        "overload" if args.overload_at else args.name,
        {
            "benchmark": "capacity",
            "command": " ".join(["python -m bench.capacity", *sys.argv[1:]]),
            "machine": platform.platform(),
            "cores": os.cpu_count(),
            "seconds_per_level": args.seconds,
            "held": summary,
            "marginal_cpu_ms_per_session_s": marginal,
            "rows": rows,
            "overload": overload,
        },
    )
    print(f"wrote {results.relative_to(ROOT)}")
    if rows:
        png = ROOT / "bench" / "results" / f"{args.name}.png"
        plot(rows, str(png))
        print(f"wrote {png.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
