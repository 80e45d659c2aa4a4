"""Conversion between the frames aiortc hands over and the float32 mono engines work on."""

from __future__ import annotations

from fractions import Fraction

import av
import numpy as np
import pytest

from media.audio.frames import FRAME_SAMPLES, RTC_RATE, TIME_BASE, frame_to_mono, mono_to_frame

STEP = 1 / 32768


def s16_stereo_frame(left: np.ndarray, right: np.ndarray) -> av.AudioFrame:
    """What aiortc's Opus decoder produces: s16 packed (interleaved) stereo at 48 kHz."""
    interleaved = np.stack([left, right], axis=1).astype(np.int16).reshape(1, -1)
    frame = av.AudioFrame.from_ndarray(interleaved, format="s16", layout="stereo")
    frame.sample_rate = RTC_RATE
    return frame


def channels_of(frame: av.AudioFrame) -> np.ndarray:
    """Samples of an s16 packed frame as (channels, samples)."""
    data = frame.to_ndarray()
    return data.reshape(-1, len(frame.layout.channels)).T


def test_the_constants_describe_a_20_ms_frame_at_48_khz() -> None:
    assert RTC_RATE == 48_000
    assert FRAME_SAMPLES == 960
    assert Fraction(1, 48_000) == TIME_BASE


def test_frame_to_mono_averages_the_channels_of_an_s16_stereo_frame() -> None:
    left = np.full(FRAME_SAMPLES, 1000)
    right = np.full(FRAME_SAMPLES, 3000)
    mono = frame_to_mono(s16_stereo_frame(left, right))
    assert mono.dtype == np.float32
    assert mono.shape == (FRAME_SAMPLES,)
    np.testing.assert_allclose(mono, 2000 / 32768, rtol=0, atol=1e-7)


def test_frame_to_mono_does_not_mix_neighbouring_samples_of_interleaved_data() -> None:
    """Packed stereo is L R L R ...: a wrong reshape would average along time instead."""
    left = np.arange(FRAME_SAMPLES) * 10
    right = np.zeros(FRAME_SAMPLES)
    mono = frame_to_mono(s16_stereo_frame(left, right))
    np.testing.assert_allclose(mono, (left + right) / 2 / 32768, rtol=0, atol=1e-7)


def test_frame_to_mono_scales_full_scale_s16_to_minus_one_and_almost_one() -> None:
    extremes = np.tile([32767, -32768], FRAME_SAMPLES // 2)
    mono = frame_to_mono(s16_stereo_frame(extremes, extremes))
    assert mono.max() == pytest.approx(32767 / 32768)
    assert mono.min() == -1.0
    assert np.all(np.abs(mono) <= 1.0)


def test_opposite_channels_cancel_to_silence() -> None:
    signal = np.linspace(-20000, 20000, FRAME_SAMPLES).astype(np.int16)
    mono = frame_to_mono(s16_stereo_frame(signal, -signal))
    np.testing.assert_allclose(mono, 0.0, atol=1e-7)


def test_frame_to_mono_averages_planar_float_channels() -> None:
    left = np.linspace(-0.5, 0.5, FRAME_SAMPLES, dtype=np.float32)
    right = np.full(FRAME_SAMPLES, 0.25, dtype=np.float32)
    frame = av.AudioFrame.from_ndarray(np.stack([left, right]), format="fltp", layout="stereo")
    mono = frame_to_mono(frame)
    assert mono.dtype == np.float32
    np.testing.assert_allclose(mono, (left + right) / 2, rtol=0, atol=1e-7)


def test_frame_to_mono_averages_planar_s16_channels_and_scales_them() -> None:
    planes = np.stack([np.full(FRAME_SAMPLES, -8000), np.full(FRAME_SAMPLES, -4000)])
    frame = av.AudioFrame.from_ndarray(planes.astype(np.int16), format="s16p", layout="stereo")
    np.testing.assert_allclose(frame_to_mono(frame), -6000 / 32768, rtol=0, atol=1e-7)


def test_frame_to_mono_passes_mono_float_through_unchanged() -> None:
    samples = np.linspace(-1, 1, FRAME_SAMPLES, dtype=np.float32)
    frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="flt", layout="mono")
    np.testing.assert_array_equal(frame_to_mono(frame), samples)


def test_frame_to_mono_scales_mono_s16() -> None:
    samples = np.arange(-480, 480, dtype=np.int16) * 64
    frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
    mono = frame_to_mono(frame)
    assert mono.dtype == np.float32
    np.testing.assert_allclose(mono, samples / 32768, rtol=0, atol=1e-7)


def test_mono_to_frame_builds_s16_packed_stereo_with_equal_channels() -> None:
    """Mono would be upmixed by the encoder at -3 dB; both channels must carry the signal."""
    samples = np.sin(np.linspace(0, 20, FRAME_SAMPLES)).astype(np.float32) * 0.8
    frame = mono_to_frame(samples, pts=4800)
    assert frame.format.name == "s16"
    assert not frame.format.is_planar
    assert frame.layout.name == "stereo"
    assert frame.samples == FRAME_SAMPLES
    left, right = channels_of(frame)
    np.testing.assert_array_equal(left, right)
    np.testing.assert_allclose(left / 32768, samples, rtol=0, atol=STEP)


def test_mono_to_frame_sets_pts_rate_and_time_base() -> None:
    frame = mono_to_frame(np.zeros(FRAME_SAMPLES, dtype=np.float32), pts=123 * FRAME_SAMPLES)
    assert frame.pts == 123 * FRAME_SAMPLES
    assert frame.sample_rate == 48_000
    assert frame.time_base == Fraction(1, 48_000)


def test_mono_to_frame_uses_the_given_rate_for_time_base() -> None:
    frame = mono_to_frame(np.zeros(320, dtype=np.float32), pts=0, rate=16_000)
    assert frame.sample_rate == 16_000
    assert frame.time_base == Fraction(1, 16_000)
    assert frame.samples == 320


def test_mono_to_frame_clips_beyond_full_scale_instead_of_wrapping_around() -> None:
    """Without the clip, 1.5 * 32768 cast to int16 would wrap to a large negative value."""
    samples = np.array([1.5, -1.5, 1.0, -1.0, 40.0, -40.0, 0.999, -0.999], dtype=np.float32)
    left, right = channels_of(mono_to_frame(samples, pts=0))
    np.testing.assert_array_equal(left, right)
    expected = [32767, -32768, 32767, -32768, 32767, -32768, 32735, -32735]
    np.testing.assert_array_equal(left, expected)


def test_mono_to_frame_does_not_modify_its_input() -> None:
    samples = np.array([2.0, -0.5, 0.25], dtype=np.float32)
    mono_to_frame(samples, pts=0)
    np.testing.assert_array_equal(samples, [2.0, -0.5, 0.25])


def test_a_round_trip_through_a_frame_is_exact_within_one_s16_step() -> None:
    rng = np.random.default_rng(3)
    samples = rng.uniform(-1, 1, FRAME_SAMPLES).astype(np.float32)
    samples[:4] = [1.0, -1.0, 0.0, STEP]
    back = frame_to_mono(mono_to_frame(samples, pts=0))
    assert back.dtype == np.float32
    assert back.shape == samples.shape
    assert np.max(np.abs(back - samples)) <= STEP


def test_a_round_trip_of_s16_values_is_lossless() -> None:
    """Samples already on the s16 grid survive both conversions bit for bit."""
    grid = np.arange(-32768, 32768, 64, dtype=np.int16)[:FRAME_SAMPLES]
    samples = (grid / 32768).astype(np.float32)
    np.testing.assert_array_equal(frame_to_mono(mono_to_frame(samples, pts=0)), samples)
