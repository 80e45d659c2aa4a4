"""One resampler per stream: chunking must not change the signal or put clicks at the joins."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from media.audio.resample import StreamResampler

TONE_HZ = 440.0
AMPLITUDE = 0.5
# Irregular chunk sizes, including a single sample and chunks that produce no output.
CHUNK_SIZES = [100, 441, 960, 1, 3000, 7, 2048, 513, 1, 1, 960, 333]
RATE_PAIRS = [(22_050, 48_000), (48_000, 16_000), (16_000, 48_000), (48_000, 24_000)]


def sine(rate: int, seconds: float = 1.0) -> np.ndarray:
    t = np.arange(round(rate * seconds)) / rate
    return (AMPLITUDE * np.sin(2 * np.pi * TONE_HZ * t)).astype(np.float32)


def chunks(signal: np.ndarray, sizes: list[int] = CHUNK_SIZES) -> list[np.ndarray]:
    out, pos = [], 0
    for size in itertools.cycle(sizes):
        if pos >= len(signal):
            return out
        out.append(signal[pos : pos + size])
        pos += size
    raise AssertionError("unreachable")


def resample_in_chunks(resampler: StreamResampler, signal: np.ndarray) -> np.ndarray:
    parts = chunks(signal)
    outs = [resampler.process(part, last=i == len(parts) - 1) for i, part in enumerate(parts)]
    return np.concatenate(outs)


def largest_step(signal: np.ndarray, rate: int) -> float:
    """Largest sample-to-sample step relative to what the tone's steepest slope allows.

    The first and last 2 ms are left out: the tone itself switches on and off abruptly
    there, and the band-limited result rings a little whatever the chunking.
    """
    edge = rate // 500
    allowed = 2 * np.pi * TONE_HZ / rate * AMPLITUDE
    return float(np.max(np.abs(np.diff(signal[edge:-edge]))) / allowed)


@pytest.mark.parametrize(("in_rate", "out_rate"), RATE_PAIRS)
def test_resampling_in_irregular_chunks_matches_resampling_in_one_go(
    in_rate: int, out_rate: int
) -> None:
    signal = sine(in_rate)
    whole = StreamResampler(in_rate, out_rate).process(signal, last=True)
    chunked = resample_in_chunks(StreamResampler(in_rate, out_rate), signal)
    assert chunked.dtype == np.float32
    assert len(chunked) == len(whole)
    np.testing.assert_allclose(chunked, whole, rtol=0, atol=1e-5)


@pytest.mark.parametrize(("in_rate", "out_rate"), RATE_PAIRS)
def test_chunked_output_has_no_click_at_the_joins(in_rate: int, out_rate: int) -> None:
    """A resampler that lost its history between chunks would jump at every join."""
    chunked = resample_in_chunks(StreamResampler(in_rate, out_rate), sine(in_rate))
    assert largest_step(chunked, out_rate) <= 1.2


def test_the_click_check_catches_a_resampler_recreated_for_every_chunk() -> None:
    """The failure this module exists to prevent, shown to fail the check above."""
    in_rate, out_rate = 22_050, 48_000
    parts = chunks(sine(in_rate), [441, 960, 3000])
    restarted = np.concatenate(
        [StreamResampler(in_rate, out_rate).process(part, last=True) for part in parts]
    )
    assert largest_step(restarted, out_rate) > 1.2


@pytest.mark.parametrize(("in_rate", "out_rate"), RATE_PAIRS)
def test_last_drains_the_tail_so_the_length_follows_the_rate_ratio(
    in_rate: int, out_rate: int
) -> None:
    signal = sine(in_rate, seconds=0.5)
    expected = len(signal) * out_rate / in_rate
    resampler = StreamResampler(in_rate, out_rate)
    held_back = resampler.process(signal)
    # Without ``last`` the filter keeps its delay line; the tail comes with the drain.
    assert len(held_back) < expected - 10
    tail = resampler.process(np.zeros(0, dtype=np.float32), last=True)
    assert abs(len(held_back) + len(tail) - expected) <= 1
    chunked = resample_in_chunks(StreamResampler(in_rate, out_rate), signal)
    assert abs(len(chunked) - expected) <= 1


def test_the_tone_keeps_its_level_and_frequency_through_the_resampler() -> None:
    in_rate, out_rate = 22_050, 48_000
    out = resample_in_chunks(StreamResampler(in_rate, out_rate), sine(in_rate))
    middle = out[out_rate // 4 : 3 * out_rate // 4]
    t = (np.arange(len(out)) / out_rate)[out_rate // 4 : 3 * out_rate // 4]
    reference = AMPLITUDE * np.sin(2 * np.pi * TONE_HZ * t)
    # HQ has a linear-phase filter whose delay the stream compensates: the tone lines up.
    assert np.max(np.abs(middle - reference)) < 0.01


def test_equal_rates_are_a_pass_through() -> None:
    resampler = StreamResampler(48_000, 48_000)
    assert resampler.passthrough
    chunk = sine(48_000, seconds=0.02)
    assert resampler.process(chunk) is chunk
    assert resampler.process(chunk, last=True) is chunk
    resampler.reset()  # nothing to forget, and no error
    assert resampler.process(chunk) is chunk


def test_different_rates_are_not_a_pass_through() -> None:
    resampler = StreamResampler(48_000, 16_000)
    assert not resampler.passthrough
    assert (resampler.in_rate, resampler.out_rate) == (48_000, 16_000)


def test_reset_forgets_the_history_of_the_previous_stream() -> None:
    """After an engine reset the next stream starts clean, as from a fresh resampler."""
    in_rate, out_rate = 16_000, 48_000
    first = sine(in_rate, seconds=0.3)
    second = -0.7 * sine(in_rate, seconds=0.3)[::-1].copy()
    used = StreamResampler(in_rate, out_rate)
    used.process(first)  # leaves half a filter of ``first`` in the delay line
    used.reset()
    after_reset = used.process(second, last=True)
    fresh = StreamResampler(in_rate, out_rate).process(second, last=True)
    np.testing.assert_allclose(after_reset, fresh, rtol=0, atol=1e-6)
