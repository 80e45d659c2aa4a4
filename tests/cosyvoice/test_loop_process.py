"""Batch loops in processes of their own (``cosyvoice.batch_loops``), on the tiny model."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from media.engines.base import EngineUnavailable
from media.engines.cosyvoice import loader
from media.engines.cosyvoice.loop_process import LoopProcess
from media.engines.cosyvoice.speak import CosyVoiceEngine, CosyVoiceState
from media.engines.cosyvoice.tokens import LlmFailed, LlmRequest
from tests.cosyvoice.conftest import SENTENCE


@pytest.fixture(scope="module")
def two_loops(tiny_model_dir: Path) -> Iterator[CosyVoiceEngine]:
    engine = loader.load_speak({"model": tiny_model_dir, "batch_loops": 2})
    assert isinstance(engine, CosyVoiceEngine)
    yield engine
    engine.close()


def seeded(engine: CosyVoiceEngine, seed: int) -> CosyVoiceState:
    return engine.new_state(engine.validate_options({"seed": seed}))


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_an_utterance_speaks_the_same_in_a_loop_process(two_loops: CosyVoiceEngine):
    """Two sessions with one seed, the second placed while the first holds this process's
    loop: it goes to the loop process, both draw the same tokens (as long audio, and their
    generators end in the same state, so their next utterances draw alike too). The samples
    themselves differ by the vocoder's excitation noise, drawn from each process's own
    torch generator, as they do between two utterances in one process."""
    (process,) = two_loops.loop_processes
    assert two_loops.batcher is not None
    here, there = seeded(two_loops, 5), seeded(two_loops, 5)
    first = two_loops.synthesize(here, SENTENCE, threading.Event())
    second = two_loops.synthesize(there, SENTENCE, threading.Event())
    audio_here, audio_there = [next(first)], [next(second)]
    assert two_loops.batcher.active == 1 and process.active == 1
    audio_here += list(first)
    audio_there += list(second)
    assert wait_until(lambda: process.active == 0)
    assert len(np.concatenate(audio_here)) == len(np.concatenate(audio_there))
    assert here.generator.get_state().equal(there.generator.get_state())


def test_a_cancel_reaches_the_loop_process(two_loops: CosyVoiceEngine):
    (process,) = two_loops.loop_processes
    hold = two_loops.synthesize(seeded(two_loops, 1), SENTENCE, threading.Event())
    next(hold)  # this process's loop has one utterance: the next goes to the process
    cancel = threading.Event()
    remote = two_loops.synthesize(seeded(two_loops, 2), SENTENCE, cancel)
    next(remote)
    assert process.active == 1
    cancel.set()
    began = time.monotonic()
    assert list(remote) == []
    assert wait_until(lambda: process.active == 0, 1.0)
    assert time.monotonic() - began < 1.0
    list(hold)
    state = seeded(two_loops, 3)
    assert len(np.concatenate(list(two_loops.synthesize(state, "Hi there.", threading.Event()))))


def test_a_loop_process_that_dies_fails_its_utterances_and_takes_no_more(tiny_model_dir: Path):
    process = LoopProcess({"model": tiny_model_dir})
    engine = loader.load_speak({"model": tiny_model_dir})
    try:
        process.wait_ready()
        state = seeded(engine, 4)
        assert engine.batcher is not None
        request = LlmRequest(
            text=np.array([11, 12, 13, 14, 15, 16, 17, 18] * 3),
            prompt_text=state.prompt.text,
            prompt_tokens=state.prompt.tokens,
        )
        from media.engines.cosyvoice.schedule import HopSchedule

        schedule = HopSchedule(engine.chunk, state.prompt.flow.length)
        utterance = process.speak(
            request, state.prompt, state.generator, schedule, threading.Event()
        )
        chunks = utterance.audio()
        next(chunks)
        os.kill(process.pid, signal.SIGKILL)
        with pytest.raises(LlmFailed, match="exited"):
            list(chunks)
        assert wait_until(lambda: not process.alive)
        with pytest.raises(LlmFailed, match="stopped"):
            process.speak(request, state.prompt, state.generator, schedule, threading.Event())
    finally:
        process.close()
        engine.close()


def test_a_loop_process_that_cannot_load_says_why(tmp_path: Path):
    process = LoopProcess({"model": tmp_path})
    with pytest.raises(LlmFailed, match="failed to load: EngineUnavailable"):
        process.wait_ready()


@pytest.mark.parametrize(
    "values",
    [{"device": "cuda", "batch_loops": 2}, {"batching": False, "batch_loops": 2}],
)
def test_more_loops_are_for_batching_on_a_cpu(tiny_model_dir: Path, values: dict[str, object]):
    with pytest.raises(EngineUnavailable, match="batch_loops"):
        loader.load_speak({"model": tiny_model_dir, **values})


def test_a_dead_loop_process_is_replaced(two_loops: CosyVoiceEngine):
    """Killed: the next placement goes to this process's loop and starts a new process,
    which then takes utterances and draws as this process's loop does."""
    (dead,) = two_loops.loop_processes
    os.kill(dead.pid, signal.SIGKILL)
    assert wait_until(lambda: not dead.alive)
    assert two_loops._least_loaded() is two_loops.batcher
    assert wait_until(lambda: two_loops.loop_processes[0] is not dead, 120.0)
    (fresh,) = two_loops.loop_processes
    assert fresh.alive and fresh.pid != dead.pid
    here, there = seeded(two_loops, 6), seeded(two_loops, 6)
    first = two_loops.synthesize(here, SENTENCE, threading.Event())
    second = two_loops.synthesize(there, SENTENCE, threading.Event())
    audio_here, audio_there = [next(first)], [next(second)]
    assert fresh.active == 1
    audio_here += list(first)
    audio_there += list(second)
    assert len(np.concatenate(audio_here)) == len(np.concatenate(audio_there))
    assert here.generator.get_state().equal(there.generator.get_state())
