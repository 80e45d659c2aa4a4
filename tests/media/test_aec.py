"""Echo cancellation ahead of barge-in detection, on a simulated loudspeaker caller.

The server's reply A (espeak-ng) goes out as the reference; the caller's microphone picks it
up through a small room: delayed, attenuated, smeared by a 50 ms decaying impulse response,
over a faint noise floor. Everything is seeded, so every run hears the same call. Frames go
through the canceller in the order a real-time server sees them: each 20 ms of reference when
it is sent, then the 20 ms of microphone audio that arrives at the same tick.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from media.audio.aec import BLOCK, QUIET_TAIL_MS, EchoCanceller
from media.audio.vad import SileroVad, SpeechDetector, SpeechEventKind
from peer.speech import espeak

RATE = 48_000
CHUNK = 960  # 20 ms, the WebRTC frame on both tracks
PEAK = 0.5
PAUSE_S = 0.3
REPLY = (
    "Hello, thanks for calling. Let me look up your account.",
    "Your order shipped on Monday and should arrive soon.",
    "Is there anything else I can help you with today?",
    "We also have a new offer for loyal customers this month.",
)
INTERRUPTION = "Wait, stop, I have a question about my bill."
ECHO_GAIN_DB = -10.0  # loudspeaker to microphone
ECHO_DELAY_MS = 80.0  # round trip plus both ends' buffers
ROOM_TAIL_S = 0.05
ROOM_DECAY_S = 0.01
NOISE_DBFS = -65.0
ACTIVE_DBFS = -50.0  # 10 ms blocks where the echo is louder than this are where it is measured
CONVERGED_S = 2.0
INTERRUPTION_AT_S = 6.0  # the caller talks over the middle of the second sentence
BARGE_IN_WITHIN_MS = 1500.0  # AEC3 mutes the first word or two of double talk; measured 0.24-1.2 s
SUPPRESSION_DB = 25.0  # measured 35 dB after two seconds, 24-31 dB before


def _normalised(x: np.ndarray) -> np.ndarray:
    return (x / np.abs(x).max() * PEAK).astype(np.float32)


def _level_db(x: np.ndarray) -> float:
    return float(10 * np.log10(np.mean(np.square(x, dtype=np.float64)) + 1e-20))


def _room(reference: np.ndarray, delay_ms: float, gain_db: float) -> np.ndarray:
    """What the microphone picks up from the loudspeaker."""
    taps = int(ROOM_TAIL_S * RATE)
    response = np.random.default_rng(1).standard_normal(taps)
    response *= np.exp(-np.arange(taps) / (ROOM_DECAY_S * RATE))
    response[0] += 3.0  # the direct path
    response *= 10 ** (gain_db / 20) / np.sqrt(np.sum(response**2))
    delay = int(delay_ms * RATE / 1000)
    echo = np.zeros(reference.size, np.float32)
    # Linear convolution through a power-of-two FFT, much faster than np.convolve here.
    size = 1 << (reference.size + taps - 2).bit_length()
    full = np.fft.irfft(np.fft.rfft(reference, size) * np.fft.rfft(response, size), size)
    echo[delay:] = full[: reference.size - delay]
    return echo


@dataclass(frozen=True)
class Call:
    reply: np.ndarray  # the reference, what the server sends
    interruption: np.ndarray  # the caller's own words, at the level they reach the microphone
    noise: np.ndarray

    def mic(self, echo: np.ndarray, interruption_gain_db: float | None = None) -> np.ndarray:
        mic = echo + self.noise
        if interruption_gain_db is not None:
            at = int(INTERRUPTION_AT_S * RATE)
            words = self.interruption * 10 ** (interruption_gain_db / 20)
            mic[at : at + words.size] += words
        return mic.astype(np.float32)


@pytest.fixture(scope="module")
def call() -> Call:
    pause = np.zeros(int(PAUSE_S * RATE), np.float32)
    reply = np.concatenate([part for text in REPLY for part in (_normalised(espeak(text)), pause)])
    noise = np.random.default_rng(2).standard_normal(reply.size) * 10 ** (NOISE_DBFS / 20)
    return Call(reply, _normalised(espeak(INTERRUPTION)), noise.astype(np.float32))


@pytest.fixture(scope="module")
def vad() -> SileroVad:
    return SileroVad()


def _cancel(reference: np.ndarray, mic: np.ndarray, **options: float) -> np.ndarray:
    canceller = EchoCanceller(**options)
    out = np.zeros_like(mic)
    for i in range(0, mic.size - CHUNK + 1, CHUNK):
        canceller.render(reference[i : i + CHUNK])
        out[i : i + CHUNK] = canceller.capture(mic[i : i + CHUNK])
    assert canceller.reference_dropped == canceller.reference_missing == 0
    return out


def _suppression_db(echo: np.ndarray, mic: np.ndarray, out: np.ndarray, start_s: float) -> float:
    """Echo-to-residual power over the blocks after ``start_s`` where the echo is active."""
    start = int(start_s * RATE)
    blocks = (mic.size - start) // BLOCK
    end = start + blocks * BLOCK
    echo_blocks = echo[start:end].reshape(blocks, BLOCK).astype(np.float64)
    active = 10 * np.log10(np.mean(echo_blocks**2, axis=1) + 1e-20) > ACTIVE_DBFS
    mic_power = np.sum(mic[start:end].reshape(blocks, BLOCK)[active].astype(np.float64) ** 2)
    out_power = np.sum(out[start:end].reshape(blocks, BLOCK)[active].astype(np.float64) ** 2)
    return float(10 * np.log10(mic_power / out_power))


def _speech_starts_ms(vad: SileroVad, signal: np.ndarray) -> list[float]:
    state = vad.new_state()
    detector = SpeechDetector()
    starts: list[float] = []
    for i in range(0, signal.size, CHUNK):
        events = detector.update(vad.process(state, signal[i : i + CHUNK]))
        starts += [e.at_ms for e in events if e.kind == SpeechEventKind.START]
    return starts


@pytest.mark.parametrize("delay_ms", [ECHO_DELAY_MS, 250.0])
def test_echo_is_suppressed(call: Call, delay_ms: float) -> None:
    echo = _room(call.reply, delay_ms, ECHO_GAIN_DB)
    mic = call.mic(echo)
    out = _cancel(call.reply, mic)
    assert _suppression_db(echo, mic, out, 0.0) > SUPPRESSION_DB - 5
    assert _suppression_db(echo, mic, out, CONVERGED_S) > SUPPRESSION_DB


def test_barge_in_ignores_the_echo(call: Call, vad: SileroVad) -> None:
    mic = call.mic(_room(call.reply, ECHO_DELAY_MS, ECHO_GAIN_DB))
    # Without the canceller the echo is speech to the VAD: every sentence would interrupt.
    assert len(_speech_starts_ms(vad, mic)) == len(REPLY)
    assert _speech_starts_ms(vad, _cancel(call.reply, mic)) == []


@pytest.mark.parametrize("interruption_gain_db", [ECHO_GAIN_DB, ECHO_GAIN_DB - 6])
def test_barge_in_hears_the_caller_over_the_echo(
    call: Call, vad: SileroVad, interruption_gain_db: float
) -> None:
    echo = _room(call.reply, ECHO_DELAY_MS, ECHO_GAIN_DB)
    mic = call.mic(echo, interruption_gain_db)
    out = _cancel(call.reply, mic)
    starts = _speech_starts_ms(vad, out)
    onset_ms = INTERRUPTION_AT_S * 1000
    assert starts, "the caller's interruption went unheard"
    assert onset_ms < starts[0] < onset_ms + BARGE_IN_WITHIN_MS
    # The caller's words come through close to their own level, not suppressed with the echo.
    at = int(INTERRUPTION_AT_S * RATE)
    words = slice(at, at + call.interruption.size)
    words_db = _level_db(call.interruption) + interruption_gain_db
    assert _level_db(out[words]) > words_db - 6  # measured 3.3-4.4 dB down


def test_long_echo_path_needs_a_reference_delay(call: Call) -> None:
    """AEC3 searches about 0-500 ms; delaying the reference brings a longer path into range."""
    echo = _room(call.reply, 700.0, ECHO_GAIN_DB)
    mic = call.mic(echo)
    assert _suppression_db(echo, mic, _cancel(call.reply, mic), 4.0) < 10  # measured ~2 dB
    helped = _cancel(call.reply, mic, reference_delay_ms=400.0)
    assert _suppression_db(echo, mic, helped, CONVERGED_S) > SUPPRESSION_DB


def test_capture_splits_and_joins_blocks(call: Call) -> None:
    seconds = 3 * RATE
    reference = call.reply[:seconds]
    mic = call.mic(_room(call.reply, ECHO_DELAY_MS, ECHO_GAIN_DB))[:seconds]
    whole = _cancel(reference, mic)
    canceller = EchoCanceller()
    pieces: list[np.ndarray] = []
    for i in range(0, seconds, CHUNK):
        canceller.render(reference[i : i + CHUNK])
        first = canceller.capture(mic[i : i + 300])
        assert first.size % BLOCK == 0
        pieces += [first, canceller.capture(mic[i + 300 : i + CHUNK])]
    np.testing.assert_array_equal(np.concatenate(pieces), whole)


def test_sessions_are_independent(call: Call) -> None:
    seconds = 3 * RATE
    mic = call.mic(_room(call.reply, ECHO_DELAY_MS, ECHO_GAIN_DB))[:seconds]
    other_reference = call.reply[seconds : 2 * seconds]
    other_mic = call.mic(_room(call.reply, 200.0, -6.0))[seconds : 2 * seconds]
    first, second = EchoCanceller(), EchoCanceller()
    first_out: list[np.ndarray] = []
    second_out: list[np.ndarray] = []
    for i in range(0, seconds, CHUNK):
        first.render(call.reply[i : i + CHUNK])
        second.render(other_reference[i : i + CHUNK])
        first_out.append(first.capture(mic[i : i + CHUNK]))
        second_out.append(second.capture(other_mic[i : i + CHUNK]))
    np.testing.assert_array_equal(np.concatenate(first_out), _cancel(call.reply[:seconds], mic))
    np.testing.assert_array_equal(np.concatenate(second_out), _cancel(other_reference, other_mic))


def test_reference_queue_is_bounded() -> None:
    canceller = EchoCanceller(max_lead_ms=60.0)
    frame = np.full(CHUNK, 0.1, np.float32)
    for _ in range(10):  # sent while nothing comes back: only the last 60 ms are kept
        canceller.render(frame)
    assert canceller.reference_dropped == 10 * CHUNK - 3 * CHUNK
    for _ in range(5):
        assert canceller.capture(np.zeros(CHUNK, np.float32)).size == CHUNK
    assert canceller.reference_missing == 2 * CHUNK


def test_while_we_say_nothing_the_microphone_passes_as_it_came(call: Call) -> None:
    """Nothing sent, nothing to cancel: AEC3 is not called (it costs the same either way)."""
    canceller = EchoCanceller()
    mic = call.noise[: 2 * RATE] + call.interruption[: 2 * RATE] * 0.1
    out = [canceller.capture(mic[i : i + CHUNK]) for i in range(0, mic.size, CHUNK)]
    np.testing.assert_array_equal(np.concatenate(out), mic)
    assert canceller.blocks_passed == mic.size // BLOCK


def test_echo_is_cancelled_through_our_silences(call: Call) -> None:
    """Speech, 3 s of our silence (longer than the quiet tail), speech again: AEC3 sits out
    the silence but its echo tail, and cancels the second reply as well as the first."""
    gap = np.zeros(3 * RATE, np.float32)
    reference = np.concatenate([call.reply, gap, call.reply])
    echo = _room(reference, 250.0, ECHO_GAIN_DB)
    mic = (echo + np.resize(call.noise, echo.size)).astype(np.float32)
    canceller = EchoCanceller()
    out = np.zeros_like(mic)
    for i in range(0, mic.size - CHUNK + 1, CHUNK):
        canceller.render(reference[i : i + CHUNK])
        out[i : i + CHUNK] = canceller.capture(mic[i : i + CHUNK])
    passed_s = canceller.blocks_passed * BLOCK / RATE
    assert gap.size / RATE - QUIET_TAIL_MS / 1000 - 0.05 <= passed_s <= gap.size / RATE
    again = call.reply.size + gap.size
    second = slice(again, mic.size)
    assert _suppression_db(echo[second], mic[second], out[second], 0.0) > SUPPRESSION_DB
    first = slice(0, again)  # the first reply's echo to its end, then the silence
    assert _suppression_db(echo[first], mic[first], out[first], CONVERGED_S) > SUPPRESSION_DB


def test_rejects_a_lead_shorter_than_a_block() -> None:
    with pytest.raises(ValueError):
        EchoCanceller(max_lead_ms=5.0)
