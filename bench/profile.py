"""Where the server's core goes at a fixed number of sessions: a py-spy profile, by module.

    .venv/bin/python -m bench.profile [--sessions 30] [--engine echo] [--seconds 20]
                                      [--keep-stacks PATH] [--no-pause]

Needs py-spy (``pip install -e '.[bench]'``). The server runs pinned to core 0 with
``--sessions`` cheap load callers (three of them probes, for RTT) from this process on
core 1. Once they settle, py-spy samples the server's event-loop thread for ``--seconds``,
pausing it for each sample (without that its stacks come out torn). Pausing costs the
server its timing under load, though: at 25 echo sessions the calls' RTT p50 went from
~15 ms to ~200 ms, and late packets then charge concealment to the profile. ``--no-pause``
samples without stopping it (py-spy's ``--nonblocking``): a few stacks come out torn and
its idle share is not to be trusted (it read ~70 % idle on a thread that used 0.6 of a
core), but the busy shares compare the parts of a server that runs as it would. Each
sample is charged
to the innermost frame that belongs to a known part (our receive path, Opus, SRTP, RTP
handling, pacing...); samples with only standard-library frames are the event loop's own
work, and samples waiting in ``select`` are idle time. Time inside a C library (libopus,
libsrtp, OpenSSL) is charged to the Python frame that called it. A sample is wall time:
where other processes share the server's core, "idle" understates the headroom, but the
busy shares still compare the parts with each other.
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
from media.rtc.compat import restrict_host_addresses

RATE_HZ = 100
# (where a file lives, what it is): a path under site-packages/ or under this repository.
# The innermost frame that matches one names the sample.
PARTS = (
    ("media/audio/opus.py", "Opus encode/decode (libopus via ctypes)"),
    ("pylibsrtp/", "SRTP protect/unprotect (pylibsrtp)"),
    ("OpenSSL/", "DTLS and crypto (pyOpenSSL, cryptography)"),
    ("cryptography/", "DTLS and crypto (pyOpenSSL, cryptography)"),
    ("aioice/", "ICE and UDP transport (aioice)"),
    ("aiortc/rtcsctptransport.py", "SCTP data channel (aiortc)"),
    ("aiortc/rtp.py", "RTP/RTCP parsing and serialising (aiortc)"),
    ("aiortc/rtcrtpreceiver.py", "RTP receiver (aiortc)"),
    ("aiortc/rtcrtpsender.py", "RTP sender (aiortc)"),
    ("aiortc/rtcdtlstransport.py", "DTLS transport: RTP demux (aiortc)"),
    ("aiortc/", "other aiortc"),
    ("media/rtc/receive.py", "our receive path (jitter, decode, PLC)"),
    ("media/pipeline/pacing.py", "pacing"),
    ("media/rtc/media_tick.py", "media tick and RTP send (ours)"),
    ("media/rtc/rtp_stream.py", "media tick and RTP send (ours)"),
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
SITE = "site-packages/"


def parse_frame(frame: str) -> tuple[str, str]:
    """``Class.function (path:line)`` -> (function, path); py-spy's raw format."""
    function, _, rest = frame.rpartition(" (")
    return function.rsplit(".", 1)[-1], rest.rsplit(":", 1)[0]


def part_of(path: str) -> str | None:
    """The part a file belongs to; None for the standard library."""
    if SITE in path:
        where = path.split(SITE, 1)[1]
    elif path.startswith(f"{ROOT}/"):
        where = path[len(f"{ROOT}/") :]
    else:
        return None
    return next((label for marker, label in PARTS if where.startswith(marker)), OTHER)


def classify(frames: list[str]) -> str:
    """The part one sample belongs to; ``frames`` run from the root to the leaf.

    Only frames above the loop's ``_run_once`` count: below it is the process's start-up
    (``server/deploy/cli.py`` and friends), on every stack.
    """
    function, path = parse_frame(frames[-1])
    if function in ("select", "poll") and path.endswith("selectors.py"):
        return IDLE
    for frame in reversed(above_loop(frames)):
        label = part_of(parse_frame(frame)[1])
        if label is not None:
            return label
    return LOOP


def above_loop(frames: list[str]) -> list[str]:
    """The frames the event loop called, without the start-up frames below it."""
    loop = [i for i, f in enumerate(frames) if parse_frame(f)[0] == "_run_once"]
    return frames[loop[-1] + 1 :] if loop else frames


def main_thread_stacks(lines: Iterable[str]) -> Counter[tuple[str, ...]]:
    """Collapsed stacks of the event-loop thread, root first.

    With ``--threads`` each stack starts with ``thread (id): name``; the engine and pool
    threads, idle in their own waits, are left out.
    """
    stacks: Counter[tuple[str, ...]] = Counter()
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        thread, _, body = stack.partition(";")
        if thread.startswith("thread (") and thread.endswith(": MainThread") and body:
            stacks[tuple(body.split(";"))] += int(count)
    return stacks


def short(path: str) -> str:
    """A file's path from its package: ``aiortc/rtp.py``, ``media/audio/opus.py``, ..."""
    if SITE in path:
        return path.split(SITE, 1)[1]
    if path.startswith(f"{ROOT}/"):
        return path[len(f"{ROOT}/") :]
    return path.split("/lib/python3.11/", 1)[-1]


def charged_file(frames: list[str]) -> str:
    """The innermost file outside the standard library, or the leaf's when there is none."""
    for frame in reversed(above_loop(frames)):
        path = parse_frame(frame)[1]
        if part_of(path) is not None:
            return short(path)
    return short(parse_frame(frames[-1])[1])


def summarise(stacks: Counter[tuple[str, ...]]) -> dict[str, Any]:
    """Shares by part, by file charged and by leaf function (self time)."""
    total = sum(stacks.values())
    parts: Counter[str] = Counter()
    files: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    for frames, count in stacks.items():
        label = classify(list(frames))
        parts[label] += count
        if label != IDLE:
            files[charged_file(list(frames))] += count
            function, path = parse_frame(frames[-1])
            leaves[f"{function} ({short(path)})"] += count
    busy = max(total - parts[IDLE], 1)

    def shares(counter: Counter[str], key: str, top: int) -> list[dict[str, Any]]:
        return [
            {key: name, "busy_pct": round(100 * count / busy, 1)}
            for name, count in counter.most_common(top)
        ]

    return {
        "samples": total,
        "idle_pct": round(100 * parts.pop(IDLE, 0) / max(total, 1), 1),
        "parts": shares(parts, "part", len(parts)),
        "files": shares(files, "file", 15),
        "leaf_functions": shares(leaves, "function", 15),
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
            record += ["--output", str(raw), "--threads", "--idle", "--full-filenames"]
            record += ["--nonblocking"] if args.no_pause else []
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
                        callers, [handle.pid], args.seconds + 1, during=spy.communicate()
                    )
                finally:
                    await asyncio.gather(*(c.close(http) for c in callers), return_exceptions=True)
        if spy.returncode != 0 or not raw.exists():
            raise RuntimeError(f"py-spy failed: {errors.decode()[-1000:]}")
        if args.keep_stacks:
            shutil.copyfile(raw, args.keep_stacks)
        stacks = main_thread_stacks(raw.read_text().splitlines())
    row["connect_failures"] = failed
    return {**row, **summarise(stacks)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=30)
    parser.add_argument("--engine", default="echo")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--keep-stacks", type=Path, help="also save the collapsed stacks (speedscope opens them)"
    )
    parser.add_argument(
        "--no-pause", action="store_true", help="sample without pausing the server (see above)"
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
    print(f"idle: {result['idle_pct']} % of samples; the rest, by part:")
    print_table(result["parts"], ["part", "busy_pct"])
    print()
    print_table(result["files"], ["file", "busy_pct"])
    print()
    print_table(result["leaf_functions"], ["function", "busy_pct"])
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
            "paused": not args.no_pause,
            **result,
        },
    )
    print(f"\nwrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
