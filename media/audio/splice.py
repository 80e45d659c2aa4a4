"""Time-scale modification with no lookahead: a playout buffer's accelerate, expand and merge.

A playout buffer moves its fill toward a target delay by playing the audio it holds faster
or slower, and keeps playing when it holds nothing. A stream stretcher (WSOLA over the
audio it is fed, as ``audiotsm`` does it) must see past each block before it can splice,
and so plays its input late: 10 ms on every receive path, 20 ms on an echo call's round
trip, which is 15 ms in all on a clean link. So a playout buffer needs operations that
work on audio it *already holds*, ahead of the play point, and leave it exactly where the
next block continues: libwebrtc's NetEq does it that way. :class:`Splicer` is those
operations. Each call returns exactly the number of samples asked for and says how many
of the samples ahead it covered:

- *normal*: the next samples as they are (bit for bit);
- *accelerate*: a pitch-matched piece of ``P`` samples is cut out at the play point, with a
  raised-cosine cross-fade from the audio before it into the audio after it;
- *preemptive expand*: the ``P`` samples at the play point are played twice, the repeat
  cross-faded in where the waveform continues it;
- *expand*, when there is too little ahead: the output goes on by repeating its own last
  pitch period(s) (``P`` chosen where the past best repeats itself, so a tone stays in
  phase), at full level for ``EXTEND_HOLD``, then fading out over ``EXTEND_FADE``;
- *merge*: when audio comes again after an expansion, the expansion is cross-faded into it,
  at the offset within one period where the two match best.

``P`` comes from the normalised cross-correlation of the audio with itself one ``P`` later,
as NetEq's pitch search does: for voiced speech and tones it is a whole number of pitch
periods, so the cross-fade joins two copies of the same waveform in phase. The pitch and
the envelope stay; only time changes. A splice that finds no match (noise that does not
repeat) is still made when the audio is quiet, and otherwise left for a later call.
"""

from __future__ import annotations

import numpy as np

RATE = 48_000
XFADE = 240  # 5 ms: every cross-fade and every matching window
MIN_PERIOD = 120  # 2.5 ms: the shortest piece accelerate or preemptive expand moves
MAX_PERIOD = 720  # 15 ms: a whole pitch period down to 66 Hz
LOOP_MIN = 240  # an expansion repeats at least 5 ms of the past...
LOOP_MAX = 960  # ...and at most 20 ms
HISTORY = LOOP_MAX + XFADE + 64  # output kept for expansion
# The output is appended to a buffer this much longer than the history, which is moved back
# to its start only when it is full: a frame costs one copy into place, not a new array.
PAST_ROOM = 16 * HISTORY
EXTEND_HOLD = RATE * 15 // 100  # 150 ms of expansion at full level, then a fade...
EXTEND_FADE = RATE // 4  # ...over 250 ms down to silence
MATCH = 0.7  # the correlation a splice needs, unless the audio is quiet
QUIET = 1e-6  # mean square (-60 dBFS): a splice in audio this quiet needs no match
# Among equally good matches (a tone matches at every period) the piece nearest the amount
# asked for wins; an expansion prefers the longer of two equal loops, which sound less buzzy.
AMOUNT_BIAS = 0.05
LOOP_BIAS = 0.01
DC_SMOOTH = 48  # 1 ms: the step at an expansion's loop point is eased out over this

_FADE_IN = (0.5 - 0.5 * np.cos(np.pi * (np.arange(XFADE) + 0.5) / XFADE)).astype(np.float32)
_FADE_OUT = (1 - _FADE_IN).astype(np.float32)
_DC_RAMP = np.linspace(1.0, 0.0, DC_SMOOTH, endpoint=False).astype(np.float32)
_TINY = 1e-20


def similarity(reference: np.ndarray, region: np.ndarray) -> np.ndarray:
    """Normalised correlation of ``reference`` with every window of ``region`` its length.

    ``result[i]`` compares ``reference`` with ``region[i : i + len(reference)]``; 1 for the
    same waveform at any level, about 0 for unrelated audio.
    """
    reference = reference.astype(np.float64)
    region = region.astype(np.float64)
    width = len(reference)
    power = np.concatenate([[0.0], np.cumsum(region * region)])
    energy = power[width:] - power[:-width]
    dot = np.correlate(region, reference, mode="valid")
    result: np.ndarray = dot / np.sqrt(energy * float(reference @ reference) + _TINY)
    return result


def _quiet(samples: np.ndarray) -> bool:
    return float(np.mean(np.square(samples, dtype=np.float64))) < QUIET if len(samples) else True


class Splicer:
    """The output of one stream, continued block by block from the audio ahead of it."""

    def __init__(self) -> None:
        self._past = np.zeros(HISTORY + PAST_ROOM, np.float32)
        self._end = HISTORY  # the history is ``_past[_end - HISTORY : _end]``
        self._loop: np.ndarray | None = None  # the expansion's repeating piece, while expanding
        self._loop_at = 0
        self._expanded = 0  # samples of expansion since audio last came
        # What the last call did, in samples (for the caller's counters).
        self.accelerated = 0
        self.preemptive = 0
        self.expanded = 0
        self.skipped = 0  # samples a merge left out to meet the expansion in phase

    @property
    def expanding(self) -> bool:
        """The last output ended inside an expansion (the next audio will be merged in)."""
        return self._loop is not None

    @property
    def faded(self) -> bool:
        """The expansion has faded to silence."""
        return self._loop is not None and self._expanded >= EXTEND_HOLD + EXTEND_FADE

    def played(self, out: np.ndarray) -> None:
        """``out`` was played as it is, without this splicer (a plain read): remember it."""
        self._remember(out)

    def reset(self) -> None:
        """Forget the past: what comes next continues from silence (after an interrupt)."""
        self._past[:] = 0.0
        self._loop = None
        self._expanded = 0

    def play(self, ahead: np.ndarray, out_samples: int, change: int = 0) -> tuple[np.ndarray, int]:
        """``out_samples`` continuing the output so far, from ``ahead``; and how many it used.

        ``ahead`` is the audio that follows the last output (float32 mono, any length).
        ``change`` asks for a time-scale step: above 0, cover up to that many samples more
        of ``ahead`` than are played (accelerate); below 0, that many fewer (preemptive
        expand). It is a wish: the step is a pitch-matched amount no larger, made only
        where the audio allows. With less ahead than the block needs the rest is expansion.
        """
        if out_samples < 0:
            raise ValueError("out_samples must not be negative")
        ahead = np.asarray(ahead, dtype=np.float32)
        if ahead.ndim != 1:
            raise ValueError("ahead must be mono: a one-dimensional array")
        self.accelerated = self.preemptive = self.expanded = self.skipped = 0
        parts: list[np.ndarray] = []
        produced = used = 0
        if self._loop is not None and len(ahead) >= XFADE and out_samples >= 2 * XFADE:
            merged, used = self._merge(ahead, out_samples)
            parts.append(self._remember(merged))
            produced = len(merged)
        if self._loop is None and produced < out_samples:
            block, step = self._continue(ahead[used:], out_samples - produced, change)
            parts.append(self._remember(block))
            produced += len(block)
            used += step
        if produced < out_samples:
            parts.append(self._remember(self._expand(out_samples - produced)))
        if not parts:
            return np.zeros(0, np.float32), 0
        return (np.concatenate(parts) if len(parts) > 1 else parts[0]), used

    # --- audio ahead ---------------------------------------------------------------------

    def _continue(self, ahead: np.ndarray, wanted: int, change: int) -> tuple[np.ndarray, int]:
        """Up to ``wanted`` samples from ``ahead`` (normal, accelerated or expanded)."""
        if change > 0 and wanted >= XFADE and len(ahead) >= wanted + MIN_PERIOD:
            cut = self._period(ahead, change, len(ahead) - wanted)
            if cut:
                self.accelerated = cut
                faded = ahead[:XFADE] * _FADE_OUT + ahead[cut : cut + XFADE] * _FADE_IN
                rest = ahead[cut + XFADE : cut + wanted]
                return np.concatenate([faded, rest]), cut + wanted
        if change < 0 and wanted >= MIN_PERIOD + XFADE and len(ahead) >= wanted:
            repeat = self._period(ahead, -change, min(wanted - XFADE, len(ahead) - XFADE))
            if repeat:
                self.preemptive = repeat
                faded = ahead[repeat : repeat + XFADE] * _FADE_OUT + ahead[:XFADE] * _FADE_IN
                rest = ahead[XFADE : wanted - repeat]
                return np.concatenate([ahead[:repeat], faded, rest]), wanted - repeat
        take = min(wanted, len(ahead))
        return ahead[:take].copy(), take

    def _period(self, ahead: np.ndarray, amount: int, longest: int) -> int:
        """The best pitch-matched step of at most ``min(amount, longest, MAX_PERIOD)``; 0 if
        the audio offers none."""
        top = min(amount, longest, MAX_PERIOD)
        if top < MIN_PERIOD:
            return 0
        match = similarity(ahead[:XFADE], ahead[MIN_PERIOD : top + XFADE])
        distance = np.abs(np.arange(MIN_PERIOD, top + 1) - amount) / MAX_PERIOD
        best = int(np.argmax(match - AMOUNT_BIAS * distance))
        if match[best] < MATCH and not _quiet(ahead[: top + XFADE]):
            return 0
        return MIN_PERIOD + best

    # --- nothing ahead -------------------------------------------------------------------

    def _expand(self, samples: int) -> np.ndarray:
        """Repeat the past: a loop of its last period(s), held, then faded."""
        if self._loop is None:
            self._loop = self._new_loop()
            self._loop_at = 0
        loop = self._loop
        index = (self._loop_at + np.arange(samples)) % len(loop)
        out = loop[index]
        self._loop_at = int(self._loop_at + samples) % len(loop)
        done = self._expanded + np.arange(1, samples + 1)
        if done[-1] > EXTEND_HOLD:
            faded = np.clip((done - EXTEND_HOLD) / EXTEND_FADE, 0.0, 1.0)
            out = out * (0.5 + 0.5 * np.cos(np.pi * faded)).astype(np.float32)
        self._expanded += samples
        self.expanded += samples
        return out.astype(np.float32, copy=False)

    def _new_loop(self) -> np.ndarray:
        """The last ``P`` samples played, ``P`` where the past best continues the present."""
        history = self._past[self._end - HISTORY : self._end]
        if _quiet(history[-LOOP_MAX:]):
            return history[-LOOP_MIN:].copy()
        # Reversed, the last window comes first and the window P earlier lies P after it.
        backwards = history[::-1]
        match = similarity(backwards[:XFADE], backwards[LOOP_MIN : LOOP_MAX + XFADE])
        lengths = np.arange(LOOP_MIN, LOOP_MAX + 1)
        period = int(lengths[int(np.argmax(match + LOOP_BIAS * lengths / LOOP_MAX))])
        loop = history[-period:].copy()
        step = history[-1] - history[-period - 1]  # what follows the loop's end vs. its start
        loop[:DC_SMOOTH] += step * _DC_RAMP
        return loop

    def _merge(self, ahead: np.ndarray, out_samples: int) -> tuple[np.ndarray, int]:
        """Cross-fade the expansion into the audio that has come, where they match.

        The join may come a little later in the expansion (it plays on for ``extra``
        samples, at most a period: the buffer keeps what it did not play) or a little later
        in the audio (``skip`` samples of it are left out, when there is more than the block
        needs), whichever matches best; a quiet expansion fades straight into the audio.
        """
        assert self._loop is not None
        reach_extra = min(len(self._loop), MAX_PERIOD, out_samples - XFADE)
        reach_skip = min(len(self._loop), MAX_PERIOD, len(ahead) - out_samples)
        upcoming = self._peek_loop(reach_extra + XFADE)
        extra = skip = 0
        if not _quiet(upcoming) and not _quiet(ahead[:XFADE]):
            later_here = similarity(ahead[:XFADE], upcoming)
            score = later_here - AMOUNT_BIAS * np.arange(len(later_here)) / MAX_PERIOD
            best = int(np.argmax(score))
            if reach_skip > 0:
                later_there = similarity(upcoming[:XFADE], ahead[: reach_skip + XFADE])
                there = later_there - AMOUNT_BIAS * np.arange(len(later_there)) / MAX_PERIOD
                if there.max() > score[best]:
                    skip = int(np.argmax(there))
                else:
                    extra = best
            else:
                extra = best
        tail = self._expand(extra + XFADE)  # what the expansion plays before and under the join
        self.expanded -= XFADE  # the cross-fade is not more expansion
        joined = tail[extra:] * _FADE_OUT + ahead[skip : skip + XFADE] * _FADE_IN
        self.skipped = skip
        self._loop = None
        self._expanded = 0
        return np.concatenate([tail[:extra], joined]), skip + XFADE

    def _peek_loop(self, samples: int) -> np.ndarray:
        """The expansion's next ``samples``, without playing them (no fade applied)."""
        assert self._loop is not None
        return self._loop[(self._loop_at + np.arange(samples)) % len(self._loop)]

    def _remember(self, out: np.ndarray) -> np.ndarray:
        """Keep ``out`` as the most recent past; returns it."""
        past, end, samples = self._past, self._end, len(out)
        if samples >= HISTORY:
            past[:HISTORY] = out[-HISTORY:]
            self._end = HISTORY
        elif samples:
            if end + samples > len(past):
                past[:HISTORY] = past[end - HISTORY : end]
                end = HISTORY
            past[end : end + samples] = out
            self._end = end + samples
        return out
