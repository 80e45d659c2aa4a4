"""WAV files as float32 mono at a chosen rate: what the peer plays and records, and fixtures."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np

from media.audio.resample import StreamResampler

_SCALES = {1: 128.0, 2: 32768.0, 4: 2147483648.0}
_DTYPES = {1: np.uint8, 2: np.int16, 4: np.int32}


def read_wav(path: str | Path, rate: int) -> np.ndarray:
    """Read 8/16/32-bit PCM, downmix to mono and resample to ``rate``."""
    with wave.open(str(path), "rb") as wav:
        width, channels, source_rate = wav.getsampwidth(), wav.getnchannels(), wav.getframerate()
        raw = wav.readframes(wav.getnframes())
    if width not in _DTYPES:
        raise ValueError(f"{path}: {8 * width}-bit WAV is not supported (use 16-bit PCM)")
    data = np.frombuffer(raw, dtype=_DTYPES[width]).astype(np.float32)
    if width == 1:
        data -= 128.0
    mono = data.reshape(-1, channels).mean(axis=1) / _SCALES[width]
    resampler = StreamResampler(source_rate, rate)
    return np.asarray(resampler.process(mono.astype(np.float32), last=True), dtype=np.float32)


def write_wav(path: str | Path, samples: np.ndarray, rate: int) -> None:
    """Write float32 mono samples as 16-bit PCM."""
    pcm = np.clip(np.asarray(samples) * 32768.0, -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(pcm.tobytes())
