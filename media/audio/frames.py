"""Conversion between WebRTC audio frames and the float32 mono arrays engines work on.

aiortc decodes every Opus packet to 48 kHz signed 16-bit packed stereo, 960 samples (20 ms),
even when the caller sends mono; engines want float32 mono in [-1, 1]. Outgoing frames are
built in that same s16 packed stereo layout: aiortc's encoder would otherwise upmix mono
with FFmpeg's -3 dB centre gain, and a round trip through two such upmixes loses 6 dB.
"""

from __future__ import annotations

from fractions import Fraction

import av
import numpy as np

RTC_RATE = 48_000
FRAME_MS = 20
FRAME_SAMPLES = RTC_RATE * FRAME_MS // 1000  # 960
TIME_BASE = Fraction(1, RTC_RATE)

_INT16_SCALE = 32768.0


def frame_to_mono(frame: av.AudioFrame) -> np.ndarray:
    """Downmix any s16/float frame to float32 mono in [-1, 1]."""
    data = frame.to_ndarray()
    channels = len(frame.layout.channels)
    if frame.format.is_planar:
        mixed = data.mean(axis=0) if channels > 1 else data[0]
    elif channels > 1:
        mixed = data.reshape(-1, channels).mean(axis=1)
    else:
        mixed = data.reshape(-1)
    if data.dtype == np.int16:
        return (mixed / _INT16_SCALE).astype(np.float32, copy=False)
    return mixed.astype(np.float32, copy=False)


def mono_to_frame(samples: np.ndarray, pts: int, rate: int = RTC_RATE) -> av.AudioFrame:
    """Wrap float32 mono samples as an s16 stereo frame (same signal in both channels)."""
    pcm = np.clip(samples * _INT16_SCALE, -32768.0, 32767.0).astype(np.int16)
    stereo = np.repeat(pcm, 2).reshape(1, -1)
    frame = av.AudioFrame.from_ndarray(stereo, format="s16", layout="stereo")
    frame.sample_rate = rate
    frame.pts = pts
    frame.time_base = Fraction(1, rate)
    return frame
