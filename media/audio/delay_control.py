"""How a playout buffer moves its delay toward the target, slot by slot.

Both playout buffers (the receive path's and the output cushion's) play one frame per slot
from a slot grid, and know two things at each slot: how far the grid runs behind the
earliest expected arrival of the audio about to be played (the *delay*), and how much
delay the arrival statistics want (the *target*). There are two ways to close the gap:

- move the slot grid: the audio is untouched, one frame leaves a little early or late.
  Right for small errors, and the only way when the audio waits *in time* rather than in
  the buffer (packets that come early for their slots leave nothing extra to cut);
- time-scale modification (``media.audio.splice``): accelerate when audio waits in the
  buffer beyond what the target needs (by more than ``TOLERATED_EXCESS_S``: a little spare
  absorbs the next late packet without a splice), expand ahead of time when the target
  has risen.

Moving the grid changes the *rate* at which frames leave for as long as it moves: a grid
moved earlier time and again (to shed the delay that each expansion over a lost packet
leaves) sends more than 50 frames a second, and what follows (a pacer with its own clock,
a listener's buffer, a recording) is left holding the surplus. So the grid only sets its
phase: it strays at most ``MAX_SHIFT_S`` from where it was anchored, in either direction,
and delay that audio in the buffer can pay for is always shed by acceleration.

:class:`DelayControl` decides which, and how much, with no clock of its own.
"""

from __future__ import annotations

from media.audio.splice import MIN_PERIOD, RATE

NUDGE_S = 0.005  # errors up to this move the grid...
NUDGE_MIN_S = 0.001  # ...and below this are left alone
NUDGE_SLOTS = 25  # the grid moves at most once in this many slots...
MAX_NUDGE_S = 0.01  # ...and by at most this much
MAX_SHIFT_S = 0.02  # ...and all its moves add up to at most this, either way
# Delay up to this much above the wanted level is kept, as NetEq keeps its buffer between
# two limits about 20 ms apart: shedding every millisecond held the buffer at the edge of
# lateness, so on a link with 0-30 ms of jitter a packet in every few was late, expanded
# over, and the expansion accelerated away again, a splice pair inside the speech each
# time. Echoed speech through 2 % loss and 0-30 ms of jitter (the relay of bench.netimpair,
# loss2_jitter30, 12 s calls, median of 6 in one run): kept within 5 ms, PESQ-WB 2.07;
# 10 ms, 3.00; 15 ms, 3.52; 20 ms, 3.58; 30 ms, 3.72 (clean link: 4.1). Round trip through
# the same link, 3 calls each: 60-62 ms at 5 ms; 63-64 at 15 ms; 62-75 at 20 ms. 15 ms
# keeps the round trip within 50 ms of the clean link's (15 ms) and most of the gain.
TOLERATED_EXCESS_S = 0.015
MAX_SHED = 720  # samples a slot may accelerate by (15 ms: the stream plays 1.75x)
MAX_GROW = 480  # samples a slot may expand by ahead of time (10 ms: 0.67x)


class DelayControl:
    """Per slot: a time-scale step (samples) and a move of the slot grid (seconds)."""

    def __init__(self) -> None:
        self._since_nudge = NUDGE_SLOTS
        self._shift = 0.0  # the grid's moves since it was anchored, seconds

    def rebase(self) -> None:
        """The grid was anchored anew: its moves count from here."""
        self._shift = 0.0

    def step(self, delay: float, wanted: float, surplus: int) -> tuple[int, float]:
        """``(change, nudge)`` for a slot whose delay is ``delay`` and should be ``wanted``.

        ``surplus`` is how many samples the buffer holds beyond the frame to play (below
        0: not even the frame, which will be expanded). A
        positive ``change`` asks to accelerate by up to that many samples, a negative one to
        expand ahead of time; ``nudge`` is what to add to the grid's anchor (negative:
        start the next slot sooner).
        """
        error = delay - wanted
        self._since_nudge += 1
        if wanted > 0 and NUDGE_MIN_S < error <= TOLERATED_EXCESS_S:
            # On a jittery link (a target above the floor) a little to spare is a late
            # packet absorbed without a splice; on a steady one the excess a one-off stall
            # left is shed at once, at the cost of one splice.
            return 0, 0.0
        if error > NUDGE_MIN_S:
            if error * RATE >= MIN_PERIOD and surplus >= MIN_PERIOD:
                # Audio waits here: play it faster.
                return min(round(error * RATE), surplus, MAX_SHED), 0.0
            return 0, self._nudge(-min(error, MAX_NUDGE_S))  # it waits in time
        if delay < -NUDGE_MIN_S and surplus >= 0:
            # The grid runs ahead of the audio (each slot waits for its frame to arrive):
            # moving the grid back costs nothing, where expanding would make every frame
            # wait for real. (A slot without its frame is another matter: that frame is
            # late, and the slot is expanded.)
            return 0, self._nudge(min(-delay, MAX_NUDGE_S))
        if error < -NUDGE_MIN_S:
            if error < -NUDGE_S:
                return -min(round(-error * RATE), MAX_GROW), 0.0
            return 0, self._nudge(-error)
        return 0, 0.0

    def _nudge(self, seconds: float) -> float:
        if self._since_nudge < NUDGE_SLOTS:
            return 0.0
        allowed = min(max(seconds, -MAX_SHIFT_S - self._shift), MAX_SHIFT_S - self._shift)
        if abs(allowed) < NUDGE_MIN_S:
            return 0.0
        self._since_nudge = 0
        self._shift += allowed
        return allowed
