"""Speech fixtures made at test time with espeak-ng (a Debian package `make test` installs).

Sentences are synthesised one by one and joined with real pauses, so tests know exactly
where speech is and where the noise floor can be measured.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from media.audio.frames import RTC_RATE
from media.audio.wav import read_wav, write_wav

SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Real time speech needs low latency and steady audio.",
    "Every call keeps its own state on the server.",
    "Noise in the pauses should disappear completely.",
    "Thank you for testing the voice server today.",
)
PAUSE_SECONDS = 0.5


@dataclass(frozen=True)
class SpeechFixture:
    clean: np.ndarray  # 48 kHz float32 mono
    speech_mask: np.ndarray  # per sample: True inside a sentence


def espeak(text: str, rate: int = RTC_RATE) -> np.ndarray:
    """Synthesise ``text`` to float32 mono at ``rate``."""
    binary = shutil.which("espeak-ng")
    if binary is None:
        raise RuntimeError("espeak-ng is missing: run `make test` or apt-get install espeak-ng")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "speech.wav"
        subprocess.run([binary, "-w", str(path), text], check=True, capture_output=True)
        return read_wav(path, rate)


def speech_with_pauses(sentences: tuple[str, ...] = SENTENCES) -> SpeechFixture:
    pause = np.zeros(int(PAUSE_SECONDS * RTC_RATE), np.float32)
    parts: list[np.ndarray] = [pause]
    mask: list[np.ndarray] = [np.zeros(len(pause), bool)]
    for sentence in sentences:
        voiced = espeak(sentence)
        voiced = voiced / max(1e-6, float(np.abs(voiced).max())) * 0.5
        parts += [voiced, pause]
        mask += [np.ones(len(voiced), bool), np.zeros(len(pause), bool)]
    return SpeechFixture(np.concatenate(parts).astype(np.float32), np.concatenate(mask))


def add_white_noise(clean: np.ndarray, snr_db: float, seed: int = 7) -> np.ndarray:
    """White noise scaled so speech power over noise power is ``snr_db`` (speech parts only)."""
    speech_power = float(np.mean(clean[np.abs(clean) > 1e-4] ** 2))
    noise = np.random.default_rng(seed).standard_normal(len(clean)).astype(np.float32)
    noise *= np.sqrt(speech_power / 10 ** (snr_db / 10))
    return np.clip(clean + noise, -1, 1).astype(np.float32)


def save(path: Path, samples: np.ndarray) -> Path:
    write_wav(path, samples, RTC_RATE)
    return path
