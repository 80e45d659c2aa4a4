"""The model host as workers use it: a real ``python -m server host`` process with real
Piper, a real hosted engine over the socket and the shared ring, and the host killed and
started again under it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from media.engines.base import EngineUnavailable
from media.engines.hosted.catalog import hosted_engines
from media.engines.hosted.engine import HostedSpeakEngine
from media.engines.hosted.link import HostLink, HostRefused
from media.engines.hosted.wire import encode, read_message

SENTENCE = "The train to the city leaves at half past nine, from platform four."


class HostProcess:
    """``python -m server host`` on ``socket`` with ``engines`` (the default engine first),
    running ``host_engines`` (none: the hostable ones hosted by default)."""

    def __init__(
        self,
        socket: Path,
        engines: tuple[str, ...] = ("piper", "echo"),
        host_engines: tuple[str, ...] = (),
    ) -> None:
        self.socket = socket
        self.engines = engines
        self.host_engines = host_engines
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = [sys.executable, "-m", "server", "host", "--socket", str(self.socket)]
        command += ["--engines", *self.engines, "--engine", self.engines[0], "--host-loops", "2"]
        if self.host_engines:
            command += ["--host-engines", *self.host_engines]
        self.process = subprocess.Popen(command)
        deadline = time.monotonic() + 60
        while not self.socket.exists():
            assert self.process.poll() is None, "the host exited while starting"
            assert time.monotonic() < deadline, "the host did not start"
            time.sleep(0.05)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self.socket.unlink(missing_ok=True)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(15)


@pytest.fixture
def host(tmp_path: Path) -> Iterator[HostProcess]:
    process = HostProcess(tmp_path / "host.sock")
    process.start()
    yield process
    process.stop()


@pytest.fixture
def piper(host: HostProcess) -> Iterator[HostedSpeakEngine]:
    link = HostLink(str(host.socket))
    engines, unavailable = hosted_engines(link, ["piper", "cosyvoice"], wait=10)
    assert [engine.name for engine in engines] == ["piper"]
    assert "cosyvoice" in unavailable  # not loaded on this host: said so, not hidden
    yield engines[0]
    link.close()


def speak(engine: HostedSpeakEngine, state: object, text: str) -> np.ndarray:
    frames = list(engine.synthesize(state, text, threading.Event()))  # type: ignore[arg-type]
    return np.concatenate(frames) if frames else np.zeros(0, np.float32)


def test_hosted_piper_speaks_as_local_piper_does(piper: HostedSpeakEngine):
    from media.engines.piper import load

    local = load()
    try:
        here = local.new_state(local.validate_options({}))
        expected = np.concatenate(list(local.synthesize(here, SENTENCE, threading.Event())))
    finally:
        local.close()
    state = piper.new_state(piper.validate_options({}))
    audio = speak(piper, state, SENTENCE)
    assert piper.sample_rate == local.sample_rate
    # Piper samples its durations and prior (noise scales), so two runs of one sentence
    # differ; the same model gives the same length and loudness within a few per cent.
    assert abs(len(audio) - len(expected)) < 0.15 * len(expected)
    rms = float(np.sqrt(np.mean(audio**2)))
    assert 0.5 < rms / float(np.sqrt(np.mean(expected**2))) < 2
    assert state.first_frame_s is not None and state.first_frame_s < len(audio) / 22050
    piper.close_state(state)


def test_a_cancel_stops_the_utterance_within_a_frame(piper: HostedSpeakEngine):
    state = piper.new_state(piper.validate_options({}))
    cancel = threading.Event()
    taken = 0
    for _frame in piper.synthesize(state, SENTENCE * 3, cancel):
        taken += 1
        if taken == 3:
            cancel.set()
    assert taken == 3
    assert len(speak(piper, state, "And then this.")) > 0  # the session still speaks


def test_options_are_checked_as_the_host_engine_checks_them(piper: HostedSpeakEngine):
    with pytest.raises(Exception, match="speed"):
        piper.validate_options({"speed": 9})
    state = piper.new_state(piper.validate_options({"speed": 1.5}))
    assert len(speak(piper, state, "Quick.")) > 0


def test_a_killed_host_ends_the_utterance_and_a_new_one_serves_the_same_state(
    host: HostProcess, piper: HostedSpeakEngine
):
    state = piper.new_state(piper.validate_options({}))
    assert len(speak(piper, state, "Before.")) > 0
    frames = piper.synthesize(state, SENTENCE * 4, threading.Event())
    next(frames)
    host.kill()
    with pytest.raises(EngineUnavailable, match="model host"):
        for _ in frames:
            pass
    assert piper.unavailable_reason is not None
    with pytest.raises(EngineUnavailable):
        speak(piper, state, "While it is down.")
    host.start()
    assert piper.link.wait_until_ready(10)
    assert piper.unavailable_reason is None
    assert len(speak(piper, state, "After.")) > 0  # re-opened on the new host
    assert piper.link.losses == 1


def test_bad_requests_are_refused_and_the_host_serves_on(
    host: HostProcess, piper: HostedSpeakEngine
):
    link = piper.link
    with pytest.raises(HostRefused, match="no engine 'nope'") as refused:
        link.request({"t": "open", "engine": "nope", "options": {}})
    assert refused.value.code == "engine"
    with pytest.raises(HostRefused) as refused:
        link.request({"t": "open", "engine": "piper", "options": {"speed": "fast"}})
    assert refused.value.code == "bad_options"
    with pytest.raises(HostRefused) as refused:
        link.request({"t": "prompt", "state": 999, "rate": 16000, "transcript": "x"}, b"\0" * 8)
    assert refused.value.code == "unknown_state"
    with pytest.raises(HostRefused) as refused:
        link.request({"t": "open"})
    assert refused.value.code == "bad_request"

    async def garbage() -> None:
        reader, writer = await asyncio.open_unix_connection(str(host.socket))
        hello = await read_message(reader)
        assert hello is not None and hello[0]["t"] == "hello"
        writer.write(encode({"t": "speak", "s": "x"}))  # a bad field: dropped
        writer.write(b"\xff" * 64)  # not a message: this connection ends, nothing else
        await writer.drain()
        assert await reader.read() == b""
        writer.close()

    asyncio.run(garbage())
    state = piper.new_state(piper.validate_options({}))
    assert len(speak(piper, state, "Still here.")) > 0
    assert host.process is not None and host.process.poll() is None


def test_a_worker_that_goes_frees_its_states_on_the_host(host: HostProcess):
    """A second worker's link closes mid-utterance (as its process would die); the host
    frees what it held and the other worker's sessions are not touched."""
    other = HostLink(str(host.socket))
    engines, _ = hosted_engines(other, ["piper"], wait=10)
    engine = engines[0]
    state = engine.new_state(engine.validate_options({}))
    frames = engine.synthesize(state, SENTENCE * 4, threading.Event())
    next(frames)
    other.close()
    mine = HostLink(str(host.socket))
    try:
        (piper,), _ = hosted_engines(mine, ["piper"], wait=10)
        mine_state = piper.new_state(piper.validate_options({}))
        assert len(speak(piper, mine_state, "Mine.")) > 0
    finally:
        mine.close()
    assert os.path.exists(host.socket)
