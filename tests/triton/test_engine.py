"""``cosyvoice-triton`` against a real Triton server (the stand-in), through the engine."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from media.engines.cosyvoice_triton.contract import OUTPUT_RATE
from media.engines.cosyvoice_triton.engine import FRAME_SAMPLES, CosyVoiceTritonEngine
from media.engines.cosyvoice_triton.stream import RemoteSynthesisFailed
from scripts.triton_standin import pitch_hz, seconds_for
from tests.triton.conftest import Served, needs_triton

pytestmark = needs_triton


def dominant_hz(audio: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(audio * np.hanning(len(audio))))
    return float(np.argmax(spectrum) * rate / len(audio))


def speak(engine: CosyVoiceTritonEngine, state, text: str) -> np.ndarray:
    frames = list(engine.synthesize(state, text, threading.Event()))
    return np.concatenate(frames)


def test_speech_streams_in_20_ms_frames_with_the_tone_of_its_text(served: Served):
    engine = served.engine
    state = engine.new_state(engine.validate_options({}))
    text = "The weather today is sunny and warm."
    frames = list(engine.synthesize(state, text, threading.Event()))
    assert {len(frame) for frame in frames[:-1]} == {FRAME_SAMPLES}
    audio = np.concatenate(frames)
    assert len(audio) == round(seconds_for(text) * OUTPUT_RATE)
    assert abs(dominant_hz(audio, OUTPUT_RATE) - pitch_hz(text)) < 2
    assert state.first_frame_s is not None and state.first_frame_s < 1.0
    (request,) = served.standin.events("request", id=state.last_request)
    assert request["target_text"] == text
    assert request["reference_text"] is None and request["reference_shape"] is None
    assert served.standin.events("finished", id=state.last_request)


def test_a_voice_prompt_reaches_the_server_as_its_reference_inputs(served: Served):
    """A 2 s clip uploaded at 48 kHz is sent as reference_wav [1, 32000] at 16 kHz, with its
    length and transcript, as the official client sends a prompt."""
    engine = served.engine
    state = engine.new_state(engine.validate_options({}))
    clip = 0.1 * np.sin(np.arange(96_000) / 10).astype(np.float32)
    engine.set_prompt(state, clip, 48_000, "This is my voice.")
    speak(engine, state, "Say it in my voice.")
    (request,) = served.standin.events("request", id=state.last_request)
    assert request["reference_text"] == "This is my voice."
    assert request["reference_shape"] == [1, 32_000]
    assert request["reference_samples"] == 32_000


def test_eight_concurrent_streams_each_get_their_own_speech(served: Served):
    """Eight sessions at once: eight streams open on the server together, and every one
    gets the tone of its own text."""
    engine = served.engine
    texts = [f"Caller number {n} asks about the weather." for n in range(8)]
    states = [engine.new_state(engine.validate_options({})) for _ in texts]
    start = threading.Barrier(len(texts))

    def one(index: int) -> float:
        start.wait()
        audio = speak(engine, states[index], texts[index])
        return dominant_hz(audio, OUTPUT_RATE)

    began = time.monotonic()
    with ThreadPoolExecutor(len(texts)) as pool:
        heard = list(pool.map(one, range(len(texts))))
    took = time.monotonic() - began
    for text, hz in zip(texts, heard, strict=True):
        assert abs(hz - pitch_hz(text)) < 2, text
    ids = {state.last_request for state in states}
    requests = [event for event in served.standin.events("request") if event["id"] in ids]
    finishes = [event for event in served.standin.events("finished") if event["id"] in ids]
    assert len(requests) == len(finishes) == 8
    assert max(event["at"] for event in requests) < min(event["at"] for event in finishes)
    # Streamed side by side: about one utterance's time, far from eight of them.
    assert took < 3 * seconds_for(texts[0]) / 2


def test_a_cancel_closes_the_stream_and_the_server_sees_it_within_one_chunk(served: Served):
    engine = served.engine
    state = engine.new_state(engine.validate_options({}))
    cancel = threading.Event()
    text = "A long answer that goes on and on. " * 8
    for frames, _ in enumerate(engine.synthesize(state, text, cancel), 1):
        if frames == 25:
            cancel.set()
            cancelled_at = time.monotonic()
    time.sleep(0.2)
    request = state.last_request
    (seen,) = served.standin.events("cancelled", id=request)
    late = [e for e in served.standin.events("chunk", id=request) if e["at"] > cancelled_at]
    assert len(late) <= 1, f"{len(late)} chunks after the cancel"
    assert seen["at"] - cancelled_at < 0.05
    assert not served.standin.events("finished", id=request)
    assert engine.active_streams == 0


def test_a_model_error_fails_the_utterance_with_the_servers_message(served: Served):
    engine = served.engine
    state = engine.new_state(engine.validate_options({}))
    with pytest.raises(RemoteSynthesisFailed, match="the stand-in was asked to fail"):
        speak(engine, state, "fail: on the second chunk")
    assert engine.unavailable_reason is None  # one request failed; the server is fine
    assert len(speak(engine, state, "And the next one works.")) > 0
