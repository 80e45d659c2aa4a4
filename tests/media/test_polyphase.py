"""The polyphase resampler: 20 ms in is 20 ms out, speech band kept, aliases removed."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from media.audio.polyphase import PolyphaseResampler

RTC = 48_000


def tone(hz: float, seconds: float = 1.0, rate: int = RTC) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * hz * np.arange(int(seconds * rate)) / rate)).astype(np.float32)


def in_frames(resampler: PolyphaseResampler, signal: np.ndarray, frame: int) -> list[np.ndarray]:
    return [resampler.process(signal[i : i + frame]) for i in range(0, len(signal), frame)]


def gain_db(out: np.ndarray, reference: np.ndarray) -> float:
    return float(20 * np.log10(np.sqrt(np.mean(out**2)) / np.sqrt(np.mean(reference**2))))


@pytest.mark.parametrize("rate", [8_000, 16_000, 24_000])
def test_every_frame_in_gives_one_frame_out_both_ways(rate: int):
    down, up = PolyphaseResampler(RTC, rate), PolyphaseResampler(rate, RTC)
    frame = rate // 50
    assert [len(x) for x in in_frames(down, tone(440), 960)] == [frame] * 50
    assert [len(x) for x in in_frames(up, tone(440, rate=rate), frame)] == [960] * 50


def test_soxr_streams_in_blocks_that_would_delay_a_phone_call_by_140_ms():
    """Why the module exists: the same 20 ms chunks through soxr come out 140 ms at a time."""
    stream = soxr.ResampleStream(RTC, 8_000, 1, dtype="float32", quality="HQ")
    sizes = [len(stream.resample_chunk(np.zeros(960, np.float32))) for _ in range(8)]
    assert sizes[:7] == [0] * 7


def test_speech_band_passes_and_what_would_alias_is_removed():
    down = PolyphaseResampler(RTC, 8_000)
    for hz, lowest, highest in ((300, -0.1, 0.1), (3000, -0.5, 0.1), (4500, -200, -70)):
        signal = tone(hz)
        out = np.concatenate(in_frames(down, signal, 960))[800:]
        assert lowest <= gain_db(out, signal) <= highest, hz


def test_the_delay_is_a_few_milliseconds():
    down = PolyphaseResampler(RTC, 8_000)
    impulse = np.zeros(RTC // 10, np.float32)
    impulse[2400] = 1.0
    out = np.concatenate(in_frames(down, impulse, 960))
    delay_ms = (np.argmax(np.abs(out)) - 2400 / 6) / 8
    assert 0 <= delay_ms <= 4


def test_round_trip_keeps_a_tone():
    down, up = PolyphaseResampler(RTC, 16_000), PolyphaseResampler(16_000, RTC)
    signal = tone(1000)
    out = np.concatenate([up.process(x) for x in in_frames(down, signal, 960)])
    lag = int(np.argmax(np.correlate(out[4800:9600], signal[4800:5280], "valid")))
    assert abs(gain_db(out[9600:], signal[9600:])) < 0.2
    assert lag < 480
