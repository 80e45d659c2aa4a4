"""Silero VAD and the speech detector, on the real ONNX model and espeak-ng speech."""

from __future__ import annotations

import asyncio
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from media.audio.vad import (
    START_MS,
    STOP_MS,
    WINDOW_MS,
    BatchedVad,
    SileroVad,
    SpeechDetector,
    SpeechEvent,
    SpeechEventKind,
    WindowCutter,
    model_path,
)
from media.pipeline.shared_vad import SharedVad
from peer.speech import SpeechFixture, add_white_noise

RATE = 48_000
CHUNK = 960  # 20 ms, what WebRTC delivers
WINDOW_48K = int(WINDOW_MS * RATE / 1000)  # 1536: one model window in input samples
NOISE_SECONDS = 4.0
# The detector decides at the end of a window, so the earliest start lies one window short of
# START_MS after the onset. The first sentence opens on a soft "Th": measured 151-320 ms.
START_LATE_MS = 500.0
STOP_LATE_MS = STOP_MS + 350.0  # measured 380 ms after the last audible sample


@pytest.fixture(scope="module")
def vad() -> SileroVad:
    return SileroVad()


def _probabilities(vad: SileroVad, signal: np.ndarray, chunk: int = CHUNK) -> np.ndarray:
    state = vad.new_state()
    out: list[float] = []
    for i in range(0, signal.size, chunk):
        out += vad.process(state, signal[i : i + chunk])
    return np.array(out)


def _events(vad: SileroVad, signal: np.ndarray) -> list[SpeechEvent]:
    state = vad.new_state()
    detector = SpeechDetector()
    events: list[SpeechEvent] = []
    for i in range(0, signal.size, CHUNK):
        events += detector.update(vad.process(state, signal[i : i + CHUNK]))
    return events


def _speech_fraction(mask: np.ndarray, windows: int) -> np.ndarray:
    """Per model window, the fraction of its input samples inside a sentence."""
    return mask[: windows * WINDOW_48K].reshape(windows, WINDOW_48K).mean(axis=1)


def _white_noise(level_dbfs: float, seed: int = 3) -> np.ndarray:
    noise = np.random.default_rng(seed).standard_normal(int(NOISE_SECONDS * RATE))
    return (noise * 10 ** (level_dbfs / 20)).astype(np.float32)


def _sentences_ms(mask: np.ndarray) -> list[tuple[float, float]]:
    edges = np.diff(mask.astype(np.int8))
    onsets = np.flatnonzero(edges == 1) + 1
    offsets = np.flatnonzero(edges == -1) + 1
    return [(on * 1000 / RATE, off * 1000 / RATE) for on, off in zip(onsets, offsets, strict=True)]


def test_model_loads_without_the_package_code() -> None:
    # Importing silero_vad's modules would import torch, which is not installed.
    assert model_path().is_file()
    SileroVad()
    assert "silero_vad.utils_vad" not in sys.modules


def test_speech_scores_high_and_pauses_low(vad: SileroVad, speech: SpeechFixture) -> None:
    probabilities = _probabilities(vad, speech.clean)
    inside = _speech_fraction(speech.speech_mask, probabilities.size)
    in_speech = probabilities[inside == 1.0]
    in_pauses = probabilities[inside == 0.0]
    # Measured: mean 0.89 and 89 % of windows >= 0.5 (espeak's gaps between words count
    # as speech here); pauses at most 0.02.
    assert np.mean(in_speech) > 0.75
    assert np.mean(in_speech >= 0.5) > 0.8
    assert in_pauses.size > 50
    assert np.max(in_pauses) < 0.1


@pytest.mark.parametrize("level_dbfs", [-40.0, -20.0])
def test_white_noise_scores_low(vad: SileroVad, level_dbfs: float) -> None:
    probabilities = _probabilities(vad, _white_noise(level_dbfs))
    # The resampler holds back a few samples, so the last window may still be open.
    assert probabilities.size >= int(NOISE_SECONDS * 1000 / WINDOW_MS) - 1
    assert np.max(probabilities) < 0.2  # measured at most 0.07


def test_noisy_speech_still_scores_high(vad: SileroVad, speech: SpeechFixture) -> None:
    probabilities = _probabilities(vad, add_white_noise(speech.clean, snr_db=5.0))
    inside = _speech_fraction(speech.speech_mask, probabilities.size)
    assert np.mean(probabilities[inside == 1.0] >= 0.5) > 0.8
    assert np.max(probabilities[inside == 0.0]) < 0.35  # measured 0.15


def test_chunk_size_does_not_change_probabilities(vad: SileroVad, speech: SpeechFixture) -> None:
    signal = speech.clean[: 5 * RATE]
    reference = _probabilities(vad, signal, CHUNK)
    for chunk in (480, 777, 4096):
        np.testing.assert_allclose(_probabilities(vad, signal, chunk), reference, atol=1e-6)


def test_interleaved_streams_keep_their_own_state(vad: SileroVad, speech: SpeechFixture) -> None:
    talk = speech.clean[: 4 * RATE]
    noise = _white_noise(-30.0)[: talk.size]
    talk_state, noise_state = vad.new_state(), vad.new_state()
    talk_out: list[float] = []
    noise_out: list[float] = []
    for i in range(0, talk.size, CHUNK):
        talk_out += vad.process(talk_state, talk[i : i + CHUNK])
        noise_out += vad.process(noise_state, noise[i : i + CHUNK])
    np.testing.assert_allclose(talk_out, _probabilities(vad, talk), atol=1e-6)
    np.testing.assert_allclose(noise_out, _probabilities(vad, noise), atol=1e-6)


def test_streams_on_threads_share_the_session(vad: SileroVad, speech: SpeechFixture) -> None:
    signals = [speech.clean[: 4 * RATE], speech.clean[4 * RATE : 8 * RATE], _white_noise(-30.0)]
    with ThreadPoolExecutor(len(signals)) as pool:
        results = list(pool.map(lambda signal: _probabilities(vad, signal), signals))
    for signal, result in zip(signals, results, strict=True):
        np.testing.assert_allclose(result, _probabilities(vad, signal), atol=1e-6)


def test_reset_forgets_the_stream(vad: SileroVad, speech: SpeechFixture) -> None:
    state = vad.new_state()
    vad.process(state, speech.clean[: 2 * RATE])
    vad.reset(state)
    after = vad.process(state, speech.clean[: 2 * RATE])
    np.testing.assert_allclose(after, _probabilities(vad, speech.clean[: 2 * RATE]), atol=1e-6)


def test_detector_marks_each_sentence(vad: SileroVad, speech: SpeechFixture) -> None:
    events = _events(vad, speech.clean)
    sentences = _sentences_ms(speech.speech_mask)
    assert [e.kind for e in events] == [SpeechEventKind.START, SpeechEventKind.END] * len(sentences)
    for (onset, offset), start, end in zip(sentences, events[::2], events[1::2], strict=True):
        assert onset + START_MS - WINDOW_MS <= start.at_ms <= onset + START_LATE_MS
        # espeak pads each sentence with up to 300 ms of its own silence, inside the mask
        assert offset - STOP_LATE_MS <= end.at_ms <= offset + STOP_LATE_MS


def test_detector_stays_quiet_on_silence_and_noise(vad: SileroVad) -> None:
    quiet = np.zeros(2 * RATE, np.float32)
    assert _events(vad, np.concatenate([quiet, _white_noise(-40.0), _white_noise(-20.0)])) == []


def test_detector_hysteresis() -> None:
    """The thresholds and durations on a scripted run of window probabilities."""
    detector = SpeechDetector(start_threshold=0.5, stop_threshold=0.3, start_ms=150, stop_ms=100)
    assert detector.update([0.9, 0.9, 0.9, 0.9, 0.2]) == []  # four windows: 128 ms < 150 ms
    # Five windows reach 160 ms: speech starts on the fifth, at window 10 (320 ms).
    assert detector.update([0.6] * 5) == [SpeechEvent(SpeechEventKind.START, 10 * WINDOW_MS)]
    assert detector.speaking
    # Between the thresholds the state holds; four windows below 0.3 (128 ms) end it.
    assert detector.update([0.4, 0.4, 0.2, 0.2, 0.2, 0.35, 0.1, 0.1, 0.1]) == []
    assert detector.update([0.1]) == [SpeechEvent(SpeechEventKind.END, 20 * WINDOW_MS)]
    assert not detector.speaking


def test_detector_rejects_inverted_thresholds() -> None:
    with pytest.raises(ValueError):
        SpeechDetector(start_threshold=0.3, stop_threshold=0.5)


def test_the_batched_model_scores_every_stream_as_the_single_one_does(
    vad: SileroVad, speech: SpeechFixture
) -> None:
    """Many streams in one call (different audio each) score bit for bit as alone."""
    streams = [speech.clean, 0.5 * speech.clean, np.zeros_like(speech.clean)]
    alone = []
    for audio in streams:
        state = vad.new_state()
        alone.append(
            [p for i in range(0, len(audio), 960) for p in vad.process(state, audio[i : i + 960])]
        )
    model = BatchedVad(capacity=2)  # grows to hold the third
    slots = [model.open_slot() for _ in streams]
    cutters = [WindowCutter() for _ in streams]
    windows = [
        [w for i in range(0, len(a), 960) for w in cutter.cut(a[i : i + 960])]
        for a, cutter in zip(streams, cutters, strict=True)
    ]
    together = np.stack(
        [
            model.process(slots, np.stack([w[k] for w in windows])).ravel()
            for k in range(len(windows[0]))
        ]
    )
    for index, expected in enumerate(alone):
        np.testing.assert_array_equal(together[:, index], np.asarray(expected, np.float32))


def test_a_reset_slot_starts_fresh_and_leaves_the_others_alone(speech: SpeechFixture) -> None:
    model = BatchedVad(capacity=4)
    a, b = model.open_slot(), model.open_slot()
    cutter = WindowCutter()
    windows = [w for i in range(0, 48_000, 960) for w in cutter.cut(speech.clean[i : i + 960])]
    first = [model.process([a, b], np.stack([w, w])) for w in windows]
    model.reset_slot(a)
    again = [model.process([a], np.stack([w])) for w in windows]
    np.testing.assert_array_equal(np.concatenate(again), np.concatenate([f[:1] for f in first]))


async def test_the_shared_vad_scores_sessions_together_in_one_step(speech: SpeechFixture):
    shared = SharedVad()
    try:
        streams = [shared.open() for _ in range(4)]
        chunk = speech.clean[48_000 : 48_000 + 4 * 960]
        results = await asyncio.gather(*(s.probabilities([chunk]) for s in streams))
        assert shared._scheduler.stats.largest_batch == 4
        assert all(r == results[0] for r in results)
        for stream in streams:
            stream.close()
    finally:
        shared.close()
