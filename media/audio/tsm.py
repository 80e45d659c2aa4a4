"""Streaming time-scale modification for playout: stretch or shorten 20 ms blocks, keep the pitch.

A playout buffer in the manner of libwebrtc's NetEq moves its fill level toward a target
delay by playing audio slower ("expand") while packets are late and faster ("accelerate")
when it holds more than it needs, and keeps playing from the past audio alone when nothing
new has come. This module does the signal part: one ``TimeStretcher`` per stream turns each
block into exactly the number of samples the pacer asks for, with no hole, click or pitch
change.

The method is WSOLA (waveform-similarity overlap-add), run on a fixed 5 ms output grid.
Each output segment is a raised-cosine cross-fade from the natural continuation of the
previous segment into a piece of input taken near where the requested time map says the
output should be; the piece is chosen, within ``SEARCH`` samples before that point, where
its waveform best matches the natural continuation (normalised cross-correlation). For a
periodic sound the best match is a whole number of pitch periods away, so the cross-fade
joins two copies of the same waveform in phase: pitch periods are repeated or skipped, the
frequency and the envelope stay, and a tone comes out as a tone. This is what NetEq's
accelerate and expand do (they cut or repeat one pitch period at a time), generalised to an
arbitrary ratio exact to the sample, because the pacer needs the output length it asks for.

Why not a library: ``pytsmod`` works on a whole signal at once (a fixed or anchored scale
over a finished array), with no state between calls, so it cannot run block by block.
``audiotsm`` does stream, but its speed becomes an integer analysis hop, it releases output
a synthesis hop (512 samples by default) at a time rather than the count asked for, and its
frames and tolerance (1024 and 512 samples by default) hold tens of milliseconds. Neither
gives the exact per-call length, nor the bounded, stated delay, this module is for.

Delay: the stretcher needs ``LOOKAHEAD`` input samples (10 ms) beyond the point it plays,
so on a stream that has run at ratio 1 throughout, the output is the input delayed by
exactly ``LOOKAHEAD`` samples, bit for bit. Each splice may take its piece up to ``SEARCH``
samples before the point the time map asks for, and within a segment the input plays at
its own pace whatever the ratio, so once the ratio has moved the delay lies between
``LOOKAHEAD - SEGMENT`` and ``LOOKAHEAD + SEARCH + SEGMENT`` (5 to 25 ms) for ratios up to
2. Back at ratio 1 it stays put (on periodic sound or silence it may step back toward
``LOOKAHEAD``). ``lag`` says where it is: that audio is buffered audio, which a playout
buffer should count in its fill.
"""

from __future__ import annotations

import numpy as np

RATE = 48_000
SEGMENT = 240  # 5 ms: the output hop, also the cross-fade and the matching length
SEARCH = 720  # 15 ms back: a match for every pitch period down to 66 Hz
LOOKAHEAD = 2 * SEGMENT  # input beyond the point played: the next piece and its continuation
EXTEND_HOLD = RATE // 10  # 100 ms of extension at full level, then a fade...
EXTEND_FADE = RATE // 5  # ...over 200 ms down to silence
RECOVER = RATE // 100  # 10 ms: the ramp back to full level once input returns
# A small preference for pieces near the requested point: among equally good matches (a
# tone matches at every period, silence everywhere) the nearest wins, which pulls the delay
# back toward LOOKAHEAD after stretching. At full SEARCH it costs 0.005 of correlation.
SEARCH_BIAS = 0.005

DECIMATION = 4  # the coarse search runs at 12 kHz, NetEq's runs at 4 kHz
_FADE_IN = (0.5 - 0.5 * np.cos(np.pi * (np.arange(SEGMENT) + 0.5) / SEGMENT)).astype(np.float32)
_FADE_OUT = (1 - _FADE_IN).astype(np.float32)
_COARSE_SEGMENT = SEGMENT // DECIMATION
_PENALTY = SEARCH_BIAS * np.arange(SEARCH, -1, -1) / SEARCH  # by offset from the region start
_TINY = 1e-20  # keeps the normalisation finite on digital silence

assert SEARCH % DECIMATION == 0 and SEGMENT % DECIMATION == 0


class TimeStretcher:
    """WSOLA over one mono float32 stream at 48 kHz; every call continues the last one.

    Coordinates are absolute sample indices: input index 0 is the first sample given, output
    index 0 the first returned. The time map from output to input is built call by call: a
    ``stretch`` of ``n`` input samples into ``m`` output samples maps those ``m`` output
    positions linearly onto the next ``n`` input positions, ``LOOKAHEAD`` behind the newest
    input; ``extend`` maps its output onto no input at all (the map stands still).
    """

    def __init__(self) -> None:
        self._start = -LOOKAHEAD - SEARCH  # input index of self._input[0]
        # Before the first block the stream is silence, so the first output is LOOKAHEAD zeros.
        self._input = np.zeros(SEARCH + LOOKAHEAD, np.float32)
        self._map_in = -LOOKAHEAD  # input position mapped to the next output sample
        self._out = 0  # output index of the next sample to return
        self._next_segment = 0  # output index where the next segment starts
        self._piece = -LOOKAHEAD - SEGMENT  # input index of the last segment's piece
        self._tail = np.zeros(SEGMENT, np.float32)  # that piece's natural continuation
        self._ready = np.zeros(0, np.float32)  # finished output from self._out on
        self._gain = 1.0  # gain of the last sample returned
        self._extended = 0  # samples returned by extend() since input last came

    @property
    def lag(self) -> int:
        """Input samples given whose audio has not been played yet (the stretcher's delay).

        Counted from the input position of the next sample to come out. ``LOOKAHEAD`` on a
        stream at ratio 1 from the start; within ``[LOOKAHEAD - SEGMENT, LOOKAHEAD + SEARCH +
        SEGMENT]`` whenever every call asks for at least ``SEGMENT`` samples at a ratio up to
        2 (and under ``extend``).
        """
        played = self._piece + self._out - (self._next_segment - SEGMENT)
        return self._start + len(self._input) - played

    def stretch(self, block: np.ndarray, out_samples: int) -> np.ndarray:
        """Play ``block`` (any length, float32 mono) as exactly ``out_samples`` samples.

        ``out_samples / len(block)`` is the stretch ratio: 2.0 expands 20 ms to 40 ms, 0.5
        accelerates 20 ms to 10 ms; quality is meant for 0.5 to 2, lengths are exact for any.
        """
        samples = np.asarray(block, dtype=np.float32)
        if samples.ndim != 1:
            raise ValueError("block must be mono: a one-dimensional array")
        self._extended = 0
        out = self._render(samples, out_samples)
        if self._gain < 1.0 and len(out):
            ramp = np.minimum(1.0, self._gain + np.arange(1, len(out) + 1) / RECOVER)
            out *= ramp.astype(np.float32)
            self._gain = float(ramp[-1])
        return out

    def extend(self, out_samples: int) -> np.ndarray:
        """Keep playing ``out_samples`` samples with no new input: expand the past audio.

        The time map stands still, so each segment is again the best match to the natural
        continuation among the last ``SEARCH`` samples: a periodic sound goes on repeating
        its last pitch periods in phase. After ``EXTEND_HOLD`` (100 ms) without input the
        level fades out over ``EXTEND_FADE`` (200 ms) and stays silent; the next ``stretch``
        ramps it back over ``RECOVER`` (10 ms).
        """
        out = self._render(np.zeros(0, np.float32), out_samples)
        done = self._extended + np.arange(1, len(out) + 1)
        faded = np.clip((done - EXTEND_HOLD) / EXTEND_FADE, 0.0, 1.0)
        curve = 0.5 + 0.5 * np.cos(np.pi * faded)
        gain = np.minimum(curve, self._gain + np.arange(1, len(out) + 1) / RECOVER)
        self._extended += len(out)
        if len(out):
            self._gain = float(gain[-1])
            if gain.min() < 1.0:
                out *= gain.astype(np.float32)
        return out

    def _render(self, samples: np.ndarray, out_samples: int) -> np.ndarray:
        if out_samples < 0:
            raise ValueError("out_samples must not be negative")
        self._input = np.concatenate([self._input, samples])
        end = self._out + out_samples
        segments = [self._ready]
        while self._next_segment < end:
            # The time map at this segment's start, rounded down so that it stays short of
            # the input LOOKAHEAD samples from the newest sample.
            target = self._map_in + (self._next_segment - self._out) * len(samples) // out_samples
            segments.append(self._segment(target))
            self._next_segment += SEGMENT
        rendered = np.concatenate(segments)
        self._ready = rendered[out_samples:]
        self._out = end
        self._map_in += len(samples)
        keep_from = self._map_in - SEARCH  # the earliest input a later search can reach
        self._input = self._input[keep_from - self._start :]
        self._start = keep_from
        return rendered[:out_samples]

    def _segment(self, target: int) -> np.ndarray:
        """The next SEGMENT output samples, with their piece taken near input index ``target``."""
        natural = self._piece + SEGMENT
        piece = target if natural == target else self._best_piece(target)
        at = piece - self._start
        fresh = self._input[at : at + SEGMENT]
        # The natural continuation is the tail itself: no cross-fade, so ratio 1 is bit-exact.
        segment = fresh if piece == natural else self._tail * _FADE_OUT + fresh * _FADE_IN
        self._tail = self._input[at + SEGMENT : at + 2 * SEGMENT]
        self._piece = piece
        return segment

    def _best_piece(self, target: int) -> int:
        """The input index in ``[target - SEARCH, target]`` whose piece best continues the tail.

        Coarse to fine, as NetEq's pitch search: the normalised cross-correlation of block
        sums (a 12 kHz copy) at every ``DECIMATION``-th offset, then at full rate around the
        best of those. The natural continuation, when in reach, is a candidate of its own:
        it is the tail itself (correlation 1), which the coarse grid may straddle.
        """
        lo = target - SEARCH - self._start
        region = self._input[lo : lo + SEARCH + SEGMENT]
        tail = self._tail
        blocks = region.reshape(-1, DECIMATION).sum(axis=1)
        reference = tail.reshape(-1, DECIMATION).sum(axis=1)
        block_power = _running_sum(np.square(blocks, dtype=np.float64))
        block_energy = block_power[_COARSE_SEGMENT:] - block_power[:-_COARSE_SEGMENT]
        coarse = np.correlate(blocks, reference) / np.sqrt(
            block_energy * float(reference @ reference) + _TINY
        )
        best = DECIMATION * int(np.argmax(coarse - _PENALTY[::DECIMATION]))
        first = max(0, best - DECIMATION + 1)
        last = min(SEARCH, best + DECIMATION - 1)
        power = _running_sum(np.square(region[first : last + SEGMENT], dtype=np.float64))
        tail_energy = float(tail @ tail)
        fine = np.correlate(region[first : last + SEGMENT], tail) / np.sqrt(
            (power[SEGMENT:] - power[:-SEGMENT]) * tail_energy + _TINY
        )
        score = fine - _PENALTY[first : last + 1]
        offset = first + int(np.argmax(score))
        natural = self._piece + SEGMENT - (target - SEARCH)
        if 0 <= natural <= SEARCH and tail_energy > 0 and 1 - _PENALTY[natural] >= score.max():
            offset = natural
        return target - SEARCH + offset


def _running_sum(values: np.ndarray) -> np.ndarray:
    """Sums of ``values[:i]`` for every ``i``: any window's sum is a difference of two."""
    return np.concatenate([[0.0], np.cumsum(values)])
