"""G.711 mu-law: bit-exact with CPython's audioop, and a tone survives the round trip."""

from __future__ import annotations

import warnings
from types import ModuleType

import numpy as np
import pytest

from media.audio.mulaw import decode, encode

RATE = 8000
EVERY_INT16 = np.arange(-32768, 32768, dtype=np.int16)
EVERY_CODE = bytes(range(256))
NEGATIVE_ZERO = 0x7F  # decodes to 0, which encodes as 0xFF


@pytest.fixture
def audioop() -> ModuleType:
    """The reference the tables are held to, where the interpreter still has it: deprecated
    since 3.11, removed in 3.13."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return pytest.importorskip("audioop", reason="audioop left the standard library in 3.13")


def test_every_int16_sample_encodes_as_audioop_encodes_it(audioop: ModuleType) -> None:
    samples = (EVERY_INT16 / 32768.0).astype(np.float32)
    assert encode(samples) == audioop.lin2ulaw(EVERY_INT16.tobytes(), 2)


def test_every_byte_decodes_as_audioop_decodes_it(audioop: ModuleType) -> None:
    reference = np.frombuffer(audioop.ulaw2lin(EVERY_CODE, 2), dtype=np.int16)
    decoded = decode(EVERY_CODE)
    assert decoded.dtype == np.float32
    np.testing.assert_array_equal(decoded * 32768.0, reference)


def test_the_g711_landmarks() -> None:
    """What any G.711 implementation agrees on, checked without audioop."""
    assert encode(np.array([0.0, 1.0, -1.0], dtype=np.float32)) == bytes([0xFF, 0x80, 0x00])
    decoded = decode(bytes([0xFF, NEGATIVE_ZERO, 0x80, 0x00, 0xFE])) * 32768.0
    np.testing.assert_array_equal(decoded, [0, 0, 32124, -32124, 8])


def test_samples_past_full_scale_clip_rather_than_wrap() -> None:
    loud = np.array([1.5, -1.5, 40.0, -40.0], dtype=np.float32)
    assert encode(loud) == encode(np.array([1.0, -1.0, 1.0, -1.0], dtype=np.float32))


def test_decoded_audio_encodes_back_to_the_same_bytes() -> None:
    """Every code but negative zero is a fixed point: a relay that decodes and re-encodes
    loses nothing more."""
    again = encode(decode(EVERY_CODE))
    changed = [code for code in EVERY_CODE if again[code] != code]
    assert changed == [NEGATIVE_ZERO]
    assert again[NEGATIVE_ZERO] == 0xFF


def test_a_440_hz_tone_keeps_an_snr_above_30_db() -> None:
    t = np.arange(RATE) / RATE
    tone = (0.5 * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)
    encoded = encode(tone)
    assert len(encoded) == len(tone)
    noise = decode(encoded) - tone
    snr_db = 10 * np.log10(np.sum(tone.astype(np.float64) ** 2) / np.sum(noise**2.0))
    assert snr_db > 30.0


def test_empty_input_is_empty_output() -> None:
    assert encode(np.zeros(0, dtype=np.float32)) == b""
    decoded = decode(b"")
    assert decoded.dtype == np.float32 and decoded.shape == (0,)
