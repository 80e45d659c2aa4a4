"""The playout buffers' time-scale modification: exact time maps, seamless joins, pitch kept.

``Splicer.play`` is what both playout buffers (the receive path, a transform's output
cushion) call once per 20 ms slot. Tones show the signal-level properties exactly (one
frequency, one amplitude, a known steepest slope); noise shows that no sample is lost or
doubled beyond what was reported (noise matches itself nowhere else, so a miscount cannot
hide); speech from espeak-ng shows the same holds for what the server really plays.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from media.audio.splice import (
    EXTEND_FADE,
    EXTEND_HOLD,
    MIN_PERIOD,
    RATE,
    XFADE,
    Splicer,
)
from peer.speech import SpeechFixture

FRAME = 960
AMPLITUDE = 0.5
# Per-slot wishes: accelerate (> 0), play straight (0), expand ahead of time (< 0).
CHANGES = (480, 0, -480, 720, 0, -240, 240, 0)


def tone(freq: float, n: int, start: int = 0) -> np.ndarray:
    t = np.arange(start, start + n) / RATE
    return (AMPLITUDE * np.sin(2 * np.pi * freq * t)).astype(np.float32)


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


class Player:
    """A playout buffer in miniature: ``signal`` waits ahead; each slot plays one frame."""

    def __init__(self, signal: np.ndarray) -> None:
        self.splicer = Splicer()
        self.signal = signal
        self.position = 0  # samples of ``signal`` covered so far
        self.accelerated = self.preemptive = self.expanded = self.skipped = 0

    def slot(self, change: int = 0, starved: bool = False) -> np.ndarray:
        end = self.position if starved else self.position + FRAME + max(change, 0) + 2 * XFADE
        ahead = self.signal[self.position : end]
        out, used = self.splicer.play(ahead, FRAME, change)
        splicer = self.splicer
        assert out.shape == (FRAME,) and out.dtype == np.float32
        assert 0 <= used <= len(ahead)
        # The time map, exact to a sample: every output sample is either input or what the
        # splicer says it added, and every input sample covered is either played or what it
        # says it cut.
        made = used - splicer.accelerated - splicer.skipped + splicer.preemptive
        assert made + splicer.expanded == FRAME
        self.position += used
        self.accelerated += splicer.accelerated
        self.preemptive += splicer.preemptive
        self.expanded += splicer.expanded
        self.skipped += splicer.skipped
        return out

    def play(self, changes: tuple[int, ...], slots: int) -> np.ndarray:
        wishes = itertools.islice(itertools.cycle(changes), slots)
        return np.concatenate([self.slot(change) for change in wishes])


def test_every_call_returns_exactly_the_samples_asked_for() -> None:
    rng = np.random.default_rng(1)
    splicer = Splicer()
    signal = rng.standard_normal(200_000).astype(np.float32) * 0.1
    position = 0
    for _ in range(400):
        have = int(rng.integers(0, 3000))
        wanted = int(rng.integers(0, 2000))
        change = int(rng.integers(-1000, 1000))
        ahead = signal[position : position + have]
        out, used = splicer.play(ahead, wanted, change)
        assert out.shape == (wanted,) and out.dtype == np.float32
        assert np.all(np.isfinite(out))
        assert 0 <= used <= have
        position = (position + used) % 100_000


def test_with_no_change_asked_the_output_is_the_input_bit_for_bit() -> None:
    signal = np.random.default_rng(2).standard_normal(FRAME * 30).astype(np.float32) * 0.2
    player = Player(signal)
    out = player.play((0,), 28)
    assert np.array_equal(out, signal[: 28 * FRAME])
    assert player.accelerated == player.preemptive == player.expanded == 0


@pytest.mark.parametrize("seed", range(20))
def test_after_any_steps_playing_straight_gives_the_input_back_unbroken(seed: int) -> None:
    """No sample is lost or doubled beyond what the splicer reported."""
    rng = np.random.default_rng(seed)
    signal = (rng.standard_normal(FRAME * 120) * 0.2).astype(np.float32)
    quiet = signal * 1e-4  # noise matches nowhere: only quiet audio is spliced without a match
    player = Player(quiet)
    for index in range(40):
        player.slot(int(rng.integers(-720, 721)), starved=index % 7 == 3)
    assert player.accelerated > 0 and player.preemptive > 0 and player.expanded > 0
    player.slot()  # a merge may still be due after the last expansion
    start = player.position
    out = player.play((0,), 30)
    assert np.array_equal(out, quiet[start : start + 30 * FRAME])


@pytest.mark.parametrize("freq", [200.0, 441.7, 1000.0])
def test_a_tone_keeps_its_frequency_level_and_smoothness_through_every_step(freq: float) -> None:
    player = Player(tone(freq, FRAME * 400))
    out = player.play(CHANGES, 200)[2 * FRAME :]
    assert player.accelerated > 20 * FRAME and player.preemptive > 10 * FRAME, "it did splice"
    assert largest_step(out) <= 1.05 * tone_step(freq)
    level = envelope(out, freq)
    assert level.min() > 0.97
    assert level.max() < 1.03
    assert zero_crossing_frequency(out) == pytest.approx(freq, rel=0.005)


@pytest.mark.parametrize("freq", [200.0, 441.7, 1000.0])
def test_an_expansion_continues_a_tone_in_phase_and_merges_back_without_a_step(
    freq: float,
) -> None:
    player = Player(tone(freq, FRAME * 40))
    before = player.play((0,), 10)
    gap = np.concatenate([player.slot(starved=True) for _ in range(EXTEND_HOLD // FRAME)])
    after = player.play((0,), 10)  # the audio that was late comes: merged in
    out = np.concatenate([before, gap, after])
    assert player.expanded >= EXTEND_HOLD // FRAME * FRAME
    assert largest_step(out) <= 1.05 * tone_step(freq)
    assert envelope(gap, freq).min() > 0.97
    assert envelope(out, freq).max() < 1.03
    assert zero_crossing_frequency(gap) == pytest.approx(freq, rel=0.01)


def test_a_long_gap_fades_gently_to_silence_and_the_audio_comes_back_cleanly() -> None:
    freq = 441.7
    player = Player(tone(freq, FRAME * 40))
    before = player.play((0,), 10)
    slots = (EXTEND_HOLD + EXTEND_FADE) // FRAME + 5
    gap = np.concatenate([player.slot(starved=True) for _ in range(slots)])
    assert player.splicer.faded
    after = player.play((0,), 10)
    out = np.concatenate([before, gap, after])
    assert largest_step(out) <= 1.05 * tone_step(freq)
    level = envelope(gap, freq)
    assert level[: EXTEND_HOLD - int(RATE / freq)].min() > 0.97  # full level while held
    fading = level[EXTEND_HOLD : EXTEND_HOLD + EXTEND_FADE]
    assert np.all(np.diff(fading) <= 1e-6), "the fade only goes down"
    assert np.all(gap[EXTEND_HOLD + EXTEND_FADE :] == 0), "then silence, not a buzz"
    assert envelope(after[XFADE:], freq).min() > 0.97


def test_an_expansion_with_no_past_audio_is_silence() -> None:
    out, used = Splicer().play(np.zeros(0, np.float32), FRAME)
    assert used == 0
    assert np.array_equal(out, np.zeros(FRAME, np.float32))


def test_after_a_reset_nothing_of_the_past_comes_back() -> None:
    player = Player(tone(441.7, FRAME * 20))
    player.play((0,), 10)
    player.splicer.reset()
    assert not np.any(player.slot(starved=True))


def test_noise_that_does_not_repeat_is_not_spliced_where_it_is_loud() -> None:
    signal = (np.random.default_rng(3).standard_normal(FRAME * 40) * 0.3).astype(np.float32)
    player = Player(signal)
    out = player.play((720, -480), 30)
    assert player.accelerated == player.preemptive == 0
    assert np.array_equal(out, signal[: 30 * FRAME])


def test_speech_keeps_its_pitch_when_played_faster_and_slower(speech: SpeechFixture) -> None:
    for changes in ((480,), (-480,)):
        player = Player(speech.clean)
        slots = (len(speech.clean) - 4 * FRAME) // (FRAME + max(changes[0], 0))
        out = player.play(changes, slots)
        assert player.accelerated + player.preemptive > len(speech.clean) // 10
        assert median_pitch(out) == pytest.approx(median_pitch(speech.clean), rel=0.03)


def test_speech_has_no_discontinuities_through_any_step(speech: SpeechFixture) -> None:
    """Each join is a raised-cosine cross-fade of |samples| <= 0.5 over XFADE samples: it can
    add at most pi / (2 XFADE) to the input's own steepest step."""
    rng = np.random.default_rng(5)
    player = Player(speech.clean)
    outs = []
    while player.position < len(speech.clean) - 3 * FRAME:
        outs.append(player.slot(int(rng.integers(-720, 721)), starved=rng.random() < 0.05))
    out = np.concatenate(outs)
    assert largest_step(out) <= largest_step(speech.clean) + np.pi / (2 * XFADE)


def test_a_slot_costs_well_under_a_millisecond(speech: SpeechFixture) -> None:
    player = Player(speech.clean)
    costs: dict[int, list[float]] = {change: [] for change in (0, 720, -480, MIN_PERIOD)}
    for change in itertools.islice(itertools.cycle(costs), 200):
        if player.position > len(speech.clean) - 3 * FRAME:
            break
        began = time.perf_counter()
        player.slot(change)
        costs[change].append(time.perf_counter() - began)
    began = time.perf_counter()
    player.slot(starved=True)  # a late packet: a slot made from the past
    expand = time.perf_counter() - began
    medians = {change: float(np.median(spent)) for change, spent in costs.items()}
    assert max(medians.values()) < 1e-3, medians
    assert expand < 2e-3


def test_bad_arguments_are_refused() -> None:
    splicer = Splicer()
    with pytest.raises(ValueError):
        splicer.play(np.zeros(FRAME, np.float32), -1)
    with pytest.raises(ValueError):
        splicer.play(np.zeros((2, FRAME), np.float32), FRAME)
