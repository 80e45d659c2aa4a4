"""Front-end features: the frame rates and shapes the ONNX models and the flow expect."""

from __future__ import annotations

import numpy as np

from media.engines.cosyvoice.features import (
    kaldi_fbank,
    prompt_mel,
    slaney_mel_filters,
    whisper_log_mel,
)


def noise(seconds: float, rate: int) -> np.ndarray:
    return (0.1 * np.random.default_rng(0).standard_normal(int(seconds * rate))).astype(np.float32)


def test_whisper_log_mel_is_128_bands_at_100_frames_per_second():
    mel = whisper_log_mel(noise(2.0, 16_000))
    assert mel.shape == (128, 200)
    assert mel.max() - mel.min() <= 2.0 + 1e-6  # 8 decades, scaled by 1/4


def test_kaldi_fbank_has_one_frame_per_10_ms_without_edge_padding():
    assert kaldi_fbank(noise(2.0, 16_000)).shape == (198, 80)
    assert kaldi_fbank(noise(0.01, 16_000)).shape == (0, 80)


def test_prompt_mel_has_exactly_two_frames_per_speech_token():
    """480 samples per frame at 24 kHz: 50 frames a second, two per 25 Hz token."""
    assert prompt_mel(noise(1.2, 24_000)).shape == (60, 80)


def test_slaney_filters_are_area_normalised_triangles():
    filters = slaney_mel_filters(24_000, 1920, 80, 8000.0).numpy()
    assert filters.shape == (80, 961) and filters.min() >= 0
    bin_hz = 24_000 / 1920
    areas = filters.sum(axis=1) * bin_hz
    assert np.allclose(areas[10:], 1.0, rtol=0.05)  # narrow low bands are coarsely sampled
