"""Where the server's core goes at a fixed number of sessions: a py-spy profile, by module.

    .venv/bin/python -m bench.profile [--sessions 30] [--engine echo] [--seconds 20]
                                      [--native] [--speedscope PATH]

Needs py-spy (``pip install -e '.[bench]'``). The server runs pinned to core 0 with
``--sessions`` cheap load callers (three of them probes, for RTT) from this process on
core 1. Once they settle, py-spy samples the server's event-loop thread for ``--seconds``
without pausing it (``--nonblocking``, so the calls being measured are not slowed by the
profiler). Each sample is charged to the innermost frame that belongs to a known part (our
receive path, Opus, SRTP, DTLS, RTP handling, pacing...); samples with only standard-library
frames are the event loop's own work, and samples waiting in ``select`` are idle time.
Writes bench/results/profile.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import aiohttp

from bench.capacity import (
    SETTLE_S,
    UNCAPPED_SESSIONS,
    Clips,
    measure,
    open_callers,
    probes_for,
    server_command,
)
from bench.common import ROOT, free_port, print_table, spawned_server, write_results
from signaling.ice import restrict_host_addresses

RATE_HZ = 100
# (part of a file's path, what it is); the innermost frame that matches names the sample.
PARTS = (
    ("media/opus.py", "Opus encode/decode (libopus via ctypes)"),
    ("pylibsrtp/", "SRTP protect/unprotect (pylibsrtp)"),
    ("OpenSSL/", "DTLS and crypto (pyOpenSSL)"),
    ("cryptography/", "DTLS and crypto (pyOpenSSL)"),
    ("aioice/", "ICE and UDP transport (aioice)"),
    ("aiortc/rtcsctptransport.py", "SCTP data channel (aiortc)"),
    ("aiortc/rtp.py", "RTP/RTCP parsing and serialising (aiortc)"),
    ("aiortc/rtcrtpreceiver.py", "RTP receiver (aiortc)"),
    ("aiortc/rtcrtpsender.py", "RTP sender (aiortc)"),
    ("aiortc/rtcdtlstransport.py", "DTLS transport demux (aiortc)"),
    ("aiortc/", "other aiortc"),
    ("media/receive.py", "our receive path (jitter, decode, PLC)"),
    ("media/pacing.py", "pacing"),
    ("media/", "our pipeline, tracks and buffers"),
    ("server/", "sessions, stats, events (server/)"),
    ("signaling/", "signaling (HTTP routes)"),
    ("aiohttp/", "aiohttp"),
    ("numpy/", "numpy (outside our modules)"),
    ("pyee/", "event emitter (pyee)"),
    ("av/", "PyAV"),
)
IDLE = "idle (waiting in select)"
LOOP = "asyncio loop and standard library"
OTHER = "other third-party"
STDLIB_MARKERS = ("/lib/python3", "<frozen", "asyncio/", "selectors.py", "threading.py")


def parse_frame(frame: str) -> tuple[str, str]:
    """``function (path:line)`` -> (function, path); py-spy's raw format."""
    function, _, rest = frame.partition(" (")
    return function, rest.rsplit(":", 1)[0]


def part_of(path: str) -> str | None:
    for marker, label in PARTS:
        if marker in path:
            return label
    return None


def is_stdlib(path: str) -> bool:
    return "site-packages" not in path and any(m in path for m in STDLIB_MARKERS)


def classify(frames: list[str]) -> str:
    """The part one sample belongs to; ``frames`` run from the root to the leaf."""
    function, path = parse_frame(frames[-1])
    if function in ("select", "poll") and "selectors.py" in path:
        return IDLE
    for frame in reversed(frames):
        _, path = parse_frame(frame)
        label = part_of(path)
        if label is not None:
            return label
        if not is_stdlib(path) and "site-packages" in path:
            return OTHER
    return LOOP


def main_thread_stacks(lines: Iterable[str]) -> Counter[tuple[str, ...]]:
    """Collapsed stacks of the event-loop thread (the one running ``run_forever``).

    With ``--threads`` each stack starts with the process, then a ``thread (0x..)`` entry;
    engine and pool threads idle in their own waits and are left out.
    """
    stacks: Counter[tuple[str, ...]] = Counter()
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        body = [f for f in frames if not f.startswith(("process ", "thread "))]
        if any(f.startswith("run_forever ") for f in body):
            stacks[tuple(body)] += int(count)
    return stacks


def summarise(stacks: Counter[tuple[str, ...]], server_cpu: float) -> dict[str, Any]:
    total = sum(stacks.values())
    parts: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    for frames, count in stacks.items():
        label = classify(list(frames))
        parts[label] += count
        if label != IDLE:
            function, path = parse_frame(frames[-1])
            leaves[f"{function} ({path.split('site-packages/')[-1]})"] += count
    busy = total - parts[IDLE]
    return {
        "samples": total,
        "server_cpu": server_cpu,
        "parts": [
            {
                "part": label,
                "share_of_samples_pct": round(100 * count / total, 1),
                "share_of_busy_pct": round(100 * count / busy, 1) if label != IDLE else None,
            }
            for label, count in parts.most_common()
        ],
        "top_leaf_functions": [
            {"function": name, "share_of_busy_pct": round(100 * count / busy, 1)}
            for name, count in leaves.most_common(15)
        ],
    }


async def profile(args: argparse.Namespace, py_spy: str) -> dict[str, Any]:
    clips = Clips.make()
    port = free_port()
    command = server_command("ours", port, args.engine, UNCAPPED_SESSIONS)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "stacks.txt"
        with spawned_server(command, port, core=0) as handle:
            record = [py_spy, "record", "--pid", str(handle.pid), "--rate", str(RATE_HZ)]
            record += ["--duration", str(int(args.seconds)), "--format", "raw"]
            record += ["--output", str(raw), "--threads", "--idle", "--nonblocking"]
            record += ["--native"] if args.native else []
            async with aiohttp.ClientSession() as http:
                probes = probes_for(args.sessions)
                callers, failed = await open_callers(
                    handle.url, args.engine, args.sessions - probes, probes, clips, http
                )
                try:
                    await asyncio.sleep(SETTLE_S)
                    spy = await asyncio.create_subprocess_exec(
                        *record, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
                    )
                    row, (_, errors) = await measure(
                        callers, handle.pid, args.seconds + 1, during=spy.communicate()
                    )
                finally:
                    await asyncio.gather(*(c.close(http) for c in callers), return_exceptions=True)
        if spy.returncode != 0 or not raw.exists():
            raise RuntimeError(f"py-spy failed: {errors.decode()[-1000:]}")
        if args.keep_stacks:
            shutil.copyfile(raw, args.keep_stacks)
        stacks = main_thread_stacks(raw.read_text().splitlines())
    row["connect_failures"] = failed
    return {**row, **summarise(stacks, row["server_cpu"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=30)
    parser.add_argument("--engine", default="echo")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--native", action="store_true", help="C frames too (slower sampling)")
    parser.add_argument(
        "--keep-stacks", type=Path, help="also save the collapsed stacks (speedscope opens them)"
    )
    args = parser.parse_args()
    py_spy = shutil.which("py-spy", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    if py_spy is None:
        print("py-spy is missing: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    if (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {1})
    restrict_host_addresses(["127.0.0.1"])
    result = asyncio.run(profile(args, py_spy))
    print(
        f"{args.engine}, {result['sessions']} sessions: server CPU {result['server_cpu']:.2f}, "
        f"RTT p50/p95 {result['rtt_ms_p50']}/{result['rtt_ms_p95']} ms, "
        f"{result['samples']} samples of the event-loop thread\n"
    )
    print_table(result["parts"], ["part", "share_of_samples_pct", "share_of_busy_pct"])
    print()
    print_table(result["top_leaf_functions"], ["function", "share_of_busy_pct"])
    path = write_results(
        "profile",
        {
            "benchmark": "profile",
            "command": " ".join(["python -m bench.profile", *sys.argv[1:]]),
            "machine": platform.platform(),
            "cores": os.cpu_count(),
            "engine": args.engine,
            "seconds": args.seconds,
            "rate_hz": RATE_HZ,
            **result,
        },
    )
    print(f"\nwrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
