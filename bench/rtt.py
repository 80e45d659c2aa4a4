"""Round-trip time of echo and denoise calls, measured in-band by the headless peer.

    .venv/bin/python -m bench.rtt [--seconds 30] [--repeat 3] [--engines echo denoise]
                                  [--transports webrtc ws]

Each engine is called over WebRTC (Opus over RTP) and over the WebSocket transport (PCM16
at 48 kHz over TCP) in the same run, alternating, so the two are compared on one machine
state.
The server runs as its own process pinned to core 0; the peer runs pinned to core 1, so the
figure is the server's and the loopback network's, plus the peer's receive path. Each run
streams ``--seconds`` of speech; the table shows each run's p50/p95 and the median of the
runs. Results go to bench/results/rtt.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import (
    ROOT,
    percentile,
    pinned,
    print_table,
    server_process,
    speech_input,
    write_results,
)

# The peer's flags for each transport.
TRANSPORTS = {"webrtc": [], "ws": ["--ws"]}


def run_peer(url: str, engine: str, wav: Path, out: Path, extra: list[str]) -> dict:
    command = [sys.executable, "-m", "server", "peer", "--url", url, "--engine", engine]
    command += ["--input", str(wav), "--output", str(out), "--ice-host", "127.0.0.1", "--json"]
    done = subprocess.run(
        pinned(command + extra, core=1), cwd=ROOT, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"peer failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--engines", nargs="+", default=["echo", "denoise"])
    parser.add_argument("--transports", nargs="+", choices=TRANSPORTS, default=list(TRANSPORTS))
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        wav = speech_input(Path(tmp) / "speech.wav", args.seconds)
        with server_process(["--engine", "echo", "--workers", "1"]) as url:
            for engine in args.engines:
                runs: dict[str, list[dict]] = {transport: [] for transport in args.transports}
                for index in range(args.repeat):
                    for transport in args.transports:
                        extra = TRANSPORTS[transport]
                        report = run_peer(url, engine, wav, Path(tmp) / "out.wav", extra)
                        runs[transport].append(report)
                        rows.append(
                            {"engine": engine, "transport": transport, "run": index + 1, **report}
                        )
                        time.sleep(0.5)
                for transport, reports in runs.items():
                    p50s = [r["rtt_ms_p50"] for r in reports if r["rtt_ms_p50"] is not None]
                    p95s = [r["rtt_ms_p95"] for r in reports if r["rtt_ms_p95"] is not None]
                    rows.append(
                        {
                            "engine": engine,
                            "transport": transport,
                            "run": "median",
                            "rtt_ms_p50": percentile(p50s, 50),
                            "rtt_ms_p95": percentile(p95s, 50),
                        }
                    )
    columns = ["engine", "transport", "run", "rtt_method", "rtt_ms_p50", "rtt_ms_p95"]
    columns += ["rtt_samples"]
    columns += ["frames_sent", "frames_received", "gaps", "connect_ms"]
    print_table(rows, columns)
    path = write_results(
        "rtt",
        {
            "benchmark": "rtt",
            "seconds_per_run": args.seconds,
            "machine": platform.platform(),
            "rows": rows,
        },
    )
    print(f"\nwrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
