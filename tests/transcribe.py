"""Speech recognition for tests: pocketsphinx with the en-US model inside its wheel.

Tests check that synthesised speech says the right words by transcribing what came back
over the call and measuring word recall against the text that was sent.
"""

from __future__ import annotations

import re

import numpy as np
from pocketsphinx import Decoder

from media.audio.resample import StreamResampler

RECOGNIZER_RATE = 16_000


def transcribe(samples: np.ndarray, rate: int) -> str:
    """Words pocketsphinx hears in float32 mono ``samples``."""
    pcm16k = StreamResampler(rate, RECOGNIZER_RATE).process(samples.astype(np.float32), last=True)
    peak = float(np.abs(pcm16k).max()) if len(pcm16k) else 0.0
    if peak > 0:
        pcm16k = pcm16k / peak * 0.7  # recognisers like a healthy level
    pcm = (np.clip(pcm16k, -1, 1) * 32767).astype(np.int16).tobytes()
    decoder = Decoder(samprate=RECOGNIZER_RATE, loglevel="FATAL")
    decoder.start_utt()
    decoder.process_raw(pcm, full_utt=True)
    decoder.end_utt()
    hypothesis = decoder.hyp()
    return hypothesis.hypstr if hypothesis else ""


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def word_recall(reference: str, heard: str) -> float:
    """Share of the reference words that were heard (order-insensitive, with repeats)."""
    expected = words(reference)
    if not expected:
        return 1.0
    pool = words(heard)
    found = 0
    for word in expected:
        if word in pool:
            pool.remove(word)
            found += 1
    return found / len(expected)
