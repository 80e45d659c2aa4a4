"""Helpers shared by the benchmarks: a server subprocess, speech input, tables and JSON."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from media.frames import RTC_RATE
from media.wav import write_wav
from tests.speech import speech_with_pauses

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


@contextlib.contextmanager
def server_process(
    args: Sequence[str], core: int | None = 0, ready_timeout: float = 30.0
) -> Iterator[str]:
    """Run ``python -m server serve`` on a free loopback port; yield its base URL."""
    port = free_port()
    command = [sys.executable, "-m", "server", "serve", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--ice-host", "127.0.0.1", *args]
    process = subprocess.Popen(
        pinned(command, core), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"server exited: {process.stderr.read().decode()[-2000:]}")
            try:
                with urllib.request.urlopen(url + "healthz", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("server did not become ready") from None
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def speech_input(path: Path, seconds: float) -> Path:
    """A WAV of espeak sentences with pauses, repeated to at least ``seconds``."""
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
        return f"{value:.1f}"
    return str(value)


def write_results(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
