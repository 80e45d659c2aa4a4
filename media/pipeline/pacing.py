"""The slot schedule that decides when each outgoing 20 ms frame may leave.

aiortc's sender does no pacing: it sends whatever ``recv()`` returns as soon as it returns.
The pacer gives every frame a slot ``anchor + index * 20 ms``. A frame that is ready goes
out at once, but never before its slot starts, so a burst (TTS faster than real time, a
jitter buffer releasing a backlog) still leaves at 50 frames per second. When a slot ends
with nothing ready it is counted as an underrun and filled: with silence, or, with an
:class:`OutputCushion`, by expanding the audio that went before (``media.audio.splice``),
so a late engine hop is a stretch of the sound, not a hole in it.

Phase lock: a frame that is ready before its slot waits, and waiting until the time a frame
normally arrives costs nothing, while a frame later than its slot's end costs an underrun.
So slots start where frames normally become ready: the first frame anchors the schedule,
and whenever every frame of the last second had to wait, the schedule moves earlier by the
shortest wait. Frames then leave the moment they are ready, a frame may be up to a whole
slot late before the slot is filled, and a transform adds no pacing delay on a steady input.

A stalled input (``input_stall``: the receive path before a transform relays a network
stall rather than concealing it) turns the underrun rule off: the pacer waits for the held
audio, sends nothing meanwhile, and then sends the burst on its own unchanged slots (their
timestamps continue, so the listener sees the lateness and its buffer holds it) as fast as
it comes, until a frame is on time again.

An adaptive cushion replaces that phase lock and the backlog drops with the receive
path's playout control: a target delay from when the engine's audio arrives
(``PlayoutDelayEstimator``, fed at every write), the slot grid kept that far behind the
earliest expected arrival (``media.audio.delay_control``), late hops expanded and the
cushion they leave shed by acceleration instead of dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import math
from collections.abc import Callable

import numpy as np

from media.audio.delay_control import DelayControl
from media.audio.frames import FRAME_MS, FRAME_SAMPLES, RTC_RATE
from media.audio.playout_delay import TS_MOD, PlayoutDelayEstimator
from media.audio.ringbuffer import RingBuffer
from media.audio.splice import XFADE, Splicer

FRAME_SECONDS = FRAME_MS / 1000
# Frames per phase check: if all of them waited for their slot, the slots move earlier.
PHASE_WINDOW_FRAMES = 50
# A transform keeps up to this many frames standing behind the one being sent: a jitter
# allowance, so bursty arrival does not cost a drop (a gap in the audio) every window.
STANDING_BACKLOG_ALLOWANCE = 1
# Waits shorter than this are timer noise, not a phase error worth correcting.
PHASE_TOLERANCE_SECONDS = 0.001
DELAY_BUCKET_S = 0.005  # the cushion's target resolution (media.rtc.receive's)
# The most an adaptive cushion holds. What feeds it may be late by a hop, or by a stall of
# this process's event loop (which stalls the pacer alike): a cushion sized for the stalls
# of a loaded loop held 100-260 ms of echo delay for seconds. Later audio is expanded.
CUSHION_CEILING_S = 0.04
# With an adaptive cushion a frame may come this much after its slot's end and still be
# sent for it rather than the slot expanded: what feeds a transform (the receive path)
# hands on each frame as its packet comes, up to a slot late, which the target would
# otherwise cover with a 5 ms cushion held on every frame.
CUSHION_GRACE_SECONDS = 0.005
# An adaptive cushion sheds by acceleration; only audio beyond this is dropped outright.
CUSHION_BACKLOG_SECONDS = 0.3


class InputStall(enum.Enum):
    """What a relaying input says of a network stall (``media.rtc.receive``)."""

    BEGAN = "began"  # nothing to play and nothing to conceal it with: wait, fill nothing
    RELAYED = "relayed"  # its audio came and was handed on at once, on the unchanged slots
    GIVEN_UP = "given_up"  # waited out: its time was concealed and the missed slots skipped


class _Step(enum.Enum):
    """Where :meth:`FramePacer.poll` is in handing out the next frame."""

    NEXT = "next"  # no slot begun: the next poll begins one
    ANCHOR = "anchor"  # no schedule yet: the first frame that is ready anchors it
    WAITING = "waiting"  # the slot has begun: its frame is awaited until the deadline
    EARLY = "early"  # the frame is ready before its slot: it leaves at the slot's start
    IDLE = "idle"  # no audio is due: the slot's silence leaves at its start


class OutputCushion:
    """What a pacer does around late audio: expand it, and (``adaptive``) shed what it left.

    ``expecting`` says whether more audio is due (speech mid-utterance, a transform's
    stream): a slot found empty then is a late hop, filled by expanding the audio before
    it; otherwise the stream has ended and the slot is silence. ``adaptive``: keep a
    cushion sized from when the audio arrives, and shed what late hops leave beyond it by
    acceleration; without it the cushion itself never drops or sheds audio (the pacer's
    backlog bound still may: transforms use it that way).
    """

    def __init__(
        self, *, adaptive: bool = True, expecting: Callable[[], bool] | None = None
    ) -> None:
        self.adaptive = adaptive
        self._expecting = expecting or (lambda: True)
        self._splicer = Splicer()
        self._estimator = self._new_estimator()
        self._control = DelayControl()
        self._written = 0
        self._paused = False
        self.late_slots = 0  # slots found empty while audio was expected (a late hop)
        self.expanded = 0  # of them, filled by expansion
        self.expanded_samples = 0
        self.shed_samples = 0  # cut by acceleration (or left out where a merge met in phase)
        self.grown_samples = 0  # repeated by expansion ahead of time
        self.delay = 0.0  # seconds behind the earliest expected arrival, at the last slot
        self.last_expanded = False  # the last frame was (mostly) expansion

    @property
    def target(self) -> float:
        return self._estimator.target

    @staticmethod
    def _new_estimator() -> PlayoutDelayEstimator:
        # The cushion absorbs the engine's and the loop's hiccups, not a radio's: recurring
        # peaks there are load, which holding more delay would not cure.
        return PlayoutDelayEstimator(
            bucket=DELAY_BUCKET_S, ceiling=CUSHION_CEILING_S, peak_mode=False
        )

    def wrote(self, written: int, now: float, *, timed: bool = True) -> None:
        """The source's written position moved to ``written`` at ``now``; ``timed``: the
        write's time says something about the engine (not so for a relayed burst)."""
        if self.adaptive and timed and written > self._written:
            if self._paused:  # audio again after it stopped: a new stream, a new timing
                self._estimator = self._new_estimator()
                self._paused = False
            self._estimator.add(self._written % TS_MOD, now)
        self._written = written

    def reset(self) -> None:
        """Forget the audio played (after an interrupt: nothing of it may be expanded)."""
        self._splicer.reset()

    def anchored(self) -> None:
        """The pacer's slot grid was anchored anew."""
        self._control.rebase()

    def expects(self) -> bool:
        """More audio is due (a slot found empty now is a late hop, not the end)."""
        return self._expecting()

    def fill(self, source: RingBuffer, samples: int) -> np.ndarray | None:
        """A slot ended with less than a frame: what is there, then expansion; None for
        silence (the stream has ended, or what came before was silence anyway)."""
        self.last_expanded = False
        if not self._expecting():
            self._splicer.reset()
            return None
        self.late_slots += 1
        ahead = source.peek(source.available)
        frame, used = self._splicer.play(ahead, samples)
        source.discard(used)
        if not np.any(frame):
            # Nothing is left to expand (the stream paused long enough to fade out): when
            # audio comes back it is a new start, not audio that was late all this while.
            self._paused = True
            return None
        self._count()
        self.expanded += 1
        self.last_expanded = self._splicer.expanded > samples // 2
        return frame

    def take(
        self, source: RingBuffer, samples: int, slot_start: float, *, steady: bool = False
    ) -> tuple[np.ndarray, float]:
        """The slot's frame from ``source`` (which holds at least one), and a grid move;
        ``steady``: no time-scale step (a relayed burst, played on the unchanged grid)."""
        self.last_expanded = False
        change, nudge = 0, 0.0
        if self.adaptive and not steady:
            expected = self._estimator.expected_arrival(source.consumed % TS_MOD)
            if expected is not None and not self._splicer.expanding:
                self.delay = slot_start - expected
                free = samples / RTC_RATE + CUSHION_GRACE_SECONDS  # lateness sent as it is
                wanted = max(0.0, self._estimator.target - free)
                change, nudge = self._control.step(self.delay, wanted, source.available - samples)
        if source.available < samples:  # the end of a stream: no time to change
            return self._stream_tail(source, samples), 0.0
        if change or self._splicer.expanding:
            ahead = source.peek(samples + max(change, 0) + 2 * XFADE)
            frame, used = self._splicer.play(ahead, samples, change)
            source.discard(used)
            self._count()
        else:
            frame = source.read(samples)
            self._splicer.played(frame)
        return frame, nudge

    def _stream_tail(self, source: RingBuffer, samples: int) -> np.ndarray:
        """The last partial frame of a stream, as it is, then silence (nothing follows
        it to splice with). Expansion plays whatever number of samples bridges a late hop,
        so a stream's end falls anywhere in a frame."""
        tail = source.read(source.available)
        self._splicer.reset()
        return np.concatenate([tail, np.zeros(samples - len(tail), np.float32)])

    def _count(self) -> None:
        splicer = self._splicer
        self.expanded_samples += splicer.expanded
        self.shed_samples += splicer.accelerated + splicer.skipped
        self.grown_samples += splicer.preemptive


class FramePacer:
    """Hands out one frame of samples per slot from a ring buffer fed by the engine worker.

    ``max_backlog`` bounds the audio waiting in the buffer at the moment a frame is taken:
    beyond it the oldest audio is dropped (counted), so latency cannot grow without bound.
    ``None`` keeps everything (speech synthesised ahead of time must all be played).
    """

    def __init__(
        self,
        source: RingBuffer,
        *,
        frame_samples: int = FRAME_SAMPLES,
        frame_seconds: float = FRAME_SECONDS,
        max_backlog: int | None = None,
        clock: Callable[[], float] | None = None,
        cushion: OutputCushion | None = None,
    ) -> None:
        self._source = source
        self.cushion = cushion
        self._hold: tuple[int, int] | None = None
        self._ended_at = -1  # the written position where a stream last ended
        self._idle = False  # the last slot was silence with no audio due
        self._frame_samples = frame_samples
        self._frame_seconds = frame_seconds
        self._max_backlog = max_backlog
        self._clock = clock or asyncio.get_running_loop().time
        self._ready = asyncio.Event()
        self._silence = np.zeros(frame_samples, dtype=np.float32)
        self._anchor: float | None = None
        self.index = -1  # slot of the frame handed out last
        self.frames = 0
        self.underruns = 0
        self.skipped_slots = 0
        self.backlog_dropped = 0  # samples
        # The last audio frame's times: found ready for its slot, and taken from the buffer
        # once the slot had started (between them: the wait for the slot).
        self.ready_at = 0.0
        self.taken_at = 0.0
        self._window_frames = 0
        self._window_min_wait = float("inf")
        self._window_min_left = 1 << 62
        self.phase_corrections = 0
        # A relayed input stall: waited out, then its burst sent on the unchanged slots.
        self._input_stalled = False
        self._catching_up = False
        self._resumed_at = -math.inf  # when the input said its stall was over
        self._given_up = False  # ...that it gave the stall up: skip to the current slot
        self.relayed_stalls = 0
        # Where poll() is: the step, and the slot it is on (start, deadline, and how long
        # to wait for its frame: past the deadline while the input catches up).
        self._step = _Step.NEXT
        self._due = -math.inf
        self._queued = False
        self._slot_start = self._deadline = self._wait_until = 0.0
        # Told whenever poll() may have something new to hand out (audio was written, the
        # input's stall changed): a sender that polls many pacers wakes only these.
        self.on_ready: Callable[[], None] | None = None

    def notify(self) -> None:
        """Called after audio was written to the source, to wake a waiting ``next_frame``."""
        if self.cushion is not None:
            self.cushion.wrote(self._source.written, self._clock(), timed=not self._catching_up)
        self._wake()

    def _wake(self) -> None:
        self._ready.set()
        if self.on_ready is not None:
            self.on_ready()

    def input_stall(self, edge: InputStall) -> None:
        """The input stalled (wait for its audio, fill nothing), or the stall is over: its
        burst follows on the same slots (``RELAYED``), or nothing does (``GIVEN_UP``: the
        slots that passed are skipped, as after any late call)."""
        if edge is InputStall.BEGAN:
            if not self._input_stalled:
                self.relayed_stalls += 1
            self._catching_up = True
        elif edge is InputStall.RELAYED:
            self._resumed_at = self._clock()
        else:
            self._catching_up = False
            self._given_up = self._input_stalled
        self._input_stalled = edge is InputStall.BEGAN
        self._wake()

    def restart(self) -> None:
        """Forget the schedule: the next frame that becomes ready anchors a new one."""
        self._anchor = None
        self._step = _Step.NEXT
        self._due = -math.inf

    @property
    def pts(self) -> int:
        """Timestamp of the last frame, in samples: slots, not frames, so gaps stay gaps."""
        return self.index * self._frame_samples

    def hold(self, at: int, until: int) -> None:
        """Play nothing from stream position ``at`` on until ``until`` has been written.

        A speak session's pre-buffer: the audio before ``at`` plays on; the next
        utterance starts once enough of it is ready (or :meth:`release` says so).
        """
        self._hold = (at, until)
        self._wake()

    def release(self) -> None:
        """Lift a :meth:`hold`."""
        if self._hold is not None:
            self._hold = None
            self._wake()

    def end_stream(self) -> None:
        """What is written so far ends a stream: send it, even the last partial frame.

        Otherwise only whole frames go out, and a stream's last samples would wait for
        audio that never comes (whoever waits for its end, e.g. ``speech_finished``, too).
        """
        self._ended_at = self._source.written
        self._wake()

    @property
    def holding(self) -> bool:
        return self._hold is not None

    @property
    def held_at(self) -> int:
        """The stream position a :meth:`hold` waits at (the written position if none)."""
        return self._hold[0] if self._hold is not None else self._source.written

    def _has_frame(self) -> bool:
        available = self._source.available
        if self._hold is not None:
            at, until = self._hold
            if self._source.written >= until:
                self._hold = None
            else:
                available = min(available, at - self._source.consumed)
        if available >= self._frame_samples:
            return True
        return available > 0 and self._ended_at == self._source.written

    @property
    def due(self) -> float:
        """When :meth:`poll` next has something to do if nothing is written before then
        (``inf``: only a write, or the input's stall ending, moves it on)."""
        return self._due

    def poll(self) -> tuple[np.ndarray, bool] | None:
        """The next slot's samples and whether they are filler silence, once it is time
        for them; None before (poll again at :attr:`due`, or after :meth:`notify`).

        One step of the schedule, never a wait: whoever sends the frames (one media tick
        for every session of a worker, or :meth:`next_frame`) decides how to wait.
        """
        now = self._clock()
        if self._step is _Step.NEXT:
            self._begin_slot()
        if self._step is _Step.ANCHOR:
            if not self._has_frame():
                self._due = math.inf
                return None
            self._anchor_at(now)
        if self._step is _Step.IDLE:
            return self._idle_slot(now)
        if self._step is _Step.WAITING:
            ready = self._has_frame()
            if not ready:
                if self._input_stalled:
                    self._due = math.inf
                    return None
                if self._catching_up:  # what the input released may still be in the engine
                    resumed = self._resumed_at + self._frame_seconds + self._grace
                    self._wait_until = max(self._wait_until, resumed)
                if now < self._wait_until:
                    self._due = self._wait_until
                    return None
            if self._given_up:
                # The input gave a stall up: the slots it waited through are gone, and what
                # it hands on now is for the current one (sent on an old slot, it would look
                # late by the whole wait, and the listener's buffer would learn that as a
                # peak).
                self._given_up = False
                self._open_slot(self._skip_missed_slots())
                return self.poll()
            if not ready:
                return self._underrun()
            self.ready_at = now
            self._step = _Step.EARLY
        if now < self._slot_start:
            self._due = self._slot_start
            return None
        return self._take()

    async def next_frame(self) -> tuple[np.ndarray, bool]:
        """Wait for the next slot; return its samples and whether they are filler silence."""
        while (frame := self.poll()) is None:
            self._ready.clear()
            remaining = self._due - self._clock()
            if remaining == math.inf:
                await self._ready.wait()
            elif remaining > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await self._ready.wait()
        return frame

    def _begin_slot(self) -> None:
        # A frame already queued when asked for waits behind a backlog, not for its audio:
        # that wait says nothing about phase, and counting it would move the slots a slot
        # earlier every window (one frame a window faster than real time).
        self._queued = self._has_frame()
        self.frames += 1
        if self._anchor is None:
            self._step = _Step.ANCHOR
            return
        self.index += 1
        if not self._catching_up:
            self._skip_missed_slots()
        self._open_slot(self._anchor + self.index * self._frame_seconds)

    def _anchor_at(self, now: float) -> None:
        first_index = self.index + 1
        self._anchor = now - first_index * self._frame_seconds
        self.index = first_index
        if self.cushion is not None:
            self.cushion.anchored()
        self._open_slot(now)

    def _open_slot(self, slot_start: float) -> None:
        cushion = self.cushion
        self._step = _Step.WAITING
        if cushion is not None and not cushion.adaptive:
            now = self._clock()
            if self._idle and self._has_frame() and now < slot_start:
                # Audio again after idle silence: it starts a new grid and leaves at once.
                assert self._anchor is not None
                self._anchor -= slot_start - now
                slot_start = now
            self._idle = False
            if not self._has_frame() and not cushion.expects():
                self._step = _Step.IDLE
        self._slot_start = slot_start
        self._wait_until = self._deadline = slot_start + self._frame_seconds + self._grace

    def _underrun(self) -> tuple[np.ndarray, bool]:
        self._handed_out()
        self._catching_up = False
        self.underruns += 1
        cushion = self.cushion
        filled = cushion.fill(self._source, self._frame_samples) if cushion else None
        if filled is None:
            return self._silence, True
        return filled, False

    def _take(self) -> tuple[np.ndarray, bool]:
        self._handed_out()
        early = self._slot_start - self.ready_at
        relayed = self._catching_up
        if relayed and self.ready_at <= self._deadline and not self._input_stalled:
            self._catching_up = False  # this frame is on time: the burst is sent
        if not relayed:
            self._trim_backlog()
        cushion = self.cushion
        if cushion is None:
            frame = self._source.read(self._frame_samples)
        else:
            frame, nudge = cushion.take(
                self._source, self._frame_samples, self._slot_start, steady=relayed
            )
            assert self._anchor is not None
            self._anchor += nudge
        self.taken_at = self._clock()
        if cushion is None or not cushion.adaptive:
            self._track_phase(0.0 if self._queued else early, left=self._source.available)
        if len(frame) < self._frame_samples:  # a read cut short (e.g. an interrupt's fade)
            frame = np.concatenate([frame, self._silence[len(frame) :]])
        return frame, False

    def _handed_out(self) -> None:
        """A frame leaves: the next poll begins the next slot, at once."""
        self._step = _Step.NEXT
        self._due = -math.inf

    def _skip_missed_slots(self) -> float:
        """Slots that passed while nobody asked: their time is gone, not their audio (a
        transform's backlog bound still caps what that leaves queued). Returns the start
        of the slot to play."""
        assert self._anchor is not None
        current = math.floor((self._clock() - self._anchor) / self._frame_seconds)
        if current > self.index:
            self.skipped_slots += current - self.index
            self.index = current
        return self._anchor + self.index * self._frame_seconds

    @property
    def _grace(self) -> float:
        """How long after its slot's end a frame may come and still be sent for it."""
        adaptive = self.cushion is not None and self.cushion.adaptive
        return CUSHION_GRACE_SECONDS if adaptive else 0.0

    def _idle_slot(self, now: float) -> tuple[np.ndarray, bool] | None:
        """No audio is due (between utterances): the slot's silence goes at its start.

        Waiting to its end, as for a late hop, would send the first silent frame after an
        utterance 40 ms after the last audio and every later one 20 ms late: a listener's
        jitter buffer takes that for a slower network and adds delay to the next words.
        """
        if now < self._slot_start:
            self._due = self._slot_start
            return None
        self._handed_out()
        if self._has_frame():  # audio came while waiting for the slot: it has the slot
            self.ready_at = now
            self._trim_backlog()
            assert self.cushion is not None
            frame, _ = self.cushion.take(self._source, self._frame_samples, self._slot_start)
            self.taken_at = self._clock()
            return frame, False
        self.underruns += 1
        self._idle = True
        return self._silence, True

    def _track_phase(self, wait: float, left: int) -> None:
        """Once a window, remove latency the stream did not need in that window.

        If every frame had to wait for its slot, the slots move earlier by the shortest
        wait. With a backlog bound (transforms), audio that stayed queued behind every frame
        of the window (a burst after a stall leaves such a standing backlog) is dropped,
        beyond a one-frame jitter allowance.
        """
        self._window_min_wait = min(self._window_min_wait, wait)
        self._window_min_left = min(self._window_min_left, left)
        self._window_frames += 1
        if self._window_frames < PHASE_WINDOW_FRAMES:
            return
        if self._window_min_wait > PHASE_TOLERANCE_SECONDS and self._anchor is not None:
            self._anchor -= self._window_min_wait
            self.phase_corrections += 1
        standing = self._window_min_left - STANDING_BACKLOG_ALLOWANCE * self._frame_samples
        if self._max_backlog is not None and standing > 0:
            self.backlog_dropped += self._source.discard(standing)
        self._window_frames = 0
        self._window_min_wait = float("inf")
        self._window_min_left = 1 << 62

    def _trim_backlog(self) -> None:
        if self._max_backlog is None:
            return
        bound = max(self._max_backlog, self._frame_samples)
        if self.cushion is not None and self.cushion.adaptive:
            bound = max(bound, round(CUSHION_BACKLOG_SECONDS * RTC_RATE))
        excess = self._source.available - bound
        if excess > 0:
            self.backlog_dropped += self._source.discard(excess)
