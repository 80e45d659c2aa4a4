"""The interop tone, and how to find it again in what a client received."""

from __future__ import annotations

from pathlib import Path

import numpy as np

RATE = 48_000
NOTES_HZ = (440.0, 554.4, 659.3, 880.0)
STEP_S = 0.1


def stepped_tone(seconds: float, seed: int = 7) -> np.ndarray:
    """A tone that changes pitch every 100 ms, among four notes, by a fixed random pattern.

    A steady tone matches itself at every period; the changes give one lag where the
    received audio lines up with the sent audio, so a high correlation there means the very
    signal came back, not something else with the same energy or the same notes. The phase
    runs on across changes, so there are no clicks for the codec to smear.
    """
    steps = np.random.default_rng(seed).integers(0, len(NOTES_HZ), int(np.ceil(seconds / STEP_S)))
    frequency = np.repeat(np.asarray(NOTES_HZ)[steps], int(STEP_S * RATE))[: int(seconds * RATE)]
    phase = np.cumsum(2 * np.pi * frequency / RATE)
    return (0.3 * np.sin(phase)).astype(np.float32)


def write_raw(path: Path, audio: np.ndarray) -> Path:
    """s16le mono, what the GStreamer client plays."""
    (np.clip(audio, -1, 1) * 32767).astype("<i2").tofile(path)
    return path


def read_raw(path: Path) -> np.ndarray:
    return np.fromfile(path, "<i2").astype(np.float32) / 32768


def best_alignment(sent: np.ndarray, segment: np.ndarray) -> tuple[float, float]:
    """(normalised correlation, offset in s) of ``segment`` at its best place in ``sent``."""
    if len(segment) == 0 or len(segment) > len(sent):
        return 0.0, 0.0
    size = len(sent) + len(segment)
    spectrum = np.fft.rfft(sent, size) * np.conj(np.fft.rfft(segment, size))
    raw = np.fft.irfft(spectrum, size)[: len(sent) - len(segment) + 1]
    window = _running_energy(sent, len(segment))
    norm = raw / (np.sqrt(np.maximum(window, 1e-12)) * np.linalg.norm(segment) + 1e-12)
    best = int(np.argmax(norm))
    return float(norm[best]), best / RATE


def _running_energy(signal: np.ndarray, size: int) -> np.ndarray:
    """The energy of every ``size``-sample stretch of ``signal`` (one per start)."""
    cumulative = np.concatenate([[0.0], np.cumsum(signal.astype(np.float64) ** 2)])
    return cumulative[size:] - cumulative[:-size]


def tone_match(
    sent: np.ndarray, received: np.ndarray, window_s: float = 1.0, slack_s: float = 0.025
) -> float:
    """Median correlation of each window of ``received`` at its best place in ``sent``.

    What was received is cut into windows (its first and last half second dropped:
    connection set-up and hang-up), and each is found in what was sent on its own. One
    second holds ten notes: long enough that no other order of the same notes scores above
    ~0.6. A receiver stretches time, though: Chromium's playout moves its delay by tens of
    milliseconds in its first seconds, and on a loaded machine it was seen drifting 60 ms
    over six seconds (1 %), which smears a whole second's correlation down to ~0.8 although
    every note came back. So each window, once placed, is scored by its quarters, each at
    its best lag within ``slack_s`` of that place: the window's placement says it is the very
    signal, the quarters say it came back whole. Silent windows score nothing.
    """
    middle = received[RATE // 2 : len(received) - RATE // 2]
    size = int(window_s * RATE)
    scores = []
    for start in range(0, len(middle) - size + 1, size):
        segment = middle[start : start + size]
        placed_at = round(best_alignment(sent, segment)[1] * RATE)
        scores.append(_score_by_quarters(sent, segment, placed_at, round(slack_s * RATE)))
    return float(np.median(scores)) if scores else 0.0


def _score_by_quarters(sent: np.ndarray, segment: np.ndarray, placed_at: int, slack: int) -> float:
    """Mean of each quarter's best normalised correlation within ``slack`` of its place."""
    quarter = len(segment) // 4
    scores = []
    for index in range(4):
        start, end = index * quarter, (index + 1) * quarter
        around = sent[max(0, placed_at + start - slack) : placed_at + end + slack]
        scores.append(best_alignment(around, segment[start:end])[0])
    return float(np.mean(scores))
