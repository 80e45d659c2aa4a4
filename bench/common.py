"""Helpers shared by the benchmarks: a server subprocess, speech input, tables and JSON."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pinned(command: Sequence[str], core: int | None) -> list[str]:
    """Prefix ``command`` with taskset when a core is given and taskset exists."""
    if core is None or shutil.which("taskset") is None or (os.cpu_count() or 1) < 2:
        return list(command)
    return ["taskset", "-c", str(core), *command]


@dataclass(frozen=True)
class ServerHandle:
    url: str
    pid: int
    process: subprocess.Popen[bytes]


@contextlib.contextmanager
def spawned_server(
    command: Sequence[str],
    port: int,
    core: int | None = 0,
    ready_path: str = "healthz",
    ready_timeout: float = 60.0,
    cwd: Path = ROOT,
) -> Iterator[ServerHandle]:
    """Run a server command (pinned to ``core``, in ``cwd``: ``python -m`` runs the checkout
    it starts in) until it answers; stop it afterwards.

    The server's log goes to a file: a pipe nobody reads fills up under load and then blocks
    the server on its next log line.
    """
    with tempfile.TemporaryFile() as log_file:
        process = subprocess.Popen(
            pinned(command, core), cwd=cwd, stdout=subprocess.DEVNULL, stderr=log_file
        )
        try:
            _wait_until_ready(
                process, log_file, f"http://127.0.0.1:{port}/", ready_path, ready_timeout
            )
            yield ServerHandle(f"http://127.0.0.1:{port}/", process.pid, process)
        finally:
            stop_process(process)


def stop_process(process: subprocess.Popen[Any], grace: float = 10.0) -> None:
    """SIGTERM, and SIGKILL if it has not exited within ``grace`` seconds."""
    process.terminate()
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _wait_until_ready(
    process: subprocess.Popen[bytes], log_file: Any, url: str, path: str, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            log_file.seek(0)
            raise RuntimeError(f"server exited: {log_file.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(url + path, timeout=1):
                return
        except urllib.error.HTTPError:
            return  # it answers, even if not that path
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError("server did not become ready") from None
            time.sleep(0.2)


@contextlib.contextmanager
def server_process(args: Sequence[str], core: int | None = 0) -> Iterator[str]:
    """Run ``python -m server serve`` on a free loopback port; yield its base URL."""
    port = free_port()
    with spawned_server(serve_command(port, args), port, core) as handle:
        yield handle.url


def serve_command(port: int, args: Sequence[str]) -> list[str]:
    """``python -m server serve`` on 127.0.0.1:``port`` with ``args``."""
    command = [sys.executable, "-m", "server", "serve", "--host", "127.0.0.1"]
    # Every caller of a benchmark comes from 127.0.0.1: no per-client cap.
    command += ["--port", str(port), "--ice-host", "127.0.0.1", "--max-client-sessions", "0", *args]
    return command


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux /proc): a front's workers and host."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # it exited meanwhile
            continue
        if int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return sorted(children)


def process_rss_bytes(pid: int) -> int:
    pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def speech_input(path: Path, seconds: float) -> Path:
    """A WAV of espeak sentences with pauses, repeated to at least ``seconds``.

    The media stack is imported here, not at the top, so the benchmarks of a model alone
    (``bench.cosyvoice`` on a bare GPU machine) need none of it.
    """
    from media.audio.frames import RTC_RATE
    from media.audio.wav import write_wav
    from peer.speech import speech_with_pauses

    clip = speech_with_pauses().clean
    repeats = int(np.ceil(seconds * RTC_RATE / len(clip)))
    write_wav(path, np.tile(clip, repeats)[: int(seconds * RTC_RATE)], RTC_RATE)
    return path


def percentile(values: Sequence[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 2) if values else None


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    widths = {c: max(len(c), *(len(_cell(r.get(c))) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    print("  ".join("-" * widths[c] for c in columns))
    for row in rows:
        print("  ".join(_cell(row.get(c)).ljust(widths[c]) for c in columns))


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"
    return str(value)


def write_results(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
