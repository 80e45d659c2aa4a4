"""What a speak session costs the server while the caller talks and the server says nothing.

    .venv/bin/python -m bench.listening [--sessions 12] [--seconds 10] [--repeat 3]
                                        [--name NAME] [-- SERVER FLAGS]

A voice agent's caller talks about as much as it listens, and a session that listens still
decodes the caller, cancels our echo from what it hears and runs the barge-in VAD on it. One
server (``--workers 1``, Piper, engines in the worker) runs pinned to core 0; this client,
on core 1, opens ``--sessions`` speak calls that send speech with pauses and never ask for
speech. After the calls settle, the server's CPU time (the process and its children) over
``--seconds`` is divided by the sessions: ms of server CPU per session-second. Each repeat is
a fresh set of calls on the same server. Writes bench/results/listening.json (or NAME.json).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

import numpy as np

from bench.common import (
    child_pids,
    free_port,
    print_table,
    process_cpu_seconds,
    serve_command,
    spawned_server,
    write_results,
)
from peer.call import PeerCall
from peer.speech import speech_with_pauses

SETTLE_S = 3.0


async def listening_cost(
    url: str, pid: int, sessions: int, seconds: float, audio: np.ndarray
) -> float:
    """Server CPU (cores) while ``sessions`` speak calls send ``audio`` and hear nothing."""
    calls = [PeerCall(url, audio, engine="piper") for _ in range(sessions)]
    try:
        await asyncio.gather(*(call.connect() for call in calls))
        await asyncio.sleep(SETTLE_S)
        pids = [pid, *child_pids(pid)]
        began_cpu, began = sum(map(process_cpu_seconds, pids)), time.monotonic()
        await asyncio.sleep(seconds)
        used = sum(map(process_cpu_seconds, pids)) - began_cpu
        return used / (time.monotonic() - began)
    finally:
        for call in calls:
            await call.end()
            await call.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--name", default="listening", help="results file: bench/results/NAME.json")
    parser.add_argument("server_flags", nargs="*", help="extra serve flags, after --")
    args = parser.parse_args()
    if (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {1})
    speech = speech_with_pauses().clean.astype(np.float32)
    audio = np.tile(speech, int(np.ceil((SETTLE_S + args.seconds + 5) * 48_000 / speech.size)))
    port = free_port()
    flags = ["--workers", "1", "--engine", "piper", "--model-host", "none", *args.server_flags]
    command = serve_command(port, flags)
    cores: list[float] = []
    with spawned_server(command, port, 0) as handle:
        for _ in range(args.repeat):
            cost = listening_cost(handle.url, handle.pid, args.sessions, args.seconds, audio)
            cores.append(asyncio.run(cost))
    per_session = [1000 * c / args.sessions for c in cores]
    rows = [
        {
            "sessions": args.sessions,
            "runs": len(cores),
            "server_cores_p50": round(statistics.median(cores), 3),
            "ms_per_session_second_p50": round(statistics.median(per_session), 1),
            "ms_per_session_second_max": round(max(per_session), 1),
        }
    ]
    print_table(rows, list(rows[0]))
    path = write_results(args.name, {"rows": rows, "ms_per_session_second": per_session})
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
