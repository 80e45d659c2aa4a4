"""One copy of each model per device: memory of the model host and of the media workers.

    python -m bench.host_memory --cosyvoice-model DIR [--workers 2 4]

For each worker count, starts ``serve --workers N`` twice, with the model host
(``--model-host auto``) and without it (``--model-host none``: every worker loads its
own models), with Piper and CosyVoice (the given model directory) and echo, and reads
the resident memory of the host and of every worker once they serve. With the host its
RSS stays the same whatever N, and a worker holds no weights; without it every worker
holds them all. Writes bench/results/host_memory.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import free_port, print_table, process_rss_bytes, spawned_server, write_results

SETTLE_S = 2.0  # after /engines answers: spares and the host finish warming up


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()] if path.exists() else []


def role(pid: int) -> str:
    command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    words = [word.decode() for word in command]
    if "host" in words:
        return "host"
    if "worker" in words:
        return "worker"
    return "other"


def measure(workers: int, host: str, model: str) -> dict[str, Any]:
    port = free_port()
    command = [sys.executable, "-m", "server", "serve", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--workers", str(workers), "--spare-workers", "0"]
    command += ["--spare-host", "0"]  # one host: the figure is one copy of the models
    command += ["--engines", "echo", "piper", "cosyvoice", "--engine", "echo"]
    command += ["--cosyvoice-model", model, "--model-host", host]
    with spawned_server(command, port, core=None, ready_path="engines", ready_timeout=300) as s:
        time.sleep(SETTLE_S)
        rss: dict[str, list[float]] = {"host": [], "worker": []}
        for child in children(s.pid):
            kind = role(child)
            if kind in rss:
                rss[kind].append(round(process_rss_bytes(child) / 2**20, 1))
        front = round(process_rss_bytes(s.pid) / 2**20, 1)
    return {
        "workers": workers,
        "model_host": host,
        "host_rss_mb": rss["host"][0] if rss["host"] else None,
        "worker_rss_mb": rss["worker"],
        "worker_rss_mb_max": max(rss["worker"]),
        "front_rss_mb": front,
        "total_rss_mb": round(sum(rss["host"]) + sum(rss["worker"]) + front, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cosyvoice-model", required=True)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    rows = [
        measure(workers, host, args.cosyvoice_model)
        for workers in args.workers
        for host in ("auto", "none")
    ]
    columns = ["workers", "model_host", "host_rss_mb", "worker_rss_mb_max", "front_rss_mb"]
    print_table(rows, [*columns, "total_rss_mb"])
    path = write_results("host_memory", {"rows": rows})
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
