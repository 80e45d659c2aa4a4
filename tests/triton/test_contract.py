"""``cosyvoice-triton`` without a server: the runtime's contract, the frame queue, settings."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from media.audio.wav import write_wav
from media.engines.cosyvoice_triton.contract import (
    EMPTY_FINAL_RESPONSE,
    MODEL_NAME,
    REFERENCE_RATE,
    ContractError,
    Reference,
    ServedModel,
    build_request,
    served_model,
)
from media.engines.cosyvoice_triton.voices import PromptError, reference_from_clip, speakers_from
from media.engines.plugin import EngineSettingsError
from media.engines.registry import EngineRegistry, plan
from media.engines.streamed_frames import CANCEL_CHECK_S, FrameQueue, NoAudioInTime
from scripts.triton_standin import CONFIG

SERVED = ServedModel(batched=True, references_optional=True)


def standin_config() -> model_config_pb2.ModelConfig:
    text = CONFIG.format(
        name=MODEL_NAME, chunk_ms=20, interval_ms=10, first_delay_ms=0, events="/dev/null"
    )
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def test_the_standins_config_is_the_contract_the_engine_checks():
    """The stand-in's config.pbtxt is the official one (filled, decoupled): the engine's check
    accepts it, with a batch dimension and optional reference inputs."""
    assert served_model(standin_config()) == SERVED


def test_a_model_that_is_not_decoupled_is_refused_with_the_setting_to_change():
    """run.sh fills the official config with decoupled_mode:False by default; that model
    answers once at the end, so the engine refuses it and says what to set."""
    config = standin_config()
    config.model_transaction_policy.decoupled = False
    with pytest.raises(ContractError, match="decoupled_mode:True"):
        served_model(config)


def test_a_model_with_other_tensors_is_refused_naming_the_tensor():
    config = standin_config()
    config.output[0].data_type = model_config_pb2.TYPE_FP16
    with pytest.raises(ContractError, match="output 'waveform' is TYPE_FP16"):
        served_model(config)
    del config.input[3]
    with pytest.raises(ContractError, match="no input 'target_text'"):
        served_model(config)


def inputs_of(request) -> dict[str, tuple[str, list[int], bytes]]:
    return {
        tensor.name: (tensor.datatype, list(tensor.shape), raw)
        for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=True)
    }


def test_the_cached_speaker_sends_the_target_text_alone():
    """As ``client_grpc.py --use-spk2info-cache``: target_text only, [1, 1] BYTES, and the
    request asks for the empty final response that marks the end of a decoupled stream."""
    request = build_request(MODEL_NAME, "r1", "Héllo.", None, SERVED)
    assert request.model_name == "cosyvoice2" and request.id == "r1"
    text = "Héllo.".encode()
    assert inputs_of(request) == {
        "target_text": ("BYTES", [1, 1], len(text).to_bytes(4, "little") + text)
    }
    assert [output.name for output in request.outputs] == ["waveform"]
    assert request.parameters[EMPTY_FINAL_RESPONSE].bool_param is True


def test_a_reference_is_sent_as_the_runtimes_four_inputs():
    audio = np.linspace(-0.5, 0.5, 16_000, dtype=np.float32)
    request = build_request(MODEL_NAME, "r2", "Target.", Reference(audio, "Prompt."), SERVED)
    inputs = inputs_of(request)
    assert list(inputs) == ["reference_wav", "reference_wav_len", "reference_text", "target_text"]
    datatype, shape, raw = inputs["reference_wav"]
    assert (datatype, shape) == ("FP32", [1, 16_000])
    np.testing.assert_array_equal(np.frombuffer(raw, "<f4"), audio)
    datatype, shape, raw = inputs["reference_wav_len"]
    assert (datatype, shape, np.frombuffer(raw, "<i4").tolist()) == ("INT32", [1, 1], [16_000])
    assert inputs["reference_text"][:2] == ("BYTES", [1, 1])
    assert inputs["reference_text"][2][4:] == b"Prompt."


def test_an_unbatched_model_gets_tensors_without_the_batch_dimension():
    unbatched = ServedModel(batched=False, references_optional=True)
    request = build_request(MODEL_NAME, "r3", "Hi.", None, unbatched)
    assert inputs_of(request)["target_text"][1] == [1]


# --- the frame queue ----------------------------------------------------------------------


@pytest.fixture
def loop():
    """A loop in a thread of its own, as the engine's link has."""
    running = asyncio.new_event_loop()
    thread = threading.Thread(target=running.run_forever, daemon=True)
    thread.start()
    yield running
    running.call_soon_threadsafe(running.stop)
    thread.join(5)
    running.close()


def put(loop: asyncio.AbstractEventLoop, queue: FrameQueue, samples: np.ndarray):
    return asyncio.run_coroutine_threadsafe(queue.put(samples), loop)


def test_chunks_of_any_size_come_out_in_whole_frames_and_a_short_last_one(loop):
    queue = FrameQueue(480, 48_000, loop)
    audio = np.arange(2500, dtype=np.float32)
    for part in np.split(audio, [700, 1900, 2000]):
        put(loop, queue, part).result(2)
    queue.end()
    never = threading.Event()
    frames = []
    while (frame := queue.take(never, 1.0)) is not None:
        frames.append(frame)
    assert [len(frame) for frame in frames] == [480] * 5 + [100]
    np.testing.assert_array_equal(np.concatenate(frames), audio)


def test_a_full_queue_holds_back_the_reader_until_frames_are_taken(loop):
    """A session that stops pulling holds at most the limit plus one chunk; the reader on
    the loop waits (and with it, the stream) until the session takes frames again."""
    queue = FrameQueue(480, 4800, loop)
    chunk = np.zeros(2000, np.float32)
    for _ in range(3):
        put(loop, queue, chunk).result(2)  # 6000 held: past the limit
    blocked = put(loop, queue, chunk)
    time.sleep(0.1)
    assert not blocked.done() and queue.held == 6000
    never = threading.Event()
    for _ in range(3):  # 4560 left: below the limit again
        queue.take(never, 1.0)
    blocked.result(2)
    assert queue.peak <= queue.limit + len(chunk)


def test_a_cancel_wakes_a_thread_waiting_for_audio(loop):
    queue = FrameQueue(480, 4800, loop)
    cancel = threading.Event()
    threading.Timer(0.05, cancel.set).start()
    began = time.monotonic()
    assert queue.take(cancel, 5.0) is None
    assert time.monotonic() - began < 0.05 + 3 * CANCEL_CHECK_S


def test_a_silent_server_fails_the_utterance_after_the_chunk_timeout(loop):
    queue = FrameQueue(480, 4800, loop)
    with pytest.raises(NoAudioInTime, match=r"0\.05 s"):
        queue.take(threading.Event(), 0.05)


def test_audio_before_an_error_is_played_then_the_error_raised(loop):
    queue = FrameQueue(480, 4800, loop)
    put(loop, queue, np.ones(960, np.float32)).result(2)
    queue.end(RuntimeError("boom"))
    never = threading.Event()
    assert len(queue.take(never, 1.0)) == 480
    assert len(queue.take(never, 1.0)) == 480
    with pytest.raises(RuntimeError, match="boom"):
        queue.take(never, 1.0)


# --- voices and settings ------------------------------------------------------------------


def test_a_prompt_clip_is_resampled_to_the_runtimes_16_khz():
    clip = np.zeros(48_000, np.float32)
    reference = reference_from_clip(clip, 48_000, "  One second.  ")
    assert reference.text == "One second."
    assert abs(len(reference.audio) - REFERENCE_RATE) <= 1


@pytest.mark.parametrize(
    ("seconds", "transcript", "message"),
    [(2.0, " ", "transcript"), (0.2, "Hi.", "0.5-30 s"), (31.0, "Hi.", "0.5-30 s")],
)
def test_a_prompt_the_runtime_cannot_clone_is_refused(seconds, transcript, message):
    with pytest.raises(PromptError, match=message):
        reference_from_clip(np.zeros(int(seconds * 8000), np.float32), 8000, transcript)


def test_named_speakers_are_clips_with_their_transcripts(tmp_path: Path):
    write_wav(tmp_path / "ana.wav", np.zeros(24_000, np.float32), 24_000)
    (tmp_path / "ana.txt").write_text("Hello, I am Ana.\n", encoding="utf-8")
    speakers = speakers_from(tmp_path)
    assert list(speakers) == ["ana"] and speakers["ana"].text == "Hello, I am Ana."
    write_wav(tmp_path / "bo.wav", np.zeros(24_000, np.float32), 24_000)
    with pytest.raises(ValueError, match=r"bo\.wav has no transcript bo\.txt"):
        speakers_from(tmp_path)


def test_without_a_url_the_engine_is_unavailable_and_says_what_to_set():
    registry = EngineRegistry.load(["cosyvoice-triton"])
    assert registry.names == []
    assert "cosyvoice-triton.url=HOST:PORT" in registry.unavailable["cosyvoice-triton"]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("url", "localhost", "HOST:PORT"),
        ("tls", "maybe", "true or false"),
        ("chunk_timeout", "0", "above 0"),
        ("tls_ca", "/no/such.pem", "PEM file"),
    ],
)
def test_a_bad_setting_fails_start_up_naming_it(key: str, value: str, message: str):
    with pytest.raises(EngineSettingsError, match=f"cosyvoice-triton.{key}=.*{message}"):
        plan(["cosyvoice-triton"], {"cosyvoice-triton": {key: value}})
