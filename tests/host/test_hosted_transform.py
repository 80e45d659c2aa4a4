"""Denoise in the model host as workers use it: a real host (a ``python -m server host``
process, or the same service in this process where a test reads the host's batch
statistics), real DeepFilterNet3, the worker's engine over the socket."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from media.engines.base import EngineUnavailable
from media.engines.dfn.engine import BatchedDenoiseEngine
from media.engines.dfn.engine import load as load_denoise
from media.engines.hosted.catalog import hosted_engines
from media.engines.hosted.link import HostLink, HostRefused
from media.engines.hosted.transform import HostedTransformEngine
from media.engines.loop_thread import LoopThread
from media.engines.registry import EngineRegistry
from peer.speech import SpeechFixture, add_white_noise
from server.host.service import ModelHost
from tests.host.test_model_host import HostProcess

CHUNK = 960  # one 20 ms frame at 48 kHz: what a transform pipeline submits
SECONDS = 3.0


@pytest.fixture(scope="module")
def noisy(speech: SpeechFixture) -> np.ndarray:
    signal = add_white_noise(speech.clean, snr_db=5.0)
    return signal[: int(SECONDS * 48_000) // CHUNK * CHUNK]


@pytest.fixture
def host(tmp_path: Path) -> Iterator[HostProcess]:
    process = HostProcess(tmp_path / "host.sock", ("denoise", "echo"), host_engines=("denoise",))
    process.start()
    yield process
    process.stop()


@pytest.fixture
def denoise(host: HostProcess) -> Iterator[HostedTransformEngine]:
    link = HostLink(str(host.socket))
    engines, unavailable = hosted_engines(link, ["denoise"], wait=10)
    assert [type(engine) for engine in engines] == [HostedTransformEngine], unavailable
    engine = engines[0]
    assert isinstance(engine, HostedTransformEngine)
    yield engine
    link.close()


def run(engine: BatchedDenoiseEngine | HostedTransformEngine, state: object, audio: np.ndarray):
    """``audio`` through ``engine`` chunk by chunk, as a transform pipeline hands it over."""
    out = [
        engine.submit(state, audio[k : k + CHUNK]).result(5)  # type: ignore[arg-type]
        for k in range(0, len(audio), CHUNK)
    ]
    return np.concatenate(out)


DELAY = 30 * 48  # the engine's delay in samples


def not_passed_through(out: np.ndarray, audio: np.ndarray) -> bool:
    """``out`` is not ``audio`` delayed (the noise was taken out of it)."""
    change = out[DELAY:] - audio[: len(audio) - DELAY]
    return float(np.std(change)) > 0.3 * float(np.std(audio))


def local_denoise(audio: np.ndarray) -> np.ndarray:
    engine = load_denoise({"max_streams": 16, "threads": 1, "max_wait_ms": 8.0})
    try:
        state = engine.new_state(engine.validate_options({}))
        return run(engine, state, audio)
    finally:
        engine.close()


def test_hosted_denoise_gives_what_local_denoise_gives(
    denoise: HostedTransformEngine, noisy: np.ndarray
):
    state = denoise.new_state(denoise.validate_options({}))
    hosted = run(denoise, state, noisy)
    local = local_denoise(noisy)
    assert hosted.shape == local.shape == noisy.shape
    np.testing.assert_allclose(hosted, local, atol=1e-5)
    assert not_passed_through(hosted, noisy)
    assert denoise.delay_ms == 30 and denoise.sample_rate == 48_000
    denoise.close_state(state)


def test_a_killed_host_fails_one_chunk_then_passes_audio_through_until_it_is_back(
    host: HostProcess, denoise: HostedTransformEngine, noisy: np.ndarray
):
    state = denoise.new_state(denoise.validate_options({}))
    run(denoise, state, noisy[: 10 * CHUNK])
    host.kill()
    with pytest.raises(EngineUnavailable):
        for k in range(20):  # the chunk the loss is found on fails; one only
            denoise.submit(state, noisy[k * CHUNK : (k + 1) * CHUNK]).result(5)
    assert denoise.reset_state(state, state.options) is state  # never raises, host down
    passed = run(denoise, state, noisy[: 20 * CHUNK])
    # Delayed as the engine's output is: the timing does not jump when it comes back.
    np.testing.assert_array_equal(passed[DELAY:], noisy[: 20 * CHUNK - DELAY])
    assert not not_passed_through(passed, noisy[: 20 * CHUNK])
    host.start()
    assert denoise.link.wait_until_ready(10)
    deadline = time.monotonic() + 5
    while not denoise._current(state):  # opened again in the background, on a chunk
        assert time.monotonic() < deadline, "the state was not opened on the new host"
        run(denoise, state, noisy[:CHUNK])
        time.sleep(0.05)
    out = run(denoise, state, noisy[: 50 * CHUNK])
    assert not_passed_through(out[10 * CHUNK :], noisy[10 * CHUNK : 50 * CHUNK])
    assert denoise.link.losses == 1


def test_bad_hops_and_requests_are_refused_and_the_host_serves_on(
    host: HostProcess, denoise: HostedTransformEngine, noisy: np.ndarray
):
    link = denoise.link
    state = denoise.new_state(denoise.validate_options({}))
    assert state.host_state is not None
    with pytest.raises(HostRefused) as refused:
        link.hop(999, link.generation, noisy[:CHUNK]).result(5)
    assert refused.value.code == "unknown_state"
    with pytest.raises(HostRefused) as refused:
        link.hop(state.host_state, link.generation, np.zeros(48_001, np.float32)).result(5)
    assert refused.value.code == "bad_hop"
    with pytest.raises(HostRefused) as refused:
        link.request({"t": "prompt", "state": state.host_state, "rate": 16000, "transcript": "x"})
    assert refused.value.code == "bad_prompt"  # a transform takes no voice
    with pytest.raises(HostRefused) as refused:
        link.request({"t": "reset", "state": 999})
    assert refused.value.code == "unknown_state"
    with pytest.raises(HostRefused) as refused:
        link.request({"t": "open", "engine": "denoise", "options": {"atten_lim_db": "loud"}})
    assert refused.value.code == "bad_options"
    assert len(run(denoise, state, noisy[: 5 * CHUNK])) == 5 * CHUNK  # still served
    link.request({"t": "reset", "state": state.host_state})
    assert host.process is not None and host.process.poll() is None


class InProcessHost:
    """The host's service on a loop thread of this process, so a test can read its engine."""

    def __init__(self, socket: Path) -> None:
        self.registry = EngineRegistry.load(["denoise"], {})
        self.service = ModelHost(self.registry, loops=2)
        self.thread = LoopThread("test-host")
        self.thread.submit(self.service.start(str(socket))).result(10)

    @property
    def engine(self) -> BatchedDenoiseEngine:
        engine = self.registry.get("denoise")
        assert isinstance(engine, BatchedDenoiseEngine)
        return engine

    def close(self) -> None:
        self.thread.stop(self.service.close())
        self.registry.close()


@pytest.fixture
def in_process_host(tmp_path: Path) -> Iterator[tuple[InProcessHost, Path]]:
    host = InProcessHost(tmp_path / "host.sock")
    yield host, tmp_path / "host.sock"
    host.close()


def test_every_workers_sessions_share_the_hosts_batch_steps(
    in_process_host: tuple[InProcessHost, Path], noisy: np.ndarray
):
    host, socket = in_process_host
    links = [HostLink(str(socket)) for _ in range(2)]  # two media workers
    try:
        engines = [hosted_engines(link, ["denoise"], wait=10)[0][0] for link in links]
        sessions = [
            (engine, engine.new_state(engine.validate_options({})))
            for engine in engines
            for _ in range(3)
        ]
        with ThreadPoolExecutor(len(sessions)) as callers:  # six calls at once
            outs = list(callers.map(lambda es: run(es[0], es[1], noisy[: 50 * CHUNK]), sessions))
        assert all(len(out) == 50 * CHUNK for out in outs)
        stats = host.engine.scheduler.stats
        assert stats.largest_batch == 6, stats  # both workers' sessions in one step
        assert stats.hops / stats.steps > 3, stats
        assert host.engine._model.open_slots == 6
        links[0].close()  # a worker goes: its sessions' slots are freed at once
        deadline = time.monotonic() + 5
        while host.engine._model.open_slots != 3:
            assert time.monotonic() < deadline, host.engine._model.open_slots
            time.sleep(0.02)
        engine, state = sessions[-1]
        assert len(run(engine, state, noisy[: 5 * CHUNK])) == 5 * CHUNK  # the other serves on
    finally:
        for link in links:
            link.close()


def test_a_session_that_closes_mid_chunk_does_not_fail_another_workers_chunk(
    in_process_host: tuple[InProcessHost, Path], noisy: np.ndarray
):
    """Sessions of two workers close and open while others stream: nobody else's chunk
    fails (a slot freed between a chunk's two steps used to fail the whole step)."""
    _, socket = in_process_host
    links = [HostLink(str(socket)) for _ in range(2)]
    failures: list[BaseException] = []
    stop = threading.Event()
    try:
        steady, churning = (hosted_engines(link, ["denoise"], wait=10)[0][0] for link in links)
        streams = [steady.new_state(steady.validate_options({})) for _ in range(3)]

        def stream(state: object) -> None:
            while not stop.is_set():
                try:
                    run(steady, state, noisy[: 10 * CHUNK])  # type: ignore[arg-type]
                except Exception as exc:  # what this test is about
                    failures.append(exc)

        def churn() -> None:
            while not stop.is_set():
                state = churning.new_state(churning.validate_options({}))
                churning.submit(state, noisy[:CHUNK])  # left in flight
                churning.close_state(state)

        threads = [threading.Thread(target=stream, args=(s,)) for s in streams]
        threads.append(threading.Thread(target=churn))
        for thread in threads:
            thread.start()
        time.sleep(3)
        stop.set()
        for thread in threads:
            thread.join(10)
        assert failures == []
    finally:
        stop.set()
        for link in links:
            link.close()


def test_on_a_loop_chunks_take_the_loops_own_channel_and_never_block_it(
    denoise: HostedTransformEngine, noisy: np.ndarray
):
    """``submit`` returns at once (the transform pipeline awaits the future on its loop);
    once the loop's channel has joined, the chunks go that way, and give what the link's
    way gives."""
    first = denoise.new_state(denoise.validate_options({}))
    second = denoise.new_state(denoise.validate_options({}))
    expected = run(denoise, first, noisy[: 50 * CHUNK])  # off a loop: the link's way

    async def submit_many() -> tuple[float, np.ndarray, int]:
        slowest, out = 0.0, []
        for k in range(50):
            began = time.perf_counter()
            future = denoise.submit(second, noisy[k * CHUNK : (k + 1) * CHUNK])
            slowest = max(slowest, time.perf_counter() - began)
            out.append(await asyncio.wrap_future(future))
        channel = denoise._channels[asyncio.get_running_loop()]
        return slowest, np.concatenate(out), channel.sent

    slowest, out, through_channel = asyncio.run(submit_many())
    assert slowest < 0.002
    assert through_channel >= 40  # all but the first few, sent while it connected
    np.testing.assert_allclose(out, expected, atol=1e-5)
