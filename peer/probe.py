"""In-band round-trip measurement for the headless test peer.

The peer streams audio to the server and records what comes back. Round-trip time (RTT)
is the time between a sound leaving the peer and the same sound returning, so it is
measured on the audio itself rather than on RTCP reports: that way it includes every
buffer on the path (encoder, network, jitter buffer, engine, resampling), which is what a
caller actually hears.

Two stream positions are turned into times with a :class:`Timeline` per direction: the
peer stamps every frame it sends and every frame it receives with ``time.monotonic()``,
and sample ``k`` of a frame stamped ``at`` is taken to be at ``at + k / sample_rate``.
Both directions use the same convention, so it cancels out of the difference, and irregular
arrival (network jitter, bursts released by the jitter buffer) is honoured frame by frame.

Two ways to find the same sound in both streams:

* Markers, for engines that preserve the waveform (``echo``): :class:`ChirpInserter` mixes
  a short chirp into the outgoing audio at a fixed interval and records where each one
  starts; :func:`detect_markers` finds them in the returned audio with a normalised
  matched filter; :func:`rtt_from_markers` pairs the two lists of times. Sample accurate.
* Envelopes, for engines that change the waveform (``denoise`` would strip a chirp):
  :func:`rtt_from_envelopes` matches short-time loudness contours of speech windows.
  Accurate to a few milliseconds, and only where the audio has speech in it.

:func:`align` is the waveform counterpart used to check that an identity call returns what
was sent, and :func:`summarize` reduces a list of RTTs to the figures a report shows.

Everything here is plain numpy so the peer can run anywhere the server's tests run.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

SAMPLE_RATE = 48_000
FRAME_SAMPLES = 960  # 20 ms at 48 kHz, the WebRTC/Opus frame the peer sends

# The marker: a 5 ms linear up-chirp from 2 to 8 kHz. The band sits above most speech
# energy and well inside what Opus codes at 96 kb/s; the time-bandwidth product (30) gives
# a sharp matched-filter peak, about 8 samples wide, so detection is sample accurate.
MARKER_DURATION_S = 0.005
MARKER_START_HZ = 2_000.0
MARKER_END_HZ = 8_000.0
MARKER_AMPLITUDE = 0.25  # loud enough to survive the codec, quiet enough not to clip
MARKER_RAMP_S = 0.0005  # raised-cosine edges, so the marker does not click or splatter
MARKER_INTERVAL_S = 0.5
# Program audio under a marker is attenuated to this gain (with the marker's own ramps),
# so loud speech can neither mask the marker nor push the sum into clipping. 5 ms of
# ducking every half second is inaudible in a test call.
MARKER_DUCK_GAIN = 0.1

# Detection: normalised correlation against the exact template. A clean marker scores
# close to 1 and still about 0.9 after Opus; speech and noise stay far below 0.5, because
# a 240-sample template has little chance correlation with anything that is not itself.
DETECT_THRESHOLD = 0.6
DETECT_REFRACTORY_S = 0.1  # one detection per marker: weaker peaks this close are dropped
# Local energy below this fraction of the template's energy counts as silence, so the
# normalisation does not divide rounding noise by zero (-60 dB relative to the marker).
DETECT_ENERGY_FLOOR = 1e-6

# Envelopes: RMS in 2 ms bins, in dB with a floor. The log makes the contour depend on the
# shape of the speech rather than its level, and the floor makes the silence a denoiser
# produces look like the noise it removed (both sit at the bottom of the scale).
ENVELOPE_BIN_S = 0.002
ENVELOPE_FLOOR_DB = -70.0
ENVELOPE_MIN_CORR = 0.5  # below this the best lag is not trusted
# A window whose contour varies less than this (standard deviation, dB) is silence or
# steady noise: it has no features to align, so it is skipped rather than guessed.
ENVELOPE_MIN_STD_DB = 3.0

# align(): a lag is only considered when at least this fraction of the shorter input
# overlaps; tiny overlaps give meaningless correlations close to +-1.
ALIGN_MIN_OVERLAP_FRACTION = 0.5

_TINY = 1e-20


@dataclass
class Timeline:
    """Maps sample positions of one direction's stream to monotonic seconds.

    Call :meth:`append` once per frame, in stream order, with the number of samples in
    the frame and the time it was sent (outgoing) or received (incoming). Frames may have
    any size and any spacing in time; nothing assumes they were evenly paced.
    """

    sample_rate: int = SAMPLE_RATE
    total_samples: int = field(default=0, init=False)
    _starts: list[int] = field(default_factory=list, init=False, repr=False)
    _times: list[float] = field(default_factory=list, init=False, repr=False)
    # Running maximum of the stamps, a non-decreasing version used by index_at().
    _rising: list[float] = field(default_factory=list, init=False, repr=False)

    def append(self, frame_samples: int, at: float) -> None:
        """Record that the next ``frame_samples`` samples left or arrived at ``at``."""
        if frame_samples <= 0:
            raise ValueError("a frame must have at least one sample")
        self._starts.append(self.total_samples)
        self._times.append(float(at))
        self._rising.append(max(float(at), self._rising[-1]) if self._rising else float(at))
        self.total_samples += int(frame_samples)

    def __len__(self) -> int:
        return self.total_samples

    def time_of(self, sample_index: float) -> float:
        """Monotonic time of a (possibly fractional) sample position.

        Inside the recorded range it is the owning frame's stamp plus the offset within
        the frame; outside it is extrapolated at the nominal rate from the nearest frame.
        """
        if not self._starts:
            raise ValueError("timeline is empty")
        frame = max(bisect.bisect_right(self._starts, sample_index) - 1, 0)
        return self._times[frame] + (sample_index - self._starts[frame]) / self.sample_rate

    def index_at(self, t: float) -> float:
        """Approximate inverse of :meth:`time_of`: the sample position stamped ``t``.

        Stamps need not increase (a burst may share one), so this interpolates over their
        running maximum. It is meant for bounding searches, not for measurements.
        """
        if not self._starts:
            raise ValueError("timeline is empty")
        frame = max(bisect.bisect_right(self._rising, t) - 1, 0)
        offset = (t - self._rising[frame]) * self.sample_rate
        if frame + 1 < len(self._starts):
            offset = min(offset, self._starts[frame + 1] - self._starts[frame])
        return self._starts[frame] + offset


def make_chirp(
    sample_rate: int = SAMPLE_RATE,
    duration_s: float = MARKER_DURATION_S,
    start_hz: float = MARKER_START_HZ,
    end_hz: float = MARKER_END_HZ,
    amplitude: float = MARKER_AMPLITUDE,
    ramp_s: float = MARKER_RAMP_S,
) -> np.ndarray:
    """The marker waveform: a linear chirp with raised-cosine edges, float32."""
    n = round(duration_s * sample_rate)
    t = np.arange(n) / sample_rate
    sweep = (end_hz - start_hz) / duration_s
    phase = 2 * np.pi * (start_hz * t + 0.5 * sweep * t * t)
    return (amplitude * _ramped_window(n, round(ramp_s * sample_rate)) * np.sin(phase)).astype(
        np.float32
    )


def _ramped_window(n: int, ramp: int) -> np.ndarray:
    """Flat window of length ``n`` with raised-cosine ramps of ``ramp`` samples each."""
    window = np.ones(n)
    ramp = min(ramp, n // 2)
    if ramp > 0:
        edge = 0.5 - 0.5 * np.cos(np.pi * (np.arange(ramp) + 0.5) / ramp)
        window[:ramp] = edge
        window[n - ramp :] = edge[::-1]
    return window


class ChirpInserter:
    """Mixes a marker into the outgoing audio every ``interval_s`` and remembers where.

    Feed every outgoing frame through :meth:`process` and send what it returns. Markers
    may straddle frame boundaries. ``marker_starts`` lists the sent-stream sample index at
    which each marker begins, in the same numbering as the sent :class:`Timeline`.

    Use it only with engines that preserve the waveform; the interval must be longer than
    the largest RTT to be measured, since each returning marker is paired with the latest
    one sent before it.
    """

    def __init__(
        self,
        interval_s: float = MARKER_INTERVAL_S,
        sample_rate: int = SAMPLE_RATE,
        amplitude: float = MARKER_AMPLITUDE,
        first_at_s: float | None = None,
        duck_gain: float = MARKER_DUCK_GAIN,
    ) -> None:
        self.sample_rate = sample_rate
        self.interval_s = interval_s
        self.template = make_chirp(sample_rate, amplitude=amplitude)
        if round(interval_s * sample_rate) <= len(self.template):
            raise ValueError("marker interval must be longer than the marker")
        ramp = round(MARKER_RAMP_S * sample_rate)
        self._duck = (1.0 - (1.0 - duck_gain) * _ramped_window(len(self.template), ramp)).astype(
            np.float32
        )
        self._interval = round(interval_s * sample_rate)
        # The first marker waits one interval by default, so it lands after the call settles.
        self._next = round((interval_s if first_at_s is None else first_at_s) * sample_rate)
        self._position = 0
        self.marker_starts: list[int] = []

    @property
    def samples_processed(self) -> int:
        return self._position

    def process(self, frame: np.ndarray) -> np.ndarray:
        """Return ``frame`` (float32 mono) with any marker due in it mixed in."""
        out = np.array(frame, dtype=np.float32).reshape(-1)
        start, end = self._position, self._position + len(out)
        while self._next < end:
            self.marker_starts.append(self._next)
            self._next += self._interval
        length = len(self.template)
        for marker in reversed(self.marker_starts):
            if marker + length <= start:
                break  # older markers ended before this frame
            lo, hi = max(marker, start), min(marker + length, end)
            if lo >= hi:
                continue
            dst = slice(lo - start, hi - start)
            src = slice(lo - marker, hi - marker)
            out[dst] = out[dst] * self._duck[src] + self.template[src]
        self._position = end
        return np.clip(out, -1.0, 1.0, out=out)


def detect_markers(
    received: np.ndarray,
    template: np.ndarray,
    threshold: float = DETECT_THRESHOLD,
    refractory_s: float = DETECT_REFRACTORY_S,
    sample_rate: int = SAMPLE_RATE,
) -> list[int]:
    """Sample indices in ``received`` at which a copy of ``template`` starts.

    The score at each position is the correlation of the template with the received
    audio under it, divided by both norms, so it is in [-1, 1] and independent of the
    return path's gain; anything that is not the template (speech, noise) scores low.
    Positions scoring at least ``threshold`` that are local maxima are kept, strongest
    first, and any other peak within ``refractory_s`` of a kept one is dropped.
    """
    x = np.asarray(received, dtype=np.float64).reshape(-1)
    t = np.asarray(template, dtype=np.float64).reshape(-1)
    n, m = len(x), len(t)
    t_norm = float(np.sqrt(np.dot(t, t)))
    if m == 0 or n < m or t_norm == 0.0:
        return []
    numerator = _cross_correlate(x, t)[: n - m + 1]
    energy = np.concatenate(([0.0], np.cumsum(x * x)))
    local = np.maximum(energy[m:] - energy[:-m], DETECT_ENERGY_FLOOR * t_norm**2)
    score = numerator / (t_norm * np.sqrt(local))

    above = score >= threshold
    if not above.any():
        return []
    left = np.concatenate(([-np.inf], score[:-1]))
    right = np.concatenate((score[1:], [-np.inf]))
    peaks = np.flatnonzero(above & (score >= left) & (score > right))
    refractory = max(1, round(refractory_s * sample_rate))
    kept: list[int] = []
    for peak in peaks[np.argsort(-score[peaks], kind="stable")]:
        i = bisect.bisect_left(kept, peak)
        if i > 0 and peak - kept[i - 1] < refractory:
            continue
        if i < len(kept) and kept[i] - peak < refractory:
            continue
        kept.insert(i, int(peak))
    return kept


def rtt_from_markers(
    sent_marker_times: Sequence[float],
    received_marker_times: Sequence[float],
    max_rtt_s: float = MARKER_INTERVAL_S,
) -> list[float]:
    """RTTs in seconds, one per received marker that can be paired with a sent one.

    Each received marker belongs to the latest marker sent at or before it, provided
    that is within ``max_rtt_s``; a sent marker is used once, so a duplicate detection is
    dropped rather than paired with an older marker (which would add a whole interval).
    Lost markers simply yield no RTT.
    """
    sent = sorted(sent_marker_times)
    used: set[int] = set()
    rtts: list[float] = []
    for received in sorted(received_marker_times):
        i = bisect.bisect_right(sent, received) - 1
        if i < 0 or i in used or received - sent[i] > max_rtt_s:
            continue
        used.add(i)
        rtts.append(received - sent[i])
    return rtts


def marker_rtts(
    inserter: ChirpInserter,
    sent_timeline: Timeline,
    received: np.ndarray,
    received_timeline: Timeline,
    threshold: float = DETECT_THRESHOLD,
) -> list[float]:
    """RTTs (seconds) of every marker ``inserter`` placed that came back in ``received``.

    ``received`` is the concatenation of the frames recorded in ``received_timeline``.
    Only markers that were sent in full are counted, and the pairing window is the marker
    interval, the largest RTT this method can tell apart.
    """
    length = len(inserter.template)
    sent_times = [
        sent_timeline.time_of(start)
        for start in inserter.marker_starts
        if start + length <= len(sent_timeline)
    ]
    found = detect_markers(
        received, inserter.template, threshold=threshold, sample_rate=inserter.sample_rate
    )
    received_times = [received_timeline.time_of(index) for index in found]
    return rtt_from_markers(sent_times, received_times, max_rtt_s=inserter.interval_s)


def envelope_db(
    audio: np.ndarray,
    bin_samples: int,
    floor_db: float = ENVELOPE_FLOOR_DB,
) -> np.ndarray:
    """Short-time RMS level in dBFS, one value per ``bin_samples`` (trailing part dropped)."""
    x = np.asarray(audio, dtype=np.float64).reshape(-1)
    bins = len(x) // bin_samples
    if bins == 0:
        return np.zeros(0)
    rms = np.sqrt(np.mean(x[: bins * bin_samples].reshape(bins, bin_samples) ** 2, axis=1))
    return 20.0 * np.log10(np.maximum(rms, 10.0 ** (floor_db / 20.0)))


def rtt_from_envelopes(
    sent: np.ndarray,
    sent_timeline: Timeline,
    received: np.ndarray,
    received_timeline: Timeline,
    window_s: float = 3.0,
    hop_s: float = 1.0,
    max_lag_s: float = 1.0,
    min_corr: float = ENVELOPE_MIN_CORR,
    bin_s: float = ENVELOPE_BIN_S,
) -> list[float]:
    """RTTs in seconds, one per received window of speech whose envelope matches clearly.

    For each ``window_s`` of the received stream (every ``hop_s``) the received envelope
    is compared, by normalised correlation, with every sent window that left between
    ``max_lag_s`` before and the moment the received window arrived. The search is done
    in time, through the timelines, because the two recordings need not start together.
    Windows without enough level variation (silence, steady noise), windows whose best
    correlation is below ``min_corr`` and windows whose best match lies on the edge of
    the search are skipped. The best position is refined to a fraction of a bin and the
    RTT is the received time of the window centre minus the sent time of its match.
    """
    if sent_timeline.sample_rate != received_timeline.sample_rate:
        raise ValueError("both timelines must use the same sample rate")
    if len(sent_timeline) == 0 or len(received_timeline) == 0:
        return []
    rate = sent_timeline.sample_rate
    bin_samples = max(1, round(bin_s * rate))
    env_sent = envelope_db(sent, bin_samples)
    env_received = envelope_db(received, bin_samples)
    width = round(window_s * rate / bin_samples)
    hop = max(1, round(hop_s * rate / bin_samples))
    if width < 3 or len(env_sent) < width or len(env_received) < width:
        return []
    sent_windows = np.lib.stride_tricks.sliding_window_view(env_sent, width)
    sent_sums = np.concatenate(([0.0], np.cumsum(env_sent)))
    sent_squares = np.concatenate(([0.0], np.cumsum(env_sent**2)))
    half = width / 2

    rtts: list[float] = []
    for first in range(0, len(env_received) - width + 1, hop):
        window = env_received[first : first + width]
        if np.std(window) < ENVELOPE_MIN_STD_DB:
            continue
        centered = window - window.mean()
        received_centre = (first + half) * bin_samples
        arrived = received_timeline.time_of(received_centre)
        # Sent window starts (in bins) whose centre left within max_lag_s before arrival.
        lo = sent_timeline.index_at(arrived - max_lag_s) / bin_samples - half
        hi = sent_timeline.index_at(arrived) / bin_samples - half
        lo_bin = max(int(np.floor(lo)), 0)
        hi_bin = min(int(np.ceil(hi)), len(sent_windows) - 1)
        if hi_bin - lo_bin < 2:
            continue
        candidates = sent_windows[lo_bin : hi_bin + 1]
        sums = sent_sums[lo_bin + width : hi_bin + width + 1] - sent_sums[lo_bin : hi_bin + 1]
        squares = (
            sent_squares[lo_bin + width : hi_bin + width + 1] - sent_squares[lo_bin : hi_bin + 1]
        )
        variance = np.maximum(squares - sums * sums / width, 0.0)
        denominator = np.sqrt(variance * np.dot(centered, centered))
        corr = np.where(
            denominator > _TINY, candidates @ centered / np.maximum(denominator, _TINY), 0.0
        )
        best = int(np.argmax(corr))
        if corr[best] < min_corr or best == 0 or best == len(corr) - 1:
            continue
        offset = _parabolic_offset(corr[best - 1], corr[best], corr[best + 1])
        sent_centre = (lo_bin + best + offset + half) * bin_samples
        rtts.append(arrived - sent_timeline.time_of(sent_centre))
    return rtts


def _parabolic_offset(before: float, peak: float, after: float) -> float:
    """Sub-bin position of a peak from the parabola through it and its neighbours."""
    curvature = before - 2.0 * peak + after
    if curvature >= 0.0:
        return 0.0
    return float(np.clip(0.5 * (before - after) / curvature, -0.5, 0.5))


def align(
    sent: np.ndarray,
    received: np.ndarray,
    max_lag: int,
    min_overlap: int | None = None,
) -> tuple[int, float]:
    """Lag of ``received`` behind ``sent`` in samples, and the correlation at that lag.

    A positive lag means ``received[n + lag]`` matches ``sent[n]``. Lags from
    ``-max_lag`` to ``max_lag`` are tried; at each one the correlation is taken over the
    overlapping part only and normalised by the energy of both inputs in that part, so it
    is a true correlation coefficient in [-1, 1] (about 1 for an identity path whatever
    its gain). Lags overlapping fewer than ``min_overlap`` samples (by default half the
    shorter input) are not considered. Uses one FFT correlation for all lags.
    """
    s = np.asarray(sent, dtype=np.float64).reshape(-1)
    r = np.asarray(received, dtype=np.float64).reshape(-1)
    if len(s) == 0 or len(r) == 0:
        raise ValueError("align needs two non-empty signals")
    if min_overlap is None:
        min_overlap = max(1, int(ALIGN_MIN_OVERLAP_FRACTION * min(len(s), len(r))))
    lags = np.arange(-max_lag, max_lag + 1)
    lo = np.maximum(0, -lags)  # first sent sample in the overlap
    hi = np.minimum(len(s), len(r) - lags)  # one past the last
    keep = hi - lo >= min_overlap
    if not keep.any():
        raise ValueError("no lag within max_lag leaves enough overlap")
    lags, lo, hi = lags[keep], lo[keep], hi[keep]

    full = _cross_correlate(r, s)
    numerator = full[lags % len(full)]
    s_energy = np.concatenate(([0.0], np.cumsum(s * s)))
    r_energy = np.concatenate(([0.0], np.cumsum(r * r)))
    energy = (s_energy[hi] - s_energy[lo]) * (r_energy[hi + lags] - r_energy[lo + lags])
    corr = np.where(energy > _TINY, numerator / np.sqrt(np.maximum(energy, _TINY)), 0.0)
    best = int(np.argmax(corr))
    return int(lags[best]), float(np.clip(corr[best], -1.0, 1.0))


def _cross_correlate(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``c[k] = sum_n x[n + k] * y[n]`` for all k, circularly indexed (negative k at the end).

    The FFT is long enough that no wrap-around mixes lags: entries ``0 .. len(x) - 1`` are
    the non-negative lags and the last ``len(y) - 1`` entries the negative ones.
    """
    size = _fast_length(len(x) + len(y) - 1)
    spectrum = np.fft.rfft(x, size) * np.conj(np.fft.rfft(y, size))
    return np.fft.irfft(spectrum, size)


def _fast_length(n: int) -> int:
    """Smallest 2^a * 3^b * 5^c >= n, a length numpy's FFT handles quickly."""
    best = 1 << max(0, (n - 1).bit_length())
    power5 = 1
    while power5 < best:
        power35 = power5
        while power35 < best:
            candidate = power35
            while candidate < n:
                candidate *= 2
            best = min(best, candidate)
            power35 *= 3
        power5 *= 5
    return best


# Holes in a continuous signal: 5 ms windows more than HOLE_DB below its level are silent,
# and a run of them at least HOLE_MIN_S long is a hole.
HOLE_WINDOW_S = 0.005
HOLE_DB = 40.0
HOLE_MIN_S = 0.02


@dataclass(frozen=True)
class Holes:
    """Silent runs in audio that should never be silent (a tone sent without a break)."""

    lengths_ms: list[float]  # every run of HOLE_MIN_S or longer
    silent_ms: float  # all silent windows together, holes or not
    total_ms: float

    @property
    def silent_share(self) -> float:
        return self.silent_ms / self.total_ms if self.total_ms else 0.0

    @property
    def longest_ms(self) -> float:
        return max(self.lengths_ms, default=0.0)


def holes(
    received: np.ndarray,
    level: float,
    sample_rate: int = SAMPLE_RATE,
    below_db: float = HOLE_DB,
    window_s: float = HOLE_WINDOW_S,
    min_s: float = HOLE_MIN_S,
) -> Holes:
    """Silent runs in ``received``, audio whose every part should be at RMS ``level``."""
    window = max(1, round(window_s * sample_rate))
    count = len(received) // window
    blocks = np.asarray(received[: count * window], dtype=np.float64).reshape(count, window)
    silent = np.sqrt(np.mean(blocks * blocks, axis=1)) < level * 10 ** (-below_db / 20)
    runs, run = [], 0
    for quiet in silent:
        if quiet:
            run += 1
            continue
        if run:
            runs.append(run)
        run = 0
    if run:
        runs.append(run)
    window_ms = 1000 * window / sample_rate
    return Holes(
        lengths_ms=[r * window_ms for r in runs if r * window_ms >= 1000 * min_s - 1e-9],
        silent_ms=float(np.count_nonzero(silent)) * window_ms,
        total_ms=count * window_ms,
    )


# Silence as a listener hears it: a 20 ms frame whose RMS is below this (-60 dBFS).
SILENT_RMS = 1e-3


@dataclass(frozen=True)
class HeardSilence:
    """What a listener heard after a moment (an interrupt): when it fell silent, and how
    much audible audio came after the first silent frame."""

    to_silence_ms: float
    audible_after_ms: float


def silence_after(
    received: np.ndarray, timeline: Timeline, at: float, silent_rms: float = SILENT_RMS
) -> HeardSilence | None:
    """How long after ``at`` (monotonic seconds) ``received`` fell silent.

    ``received`` is what the peer played, ``timeline`` when each frame of it was played.
    Silence starts after the last audible sample of the first silent 20 ms frame's
    predecessor; audio in any later frame counts against it. None when nothing was played
    after ``at`` or it never fell silent.
    """
    if not len(timeline) or len(received) < FRAME_SAMPLES:
        return None
    start = int(np.ceil(timeline.index_at(at) / FRAME_SAMPLES)) * FRAME_SAMPLES
    frames = (len(received) - start) // FRAME_SAMPLES
    if frames <= 0:
        return None
    blocks = received[start : start + frames * FRAME_SAMPLES].reshape(frames, FRAME_SAMPLES)
    rms = np.sqrt(np.mean(np.square(blocks, dtype=np.float64), axis=1))
    quiet = np.flatnonzero(rms < silent_rms)
    if not len(quiet):
        return None
    first_silent = int(quiet[0])
    audible = np.flatnonzero(
        np.abs(received[start : start + first_silent * FRAME_SAMPLES]) > silent_rms
    )
    end = start + (int(audible[-1]) + 1 if len(audible) else 0)
    after = int(np.count_nonzero(rms[first_silent:] >= silent_rms))
    return HeardSilence(
        to_silence_ms=round(1000 * (timeline.time_of(end) - at), 2),
        audible_after_ms=round(after * FRAME_SAMPLES / SAMPLE_RATE * 1000, 2),
    )


def summarize(rtts: Sequence[float]) -> dict[str, float | int | None]:
    """Median and 95th percentile RTT in milliseconds, and how many measurements back them.

    The percentiles are ``None`` when there is nothing to summarise, so a report shows a
    missing measurement as missing rather than as zero.
    """
    values = np.asarray(rtts, dtype=np.float64) * 1000.0
    if values.size == 0:
        return {"rtt_ms_p50": None, "rtt_ms_p95": None, "rtt_samples": 0}
    return {
        "rtt_ms_p50": round(float(np.percentile(values, 50)), 3),
        "rtt_ms_p95": round(float(np.percentile(values, 95)), 3),
        "rtt_samples": int(values.size),
    }
