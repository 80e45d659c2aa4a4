"""The real commands as subprocesses: ``serve`` on a loopback port, ``peer`` calling it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import wave
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from media.audio.frames import RTC_RATE
from media.audio.wav import write_wav

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 60.0
PEER_TIMEOUT_S = 60.0
REPORT_KEYS = {"connect_ms", "frames_sent", "frames_received", "gaps", "rtt_ms_p50", "rtt_ms_p95"}


def clean_env() -> dict[str, str]:
    """This environment without any COSYRTC_* setting that could change the commands."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSYRTC_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def command(*argv: str) -> list[str]:
    return [sys.executable, "-m", "server", *argv]


def run_cli(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``python -m server ARGV`` to completion, with no input, capturing its output."""
    return subprocess.run(
        command(*argv),
        cwd=ROOT,
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def get(url: str, timeout: float = 2.0) -> tuple[int, str, bytes]:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status, response.headers.get_content_type(), response.read()


def speech_like_wav(path: Path, seconds: float = 3.0, seed: int = 3) -> Path:
    """Syllables of gliding harmonics under smooth envelopes, with pauses between them."""
    rng = np.random.default_rng(seed)
    out = np.zeros(int(seconds * RTC_RATE), np.float32)
    start = int(0.1 * RTC_RATE)
    while start < len(out):
        length = int(rng.uniform(0.12, 0.3) * RTC_RATE)
        t = np.arange(length) / RTC_RATE
        f0 = rng.uniform(110, 220) * (1 + 0.3 * t / t[-1])  # rising pitch
        phase = 2 * np.pi * np.cumsum(f0) / RTC_RATE
        voiced = sum(np.sin(k * phase) / k for k in range(1, 6))
        envelope = np.sin(np.pi * t / t[-1]) ** 2
        piece = (0.3 * voiced * envelope).astype(np.float32)
        end = min(len(out), start + length)
        out[start:end] = piece[: end - start]
        start = end + int(rng.uniform(0.05, 0.2) * RTC_RATE)
    write_wav(path, out, RTC_RATE)
    return path


@dataclass
class ServeProcess:
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def wait_until_healthy(serve: ServeProcess) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if serve.process.poll() is not None:
            pytest.fail(f"serve exited with {serve.process.returncode}:\n{serve.output()}")
        try:
            status, _, _ = get(serve.url + "/healthz", timeout=0.5)
            if status == 200:
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"serve not healthy after {START_TIMEOUT_S:.0f} s:\n{serve.output()}")
        time.sleep(0.1)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeProcess]:
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command("serve", "--port", str(port), "--engine", "echo", "--ice-host", LOOPBACK),
            cwd=ROOT,
            env=clean_env(),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    running = ServeProcess(port, process, log)
    try:
        wait_until_healthy(running)
        yield running
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def run_peer(serve: ServeProcess, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    wav = speech_like_wav(tmp_path / "in.wav")
    argv = ["peer", "--url", serve.url, "--input", str(wav), "--output", str(tmp_path / "out.wav")]
    return run_cli(*argv, "--ice-host", LOOPBACK, "--json", *extra, timeout=PEER_TIMEOUT_S)


def test_serve_and_peer_end_to_end(serve: ServeProcess, tmp_path: Path):
    status, content_type, body = get(serve.url + "/engines")
    assert status == 200 and content_type == "application/json"
    engines = json.loads(body)
    assert engines["default"] == "echo"
    assert {"echo", "denoise"} <= {engine["name"] for engine in engines["engines"]}

    status, content_type, body = get(serve.url + "/")
    assert status == 200 and content_type == "text/html"
    assert b"<html" in body.lower()

    done = run_peer(serve, tmp_path, "--engine", "echo")
    assert done.returncode == 0, f"{done.stderr}\n--- serve ---\n{serve.output()}"
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout
    report = json.loads(lines[0])
    assert isinstance(report, dict)
    assert set(report) >= REPORT_KEYS
    assert report["ok"] is True and report["error"] is None
    assert report["frames_sent"] > 0
    assert report["frames_received"] > 0
    assert report["connect_ms"] is not None and report["connect_ms"] > 0
    assert isinstance(report["gaps"], int)

    with wave.open(str(tmp_path / "out.wav"), "rb") as out:
        assert out.getframerate() == 48_000
        assert out.getnchannels() == 1
        assert out.getsampwidth() == 2
        assert out.getnframes() > 0

    # The peer deleted its session, the server is still up.
    status, _, body = get(serve.url + "/healthz")
    assert status == 200 and json.loads(body) == {"status": "ok"}

    refused = run_peer(serve, tmp_path, "--engine", "nosuch")
    assert refused.returncode != 0
    assert "error:" in refused.stderr and "unknown_engine" in refused.stderr, refused.stderr
    refused_report = json.loads(refused.stdout.strip())
    assert refused_report["ok"] is False
    assert "400" in refused_report["error"] and "unknown_engine" in refused_report["error"]
    assert refused_report["frames_received"] == 0


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--port", "0"], "--port"),
        (["--ice-host", "localhost"], "--ice-host"),
    ],
)
def test_serve_with_a_bad_setting_exits_2(argv: list[str], named: str):
    done = run_cli("serve", *argv)
    assert done.returncode == 2, done.stderr
    assert named in done.stderr
    assert done.stderr.startswith("error: ")
    assert "Traceback" not in done.stderr
