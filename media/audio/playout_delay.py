"""The target playout delay of one incoming stream, from when its packets arrive.

A playout buffer must hold enough audio to cover the network's lateness, and no more, since
every millisecond it holds is a millisecond of mouth-to-ear delay. libwebrtc's NetEq finds
that amount from the packets themselves; this is the same design, with its time passed in
(no clock inside, so a trace gives the same answer every time):

- Each packet's *relative delay*: how much later it arrived than the earliest expectation,
  the packet of the last ``WINDOW_S`` that arrived soonest relative to its media time
  (``arrival - timestamp / clock_rate`` is smallest for it). Only differences of that
  quantity matter, so the sender's and the receiver's clocks never need to agree.
- A histogram of relative delays in ``BUCKET_S`` buckets up to ``HISTOGRAM_S`` with a
  per-packet forgetting factor, so it describes the recent link; the target is the delay
  below which ``quantile`` of that mass lies (the bucket's upper edge, so it covers them).
- Fast attack: a packet later than the target raises the target to cover its own delay at
  once, with the packet that showed it. A Wi-Fi stall that holds packets for 200 ms and then
  releases them together would otherwise underrun the buffer many times before the
  histogram noticed. Slow decay: that peak halves every ``peak_half_life`` seconds, and the
  spike's weight in the histogram fades packet by packet, so some 2 to 3 s of calm bring
  the target back to the calm level instead of snapping back before the next stall.
- Delay peaks that recur: a link that stalls every few seconds (a radio scanning or
  retraining) would otherwise pay for every stall twice, a hole while the buffer runs dry
  and then seconds of shedding the delay it grew, only for the next stall to find the
  buffer back at the calm level. As NetEq's ``DelayPeakDetector``: a packet whose delay
  stands ``PEAK_MARGIN_S`` above the calm target (and twice as high) is a *peak*; the
  packets of one stall, released together, are one peak (those within ``PEAK_MERGE_S`` of
  the last). Once ``PEAKS_TO_TRIGGER`` peaks have come, each within ``MAX_PEAK_PERIOD_S``
  of the one before, the target stays at least as high as the highest of them, for as long
  as the next peak is no later than twice the longest period seen; then it decays as any
  spike does. A lone spike changes nothing: the peak mode begins at the second one.
- A floor (one frame: less cannot be played) and a ceiling (beyond it, waiting costs more
  than the late audio is worth).

Every packet of every call passes through here (twice on a transform's round trip: the
receive path and the output cushion), so a packet costs O(1): the forgetting multiplies a
running scale instead of every bucket, and the quantile walks from where it last was
instead of summing the histogram (it moves a bucket or two per packet). Redone with a
numpy pass over the histogram per packet, this was 10.6 us a packet, 5 % of an echo
session's server CPU.

Timestamps are RTP timestamps (32 bits, wrapping), unwrapped around the newest one seen, so
a reordered packet has an earlier media time and counts with its full lateness; lost
packets simply never count. Sequence numbers are not needed: the timestamp carries the
media time, and a 16-bit sequence wrap cannot reach the estimate. A packet more than
``HISTOGRAM_S`` late is no lateness a buffer could cover but a discontinuity (a sender
restart, a timestamp jump, an outage of seconds): it only resets the earliest expectation.
"""

from __future__ import annotations

import itertools
from collections import deque

CLOCK_RATE = 48_000
TS_MOD = 1 << 32
BUCKET_S = 0.01
HISTOGRAM_S = 1.0  # a packet later than this is a discontinuity, not a lateness to cover
WINDOW_S = 2.0  # how far back the earliest expectation is looked for (as NetEq)
QUANTILE = 0.95
FORGET_FACTOR = 0.983  # NetEq's, per packet: a memory of about 60 packets (1.2 s at 20 ms)
FLOOR_S = 0.02  # one 20 ms frame
CEILING_S = 0.5
PEAK_HALF_LIFE_S = 0.5
PEAK_MARGIN_S = 0.04  # a peak stands this far above the calm target...
PEAK_MERGE_S = 0.3  # ...and a late packet this soon after the last peak's is the same peak
PEAKS_TO_TRIGGER = 2
MAX_PEAK_PERIOD_S = 10.0  # peaks further apart than this are not a pattern (NetEq's)
MAX_PEAKS = 8  # the heights and periods remembered
# The running scale is folded back into the weights before it underflows (a packet's weight
# is divided by it): 0.983 ** 40000, some 13 minutes of 20 ms packets.
RESCALE_BELOW = 1e-300


class PlayoutDelayEstimator:
    """Relative delays of one stream's packets in, the target playout delay (seconds) out.

    ``quantile``: the share of recent packets the target must cover. ``forget_factor``: the
    weight the histogram keeps at each packet (the new packet gets the rest; while fewer
    than ``1 / (1 - forget_factor)`` packets have come, all weigh the same). ``floor`` and
    ``ceiling`` bound the target. ``peak_half_life``: how fast a spike's fast-attack peak
    decays, in seconds of arrival time. ``bucket``: the histogram's resolution; the target
    is a bucket's upper edge, so it may exceed what the packets need by up to one bucket
    (a playout buffer that pays that on every leg of a call may want finer buckets).
    ``peak_mode``: hold the target over delay peaks that recur (see the module's notes).
    """

    def __init__(
        self,
        *,
        clock_rate: int = CLOCK_RATE,
        quantile: float = QUANTILE,
        forget_factor: float = FORGET_FACTOR,
        floor: float = FLOOR_S,
        ceiling: float = CEILING_S,
        peak_half_life: float = PEAK_HALF_LIFE_S,
        bucket: float = BUCKET_S,
        peak_mode: bool = True,
    ) -> None:
        if clock_rate <= 0 or peak_half_life <= 0 or bucket <= 0:
            raise ValueError("clock_rate, peak_half_life and bucket must be positive")
        if not 0 < quantile < 1 or not 0 < forget_factor < 1:
            raise ValueError("quantile and forget_factor must lie strictly between 0 and 1")
        if not 0 <= floor <= ceiling:
            raise ValueError("need 0 <= floor <= ceiling")
        self._clock_rate = clock_rate
        self._quantile = quantile
        self._forget = forget_factor
        self._floor = floor
        self._ceiling = ceiling
        self._half_life = peak_half_life
        self._bucket = bucket
        # The histogram is ``_weights`` times ``_scale`` (forgetting scales every bucket
        # alike); its mass is 1 once the first packet is in. ``_index`` is the quantile's
        # bucket as of the last packet, ``_below`` the weight of the buckets under it.
        self._weights = [0.0] * max(1, round(HISTOGRAM_S / bucket))
        self._scale = 1.0
        self._index = 0
        self._below = 0.0
        self._packets = 0
        self._newest: int | None = None  # the newest RTP timestamp seen, as sent...
        self._newest_unwrapped = 0  # ...and unwrapped
        # (arrival, transit) of the packets that can still be the fastest of the window:
        # transits increase from front to back, so the front is the earliest expectation.
        self._fastest: deque[tuple[float, float]] = deque()
        self._peak = 0.0  # the fast-attack level, as set...
        self._peak_at = 0.0  # ...at this arrival time
        self._peaks = DelayPeaks() if peak_mode else None
        self._calm = floor  # the histogram's quantile as of the last packet
        self._last_arrival = 0.0
        self.target = floor  # seconds, as of the last packet

    def add(self, timestamp: int, arrival: float) -> float:
        """Count one packet (RTP timestamp, arrival in seconds); return the new target."""
        transit = arrival - self._unwrap(timestamp) / self._clock_rate
        bucket = min(
            int(self._relative_delay(arrival, transit) / self._bucket), len(self._weights) - 1
        )
        self._count(bucket)
        covered = (bucket + 1) * self._bucket
        # A peak at or below the floor never raises the target (nor does what it decays
        # to): on a calm link, where every packet is within the floor, none is kept.
        peak = self._peak
        if peak > self._floor and arrival > self._peak_at:
            peak *= 0.5 ** ((arrival - self._peak_at) / self._half_life)
        if covered > peak and covered > self._floor:  # fast attack
            self._peak, self._peak_at, peak = covered, arrival, covered
        if self._peaks is not None:
            calm = self._calm
            if covered >= calm + PEAK_MARGIN_S and covered >= 2 * calm:
                self._peaks.peak(arrival, covered)
            held = self._peaks.hold(arrival)
            if held > peak:
                peak = held
        self._calm = self._quantile_delay()
        self._last_arrival = arrival
        self.target = min(self._ceiling, max(self._floor, self._calm, peak))
        return self.target

    @property
    def peak_mode(self) -> bool:
        """Whether recurring peaks hold the target now."""
        return self._peaks is not None and self._peaks.hold(self._last_arrival) > 0.0

    def expected_arrival(self, timestamp: int) -> float | None:
        """When the earliest expectation says a packet with this RTP timestamp arrives.

        The arrival it would have with the smallest transit of the window (the packets that
        came soonest): what a playout buffer measures its own delay against. ``None`` before
        the first packet. Nothing is counted or remembered.
        """
        if self._newest is None or not self._fastest:
            return None
        step = (timestamp - self._newest + TS_MOD // 2) % TS_MOD - TS_MOD // 2
        return (self._newest_unwrapped + step) / self._clock_rate + self._fastest[0][1]

    def _unwrap(self, timestamp: int) -> int:
        if self._newest is None:
            self._newest = timestamp % TS_MOD
            self._newest_unwrapped = self._newest
            return self._newest
        step = (timestamp - self._newest + TS_MOD // 2) % TS_MOD - TS_MOD // 2
        unwrapped = self._newest_unwrapped + step
        if step > 0:
            self._newest, self._newest_unwrapped = timestamp % TS_MOD, unwrapped
        return unwrapped

    def _relative_delay(self, arrival: float, transit: float) -> float:
        """How much later than the earliest expectation of the window this packet came."""
        fastest = self._fastest
        while fastest and fastest[-1][1] >= transit:
            fastest.pop()
        fastest.append((arrival, transit))
        while fastest[0][0] < arrival - WINDOW_S:
            fastest.popleft()
        delay = transit - fastest[0][1]
        if delay > HISTOGRAM_S:  # a new timing, nothing learnt about the link
            fastest.clear()
            fastest.append((arrival, transit))
            return 0.0
        return delay

    def _count(self, bucket: int) -> None:
        self._packets += 1
        keep = min(self._forget, 1 - 1 / self._packets)
        if keep > 0.0:  # not the first packet (that one has all the mass)
            self._scale *= keep
            if self._scale < RESCALE_BELOW:
                self._rescale()
        added = (1 - keep) / self._scale
        self._weights[bucket] += added
        if bucket < self._index:
            self._below += added

    def _rescale(self) -> None:
        scale = self._scale
        self._weights = [weight * scale for weight in self._weights]
        self._below = sum(self._weights[: self._index])
        self._scale = 1.0

    def _quantile_delay(self) -> float:
        """The upper edge of the first bucket where the histogram's mass reaches the
        quantile (the mass is 1, so the quantile is the share of recent packets)."""
        weights = self._weights
        wanted = self._quantile / self._scale
        index, below = self._index, self._below
        while index > 0 and below >= wanted:  # the quantile lies lower
            index -= 1
            below -= weights[index]
        last = len(weights) - 1
        while index < last and below + weights[index] < wanted:  # ...or higher
            below += weights[index]
            index += 1
        self._index, self._below = index, below
        return (index + 1) * self._bucket


class DelayPeaks:
    """The delay peaks of the recent past, and whether they recur (times in seconds).

    What ``hold`` needs (the highest peak, the longest period) is kept up to date as peaks
    come, so the per-packet question costs two comparisons.
    """

    def __init__(self) -> None:
        self._peaks: deque[tuple[float, float]] = deque(maxlen=MAX_PEAKS)  # (start, height)
        self._last_at = -1e9  # the last peak packet's arrival
        self._highest = 0.0
        self._longest = 0.0  # the longest period between the remembered peaks' starts

    def peak(self, arrival: float, height: float) -> None:
        """A packet ``height`` late (seconds) that stands out of the calm came at ``arrival``."""
        peaks = self._peaks
        if peaks and arrival - self._last_at <= PEAK_MERGE_S:  # the same stall's release
            start, highest = peaks[-1]
            peaks[-1] = (start, max(highest, height))
        else:
            if peaks and arrival - peaks[-1][0] > MAX_PEAK_PERIOD_S:
                peaks.clear()
            peaks.append((arrival, height))
        self._last_at = arrival
        self._highest = max(height for _, height in peaks)
        self._longest = max(
            (later[0] - earlier[0] for earlier, later in itertools.pairwise(peaks)), default=0.0
        )

    def hold(self, now: float) -> float:
        """The delay the recurring peaks ask the target to cover at ``now`` (0: none)."""
        if len(self._peaks) < PEAKS_TO_TRIGGER or now - self._peaks[-1][0] > 2 * self._longest:
            return 0.0
        return self._highest
