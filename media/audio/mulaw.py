"""ITU-T G.711 mu-law, the 8 kHz telephone codec, as float32 mono in and out.

Telephone networks (and Twilio's Media Streams) carry one mu-law byte per sample. A call
sends 50 packets a second, so both directions are single table look-ups over the whole
chunk: 256 entries to decode, one per int16 value (65536) to encode, built once here.

The tables reproduce CPython's ``audioop.lin2ulaw`` / ``audioop.ulaw2lin`` (width 2) bit for
bit, which is the reference the tests hold them to: ``audioop`` is deprecated and leaves the
standard library in Python 3.13, and bytes that differ from it would differ from what other
telephony code produces from the same audio. That encoder is the Sun/SoX one: it drops the
two low bits of the sample first (an arithmetic shift, so -1 becomes -1, not 0) and works
on the 14-bit value with G.711's bias of 0x84 scaled to match (33); the 16-bit clip of 32635
never engages at 14 bits, where the loudest magnitudes fall past the last segment and get
the largest code.
"""

from __future__ import annotations

import numpy as np

_BIAS = 0x84
# The largest biased 14-bit magnitude in each of the eight segments (G.711 table 2a).
_SEGMENT_ENDS = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])
_SIGN = 0x80
_SEGMENT = 0x70
_STEP = 0x0F
_SCALE = 32768.0


def _encode_table() -> np.ndarray:
    """The mu-law byte of every int16 sample, indexed by the sample as ``uint16``."""
    pcm = np.arange(65536, dtype=np.uint16).view(np.int16).astype(np.int32) >> 2
    magnitude = np.abs(pcm) + (_BIAS >> 2)
    segment = np.searchsorted(_SEGMENT_ENDS, magnitude)
    code = np.where(
        segment < len(_SEGMENT_ENDS),
        (segment << 4) | ((magnitude >> (segment + 1)) & _STEP),
        _SEGMENT | _STEP,
    )
    # G.711 sends every bit inverted, except the sign of a positive sample.
    inverted = np.where(pcm < 0, 0x7F, 0xFF)
    return (code ^ inverted).astype(np.uint8)


def _decode_table() -> np.ndarray:
    """The int16 sample of every mu-law byte."""
    code = ~np.arange(256, dtype=np.int32) & 0xFF
    magnitude = (((code & _STEP) << 3) + _BIAS) << ((code & _SEGMENT) >> 4)
    return np.where(code & _SIGN, _BIAS - magnitude, magnitude - _BIAS).astype(np.int16)


_ENCODE = _encode_table()
_DECODE = _decode_table()


def encode(samples: np.ndarray) -> bytes:
    """Float32 mono in [-1, 1] to one mu-law byte per sample.

    Samples are scaled to int16 and clipped (truncating, as the frame and WAV writers do),
    so a sample past full scale encodes as the loudest code rather than wrapping round.
    """
    pcm = np.clip(np.asarray(samples, dtype=np.float32) * _SCALE, -32768.0, 32767.0)
    return _ENCODE[pcm.astype(np.int16).view(np.uint16)].tobytes()


def decode(data: bytes) -> np.ndarray:
    """Mu-law bytes to float32 mono in [-1, 1], one sample per byte."""
    codes = np.frombuffer(data, dtype=np.uint8)
    return (_DECODE[codes] / np.float32(_SCALE)).astype(np.float32)
