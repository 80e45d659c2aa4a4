"""Time-scale modification: exact lengths, seamless joins, the pitch kept, cheap enough to run.

Tones show the signal-level properties exactly (a tone has one frequency, one amplitude and
a known steepest slope); speech from espeak-ng, and a synthetic voice of known pitch, show
that the same holds for what the server really plays.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from media.audio.tsm import (
    EXTEND_FADE,
    EXTEND_HOLD,
    LOOKAHEAD,
    RATE,
    RECOVER,
    SEARCH,
    SEGMENT,
    TimeStretcher,
)
from peer.speech import SpeechFixture

FRAME = 960
AMPLITUDE = 0.5
RATIOS = (0.5, 0.8, 1.25, 2.0)
# Irregular ratios for long runs: accelerate, expand and play straight, in turn.
ALTERNATING = (0.5, 1.0, 2.0, 0.8, 1.25, 1.0, 1.6, 0.6)


def tone(freq: float, n: int, start: int = 0) -> np.ndarray:
    t = np.arange(start, start + n) / RATE
    return (AMPLITUDE * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def stretch_blocks(
    stretcher: TimeStretcher, signal: np.ndarray, ratios: tuple[float, ...], block: int = FRAME
) -> np.ndarray:
    """Play ``signal`` block by block, each block at the next ratio of ``ratios`` (cycled)."""
    outs = []
    for start, ratio in zip(range(0, len(signal), block), itertools.cycle(ratios), strict=False):
        piece = signal[start : start + block]
        out = stretcher.stretch(piece, round(len(piece) * ratio))
        assert len(out) == round(len(piece) * ratio)
        outs.append(out)
    return np.concatenate(outs)


def steady(output: np.ndarray) -> np.ndarray:
    """The output after start-up: LOOKAHEAD samples of silence, then the signal switching on."""
    return output[LOOKAHEAD + SEARCH + SEGMENT :]


def tone_step(freq: float) -> float:
    """The largest sample-to-sample step a tone of this frequency can make."""
    return 2 * np.pi * freq / RATE * AMPLITUDE


def largest_step(signal: np.ndarray) -> float:
    return float(np.max(np.abs(np.diff(signal))))


def zero_crossing_frequency(signal: np.ndarray) -> float:
    """Frequency from upward zero crossings, located to a fraction of a sample."""
    below = signal < 0
    crossings = np.flatnonzero(below[:-1] & ~below[1:])
    fraction = signal[crossings] / (signal[crossings] - signal[crossings + 1])
    times = crossings + fraction
    return float((len(times) - 1) / (times[-1] - times[0]) * RATE)


def envelope(signal: np.ndarray, freq: float) -> np.ndarray:
    """Peak level over every window of one period (plus a sample), relative to AMPLITUDE."""
    window = int(np.ceil(RATE / freq)) + 1
    return sliding_window_view(np.abs(signal), window).max(axis=1) / AMPLITUDE


def median_pitch(signal: np.ndarray) -> float:
    """Median fundamental over the voiced 50 ms frames (normalised autocorrelation peak)."""
    frame, hop = 2400, 480
    shortest, longest = RATE // 300, RATE // 60
    pitches = []
    for start in range(0, len(signal) - frame, hop):
        x = signal[start : start + frame].astype(np.float64)
        x -= x.mean()
        if x @ x < frame * 1e-3:
            continue  # a pause
        spectrum = np.fft.rfft(x, 8192)
        autocorrelation = np.fft.irfft(np.abs(spectrum) ** 2)[:frame] / (frame - np.arange(frame))
        lag = shortest + int(np.argmax(autocorrelation[shortest:longest]))
        if autocorrelation[lag] < 0.6 * autocorrelation[0]:
            continue  # not voiced
        before, peak, after = autocorrelation[lag - 1 : lag + 2]
        offset = 0.5 * (before - after) / (before - 2 * peak + after)
        pitches.append(RATE / (lag + offset))
    return float(np.median(pitches))


def voice(f0: float, seconds: float) -> np.ndarray:
    """A steady harmonic voice: the pitch is known exactly."""
    phase = 2 * np.pi * f0 * np.arange(round(seconds * RATE)) / RATE
    harmonics = np.arange(1, 15)[:, None]
    return (0.3 * (np.sin(harmonics * phase) / harmonics).sum(axis=0)).astype(np.float32)


def test_every_call_returns_exactly_the_samples_asked_for() -> None:
    rng = np.random.default_rng(1)
    stretcher = TimeStretcher()
    pairs = [(960, 960), (960, 480), (960, 1920), (1, 1), (7, 13), (961, 959), (0, 960)]
    pairs += [(960, 0), (333, 777), (2880, 1441), (0, 1), (1, 0), (0, 0)]
    pairs += [(int(n), int(m)) for n, m in rng.integers(0, 3000, size=(200, 2))]
    signal = rng.standard_normal(sum(n for n, _ in pairs)).astype(np.float32) * 0.1
    start = 0
    for n, m in pairs:
        out = stretcher.stretch(signal[start : start + n], m)
        start += n
        assert out.dtype == np.float32
        assert out.shape == (m,)
        assert np.all(np.isfinite(out))
    for m in (0, 1, 959, 960, 1921):
        assert stretcher.extend(m).shape == (m,)


def test_at_ratio_one_the_output_is_the_input_delayed_by_the_lookahead_bit_for_bit() -> None:
    rng = np.random.default_rng(2)
    signal = rng.standard_normal(FRAME * 30).astype(np.float32) * 0.2
    stretcher = TimeStretcher()
    outs, start = [], 0
    for size in itertools.cycle([960, 1, 333, 960, 7, 2048, 480]):
        if start >= len(signal):
            break
        piece = signal[start : start + size]
        outs.append(stretcher.stretch(piece, len(piece)))
        start += size
        assert stretcher.lag == LOOKAHEAD
    out = np.concatenate(outs)
    assert np.array_equal(out[:LOOKAHEAD], np.zeros(LOOKAHEAD, np.float32))
    assert np.array_equal(out[LOOKAHEAD:], signal[:-LOOKAHEAD])


@pytest.mark.parametrize("seed", range(40))
def test_after_stretching_ratio_one_plays_the_input_unbroken_at_the_lag_it_reports(
    seed: int,
) -> None:
    """The time map is exact: no sample is lost or doubled beyond what the ratios asked for.

    After a stretch of accelerating and expanding, playing on at ratio 1 must give back the
    input as a plain copy, delayed by exactly ``lag`` samples (noise never matches itself
    elsewhere, so no splice can hide a miscount, and the natural continuation, a perfect
    match, must win over every other piece in reach).
    """
    rng = np.random.default_rng(seed)
    signal = rng.standard_normal(FRAME * 80).astype(np.float32) * 0.2
    stretcher = TimeStretcher()
    stretch_blocks(stretcher, signal[: FRAME * 40], (1.25, 0.75, 1.5, 0.6))
    stretch_blocks(stretcher, signal[FRAME * 40 : FRAME * 42], (1.0,))  # settles
    lag = stretcher.lag
    outs = []
    for k in range(42, 80):
        outs.append(stretcher.stretch(signal[k * FRAME : (k + 1) * FRAME], FRAME))
        assert stretcher.lag == lag
    played_from = 42 * FRAME - lag
    assert np.array_equal(np.concatenate(outs), signal[played_from : played_from + 38 * FRAME])


def test_the_delay_stays_within_its_stated_bounds() -> None:
    rng = np.random.default_rng(4)
    signal = tone(440, FRAME * 300) + rng.standard_normal(FRAME * 300).astype(np.float32) * 0.01
    stretcher = TimeStretcher()
    lags = []
    for k in range(300):
        if rng.random() < 0.1:
            stretcher.extend(int(rng.integers(SEGMENT, 3 * FRAME)))
            lags.append(stretcher.lag)
        block = signal[k * FRAME : (k + 1) * FRAME]
        stretcher.stretch(block, int(rng.integers(max(SEGMENT, FRAME // 2), 2 * FRAME + 1)))
        lags.append(stretcher.lag)
    assert min(lags) >= LOOKAHEAD - SEGMENT
    assert max(lags) <= LOOKAHEAD + SEARCH + SEGMENT
    assert len(set(lags)) > 10, "the delay should move with the splices"


@pytest.mark.parametrize("freq", [200.0, 440.0, 1000.0])
@pytest.mark.parametrize("ratio", RATIOS)
def test_a_tone_keeps_its_frequency_and_its_level(freq: float, ratio: float) -> None:
    out = steady(stretch_blocks(TimeStretcher(), tone(freq, FRAME * 50), (ratio,)))
    assert zero_crossing_frequency(out) == pytest.approx(freq, rel=0.01)
    level = envelope(out, freq)
    assert level.min() > 0.97
    assert level.max() < 1.03


@pytest.mark.parametrize("freq", [200.0, 440.0, 1000.0])
def test_joins_stay_smooth_over_200_blocks_of_alternating_ratios(freq: float) -> None:
    out = steady(stretch_blocks(TimeStretcher(), tone(freq, FRAME * 200), ALTERNATING))
    assert largest_step(out) <= 1.05 * tone_step(freq)
    level = envelope(out, freq)
    assert level.min() > 0.97
    assert level.max() < 1.03
    assert zero_crossing_frequency(out) == pytest.approx(freq, rel=0.01)


def test_irregular_block_sizes_join_as_smoothly() -> None:
    signal = tone(440, FRAME * 100)
    stretcher = TimeStretcher()
    outs, start = [], 0
    for size, ratio in zip(itertools.cycle([960, 333, 1500, 77, 960]), itertools.cycle(RATIOS)):
        if start >= len(signal):
            break
        piece = signal[start : start + size]
        outs.append(stretcher.stretch(piece, round(len(piece) * ratio)))
        start += size
    out = steady(np.concatenate(outs))
    assert largest_step(out) <= 1.05 * tone_step(440)
    assert envelope(out, 440).min() > 0.97


@pytest.mark.parametrize("freq", [200.0, 440.0, 1000.0])
def test_extend_continues_a_tone_in_phase(freq: float) -> None:
    stretcher = TimeStretcher()
    before = stretch_blocks(stretcher, tone(freq, FRAME * 10), (1.0,))
    gap = np.concatenate([stretcher.extend(FRAME) for _ in range(EXTEND_HOLD // FRAME)])
    joined = steady(np.concatenate([before, gap]))
    assert largest_step(joined) <= 1.05 * tone_step(freq)
    assert envelope(gap, freq).min() > 0.97
    assert zero_crossing_frequency(gap) == pytest.approx(freq, rel=0.01)


def test_a_long_gap_fades_gently_to_silence_and_the_next_input_ramps_back() -> None:
    freq = 440.0
    stretcher = TimeStretcher()
    before = stretch_blocks(stretcher, tone(freq, FRAME * 10), (1.0,))
    gap = np.concatenate([stretcher.extend(FRAME) for _ in range(20)])  # 400 ms
    after = stretch_blocks(stretcher, tone(freq, FRAME * 10, start=FRAME * 10), (1.0,))
    out = np.concatenate([before, gap, after])
    assert largest_step(out) <= 1.05 * tone_step(freq)
    level = envelope(gap, freq)
    assert level[: EXTEND_HOLD - int(RATE / freq)].min() > 0.97  # full level for 100 ms
    fading = level[EXTEND_HOLD : EXTEND_HOLD + EXTEND_FADE]
    assert np.all(np.diff(fading) <= 1e-6), "the fade only goes down"
    assert np.all(gap[EXTEND_HOLD + EXTEND_FADE :] == 0), "then silence, not a buzz"
    assert envelope(after[RECOVER + LOOKAHEAD :], freq).min() > 0.97
    assert np.all(envelope(after[: RECOVER + LOOKAHEAD], freq) < 1.03)


def test_extend_with_no_past_audio_is_silence() -> None:
    assert np.array_equal(TimeStretcher().extend(FRAME), np.zeros(FRAME, np.float32))


@pytest.mark.parametrize("ratio", RATIOS)
def test_a_voice_keeps_its_pitch(ratio: float) -> None:
    out = steady(stretch_blocks(TimeStretcher(), voice(120.0, 3.0), (ratio,)))
    assert median_pitch(out) == pytest.approx(120.0, rel=0.005)


@pytest.mark.parametrize("ratio", RATIOS)
def test_speech_keeps_its_pitch(speech: SpeechFixture, ratio: float) -> None:
    out = stretch_blocks(TimeStretcher(), speech.clean, (ratio,))
    assert len(out) == pytest.approx(len(speech.clean) * ratio, abs=1)
    assert median_pitch(out) == pytest.approx(median_pitch(speech.clean), rel=0.03)


def test_speech_has_no_discontinuities_at_any_ratio(speech: SpeechFixture) -> None:
    """Each join is a raised-cosine cross-fade of |samples| <= 0.5 over SEGMENT samples: it
    can add at most pi / (2 SEGMENT) (0.0065) to the input's own steepest step."""
    rng = np.random.default_rng(5)
    stretcher = TimeStretcher()
    outs = []
    for start in range(0, len(speech.clean), FRAME):
        block = speech.clean[start : start + FRAME]
        outs.append(stretcher.stretch(block, int(rng.integers(FRAME // 2, 2 * FRAME + 1))))
        if rng.random() < 0.05:
            outs.append(stretcher.extend(FRAME))
    out = np.concatenate(outs)
    assert largest_step(out) <= largest_step(speech.clean) + np.pi / (2 * SEGMENT)


def test_a_20ms_block_costs_well_under_a_millisecond(speech: SpeechFixture) -> None:
    stretcher = TimeStretcher()
    costs: dict[float, list[float]] = {ratio: [] for ratio in (*RATIOS, 1.0, 0.0)}
    blocks = range(0, len(speech.clean) - FRAME, FRAME)
    for start, ratio in zip(blocks, itertools.cycle(costs), strict=False):
        block = speech.clean[start : start + FRAME]
        began = time.perf_counter()
        if ratio:
            stretcher.stretch(block, round(FRAME * ratio))
        else:
            stretcher.extend(FRAME)  # the block is lost: play 20 ms from the past
        costs[ratio].append(time.perf_counter() - began)
    medians = {ratio: float(np.median(spent)) for ratio, spent in costs.items()}
    assert max(medians.values()) < 1e-3, medians


def test_bad_arguments_are_refused() -> None:
    stretcher = TimeStretcher()
    with pytest.raises(ValueError):
        stretcher.stretch(np.zeros(FRAME, np.float32), -1)
    with pytest.raises(ValueError):
        stretcher.extend(-1)
    with pytest.raises(ValueError):
        stretcher.stretch(np.zeros((2, FRAME), np.float32), FRAME)
