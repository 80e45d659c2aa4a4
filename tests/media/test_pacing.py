"""The slot schedule of outgoing frames, measured on the real event loop clock.

Every frame has a slot ``anchor + index * 20 ms``. The anchor is taken while the first frame
is handed out, so it is no earlier than that call and no earlier than that frame's write:
the later of the two stands in for it (a few microseconds early, which only makes the
checks below more lenient, never wrong). Two kinds of checks follow:

* exact ones that load cannot break: a frame never leaves before its slot starts, silence
  never before its slot ends, ``pts`` counts slots, no written frame is lost or reordered;
* statistical ones with wide margins: about 20 ms per slot over a sequence, at most one
  near-zero "burst" gap, median delays.

A late event loop only ever makes frames later, so the exact checks hold on a busy machine,
while a pacer that lets frames out early (a burst) fails them by whole slots. Intervals are
noisier: one frame held up by the scheduler leaves a short gap to the next one, and a frame
that arrives late in its slot legitimately goes out just before the next slot starts. A
shared machine can also freeze the whole process for tens of milliseconds; a heartbeat on
the loop notices, and such a run is repeated (see ``on_a_quiet_loop``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pytest

from media.audio.frames import FRAME_SAMPLES, RTC_RATE
from media.audio.ringbuffer import RingBuffer
from media.pipeline import pacing
from media.pipeline.pacing import FRAME_SECONDS, FramePacer, InputStall, OutputCushion

T = TypeVar("T")

FRAME = FRAME_SAMPLES
SLOT = FRAME_SECONDS
# How much earlier than its slot start a frame may be seen: rounding only.
SLOT_TOLERANCE = 0.0005
# Consecutive frames closer than this are a burst; a correct pacer shows at most one such
# gap in a sequence, after a frame that the scheduler or a late write held up.
BURST_GAP = 0.005
# A loop timer this late means the machine froze the process: the run is repeated. Shorter
# stalls cannot break the checks: a frame gap under BURST_GAP takes a 15 ms stall, and a
# skipped slot a 20 ms one.
STALL = 0.015
TRIES = 5
# A guard so that a pacer that never returns fails quickly instead of hanging the run.
CALL_LIMIT = 1.0


@dataclass
class Taken:
    """One frame as the consumer saw it."""

    called: float  # when ``next_frame`` was called
    time: float  # when it returned
    pts: int
    silence: bool
    value: float  # the producer's frame number carried in the samples; nan for silence
    skipped_slots: int  # the pacer's count right after this frame
    available: int  # samples left in the buffer right after this frame


class Producer:
    """Writes numbered frames (every sample of frame ``k`` is ``k``) and notifies the pacer."""

    def __init__(self, buffer: RingBuffer, pacer: FramePacer) -> None:
        self.buffer = buffer
        self.pacer = pacer
        self.loop = asyncio.get_running_loop()
        self.written: dict[int, float] = {}  # frame number -> time it was written
        self._next = 0

    def write(self, frames: int = 1) -> None:
        for _ in range(frames):
            self.buffer.write(np.full(FRAME, self._next, dtype=np.float32))
            self.written[self._next] = self.loop.time()
            self._next += 1
        self.pacer.notify()

    async def steady(self, slots: int, *, hole: range = range(0), frames_per_slot: int = 1) -> None:
        """One write per slot on an absolute schedule (no drift), nothing in ``hole``.

        The first write happens at once and the schedule counts from the moment it was
        made, so the consumer anchors on a write that neither a timer nor the scheduler
        made late.
        """
        start = self.loop.time()
        for k in range(slots):
            if k:
                await sleep_until(start + k * SLOT)
            if k not in hole:
                self.write(frames_per_slot)
            if not k:
                start = self.loop.time()


async def sleep_until(when: float) -> None:
    """Sleep to an absolute loop time.

    ``asyncio.sleep(when - now)`` would aim a little later than ``when`` by the time it
    takes to make the call, which a busy machine can stretch to milliseconds.
    """
    loop = asyncio.get_running_loop()
    woken = loop.create_future()

    def wake() -> None:
        if not woken.done():
            woken.set_result(None)

    handle = loop.call_at(when, wake)
    try:
        await woken
    finally:
        handle.cancel()


@asynccontextmanager
async def background(coro: Coroutine[Any, Any, None]) -> AsyncIterator[None]:
    """Run ``coro`` alongside the block; stop it after, and surface any error it raised."""
    runner = asyncio.ensure_future(coro)
    try:
        yield
    finally:
        if runner.done():
            runner.result()
        else:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner


async def take(pacer: FramePacer, buffer: RingBuffer) -> Taken:
    called = asyncio.get_running_loop().time()
    async with asyncio.timeout(CALL_LIMIT):
        samples, silence = await pacer.next_frame()
    now = asyncio.get_running_loop().time()
    assert len(samples) == FRAME
    if silence:
        assert not samples.any()
    else:
        assert np.all(samples == samples[0]), "a frame mixes two written frames"
    return Taken(
        called=called,
        time=now,
        pts=pacer.pts,
        silence=silence,
        value=float("nan") if silence else float(samples[0]),
        skipped_slots=pacer.skipped_slots,
        available=buffer.available,
    )


async def take_n(pacer: FramePacer, buffer: RingBuffer, n: int) -> list[Taken]:
    return [await take(pacer, buffer) for _ in range(n)]


async def take_until_played(
    pacer: FramePacer, buffer: RingBuffer, frames: int, limit: int = 100
) -> list[Taken]:
    """Take frames (silence included) until ``frames`` written frames have come out."""
    taken: list[Taken] = []
    while len(values(taken)) < frames:
        assert len(taken) < limit, "the written audio never came out"
        taken.append(await take(pacer, buffer))
    return taken


def intervals(taken: list[Taken]) -> np.ndarray:
    return np.diff([t.time for t in taken])


def values(taken: list[Taken]) -> list[float]:
    return [t.value for t in taken if not t.silence]


def lateness(taken: list[Taken], producer: Producer) -> np.ndarray:
    """Seconds each frame left after the earliest moment it was allowed to.

    That moment is its slot's start for audio and its slot's end for silence (a slot is
    only known to be empty once it is over). ``taken`` must start with the frame that
    anchored the schedule.
    """
    first = taken[0]
    anchor = max(first.called, producer.written[int(first.value)])
    slot_starts = anchor + np.array([(t.pts - first.pts) / FRAME * SLOT for t in taken])
    earliest = slot_starts + np.array([SLOT if t.silence else 0.0 for t in taken])
    return np.array([t.time for t in taken]) - earliest


def assert_never_before_its_slot(taken: list[Taken], producer: Producer) -> None:
    """Audio never leaves before its slot starts; silence never before its slot ends."""
    late = lateness(taken, producer)
    early = [(i, round(-1000 * x, 1)) for i, x in enumerate(late) if x < -SLOT_TOLERANCE]
    assert not early, f"(frame, ms early): {early}"


def assert_slot_pace(taken: list[Taken], tolerance: float = 0.002) -> None:
    """Frames leave one slot apart on average, and never in a burst.

    The average is the span over the slots it covers: one frame held up by the scheduler
    moves it by its lateness over the count, where it would spoil two intervals of a median.
    """
    slots = (taken[-1].pts - taken[0].pts) / FRAME
    per_slot = (taken[-1].time - taken[0].time) / slots
    assert abs(per_slot - SLOT) <= tolerance, f"{1000 * per_slot:.1f} ms per slot"
    gaps = intervals(taken)
    short = np.flatnonzero(gaps < BURST_GAP)
    assert len(short) <= 1, f"frames left within a few ms of each other: {1000 * gaps} ms"


def assert_pts_counts_slots(taken: list[Taken], pacer: FramePacer) -> None:
    """Each step of ``pts`` is one slot plus the slots skipped on the way, exactly."""
    for before, after in itertools.pairwise(taken):
        skipped = after.skipped_slots - before.skipped_slots
        assert after.pts - before.pts == FRAME * (1 + skipped)
    last = taken[-1]
    assert last.pts == FRAME * (pacer.frames - 1 + pacer.skipped_slots)


def make_pacer(seconds: float = 1.0, **kwargs: Any) -> tuple[RingBuffer, FramePacer]:
    buffer = RingBuffer(round(seconds * RTC_RATE))
    return buffer, FramePacer(buffer, **kwargs)


def make_producer(**kwargs: Any) -> Producer:
    """A pacer over a ring buffer (one second unless ``seconds`` says otherwise), fed."""
    return Producer(*make_pacer(**kwargs))


async def on_a_quiet_loop(scenario: Callable[[], Awaitable[T]]) -> T:
    """Run a timed scenario until the event loop ran it without a stall.

    A run during which the machine froze the process for ``STALL`` says little about the
    pacer: the consumer misses slots, the producer writes in bursts. After ``TRIES`` runs
    the quietest one is returned, to be judged like any other: a wrong pacer is wrong on
    every run, so this can only spare a right one a measurement that the machine spoiled.
    """
    runs: list[tuple[float, T]] = []
    for _ in range(TRIES):
        heartbeat = Heartbeat()
        async with background(heartbeat.beat()):
            result = await scenario()
        if heartbeat.worst_lateness < STALL:
            return result
        runs.append((heartbeat.worst_lateness, result))
    return min(runs, key=lambda run: run[0])[1]


class Heartbeat:
    """Measures how late the event loop runs a timer every few milliseconds."""

    PERIOD = 0.004

    def __init__(self) -> None:
        self.worst_lateness = 0.0

    async def beat(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.PERIOD
            await sleep_until(due)
            self.worst_lateness = max(self.worst_lateness, loop.time() - due)


async def test_a_steady_producer_gives_fifty_frames_a_second() -> None:
    """One second of a steady stream is 50 slots, 20 ms apart, with pts 960 apart."""

    async def scenario() -> tuple[Producer, list[Taken]]:
        producer = make_producer()
        pacer, buffer = producer.pacer, producer.buffer
        loop = asyncio.get_running_loop()
        async with background(producer.steady(60)):
            taken = [await take(pacer, buffer)]
            while loop.time() < taken[0].time + 1.0 - 1.5 * SLOT:
                taken.append(await take(pacer, buffer))
        return producer, taken

    producer, taken = await on_a_quiet_loop(scenario)
    pacer = producer.pacer
    assert 48 <= len(taken) <= 51
    mean_ms = 1000 * (taken[-1].time - taken[0].time) / (len(taken) - 1)
    assert mean_ms == pytest.approx(20.0, abs=1.0)
    steps = np.diff([t.pts for t in taken])
    assert np.all(steps > 0)
    assert np.mean(steps == FRAME) >= 0.9, "slots were skipped on a steady stream"
    assert_pts_counts_slots(taken, pacer)
    assert pacer.underruns == 0
    assert values(taken) == list(range(len(taken)))
    assert_never_before_its_slot(taken, producer)


async def test_the_first_frame_waits_for_audio_instead_of_sending_silence() -> None:
    """Before the schedule is anchored there is no slot to fill: nothing goes out."""
    producer = make_producer()
    pacer = producer.pacer
    first = asyncio.ensure_future(take(pacer, producer.buffer))
    await asyncio.sleep(3 * SLOT)
    assert not first.done()
    producer.write()
    frame = await first
    assert not frame.silence
    assert frame.pts == 0
    assert (pacer.frames, pacer.underruns, pacer.skipped_slots) == (1, 0, 0)


async def test_pts_stays_monotonic_through_underruns_skipped_slots_and_a_restart() -> None:
    """The receiver places audio by timestamp: pts must never repeat or go back."""

    async def scenario() -> tuple[Producer, list[Taken], list[Taken]]:
        producer = make_producer()
        pacer, buffer = producer.pacer, producer.buffer
        async with background(producer.steady(60, hole=range(8, 14))):
            taken = await take_n(pacer, buffer, 5)
            await asyncio.sleep(3.5 * SLOT)  # the consumer is late: slots pass unused
            taken += await take_n(pacer, buffer, 15)
            pacer.restart()
            await asyncio.sleep(2.5 * SLOT)  # a new schedule anchors on the next frame
            after_restart = await take_n(pacer, buffer, 5)
        return producer, taken, after_restart

    producer, taken, after_restart = await on_a_quiet_loop(scenario)
    pacer = producer.pacer
    assert pacer.skipped_slots >= 2
    assert pacer.underruns >= 1
    everything = taken + after_restart
    pts = [t.pts for t in everything]
    assert all(b > a for a, b in itertools.pairwise(pts)), pts
    assert all(p % FRAME == 0 for p in pts)
    assert_pts_counts_slots(everything, pacer)
    # A restart forgets the clock, not the count: the new schedule continues the old one.
    assert after_restart[0].pts == taken[-1].pts + FRAME
    assert_never_before_its_slot(taken, producer)
    assert_never_before_its_slot(after_restart, producer)


async def test_an_underrun_fills_its_slot_with_silence_at_the_slot_pace() -> None:
    """A missing frame must neither stall the track nor make it spin out silence."""

    async def scenario() -> tuple[Producer, list[Taken]]:
        producer = make_producer()
        async with background(producer.steady(40, hole=range(10, 15))):  # 100 ms, no audio
            taken = await take_n(producer.pacer, producer.buffer, 28)
        return producer, taken

    producer, taken = await on_a_quiet_loop(scenario)
    pacer = producer.pacer
    silent = [i for i, t in enumerate(taken) if t.silence]
    assert pacer.underruns == len(silent) >= 3
    assert 8 <= silent[0] <= 11
    assert silent == list(range(silent[0], silent[0] + len(silent))), "one gap, one run"
    # Each silent frame is one slot (pts steps by 960) and leaves as its slot ends, not
    # later: so silence too comes at 20 ms intervals.
    assert_pts_counts_slots(taken, pacer)
    assert np.median(lateness(taken, producer)[silent]) < 0.010
    assert_never_before_its_slot(taken, producer)
    assert_slot_pace(taken)
    # Silence only fills the gap; every frame that was written is played, in order.
    assert values(taken) == list(range(len(values(taken))))
    assert pacer.frames == len(taken)


async def test_audio_released_after_a_stall_leaves_at_the_slot_pace_not_in_a_burst() -> None:
    """A jitter buffer or TTS that catches up must not send ten frames within a millisecond."""

    async def scenario() -> tuple[Producer, list[Taken]]:
        producer = make_producer()

        async def stall_then_burst() -> None:
            await producer.steady(5)
            await asyncio.sleep(10 * SLOT)  # 200 ms stall
            producer.write(10)

        async with background(stall_then_burst()):
            taken = await take_until_played(producer.pacer, producer.buffer, 15)
        return producer, taken

    producer, taken = await on_a_quiet_loop(scenario)
    assert producer.pacer.underruns >= 5  # the stall itself was filled with silence
    burst = [t for t in taken if not t.silence and t.value >= 5]
    assert [t.value for t in burst] == list(range(5, 15))
    assert_slot_pace(burst)
    assert_never_before_its_slot(taken, producer)


async def through_a_stalled_input(
    edges: dict[int, InputStall], writes: dict[int, int], slots: int, played: int
) -> tuple[FramePacer, list[Taken]]:
    """A transform's pacer fed one frame per slot for ``slots`` slots (``writes[k]`` frames
    at slot ``k`` where it says so), and told of its input's stall at the slots ``edges``
    gives: before that slot's write, except ``RELAYED``, which an input tells once it has
    handed the burst on. Returns the pacer and what it sent until ``played`` frames."""

    async def scenario() -> tuple[FramePacer, list[Taken]]:
        producer = make_producer(cushion=OutputCushion(), max_backlog=2 * FRAME)
        pacer = producer.pacer

        async def feed() -> None:
            start = asyncio.get_running_loop().time()
            for k in range(slots):  # frame k is due at start + k slots
                await sleep_until(start + k * SLOT)
                edge = edges.get(k)
                if edge is not None and edge is not InputStall.RELAYED:
                    pacer.input_stall(edge)
                if frames := writes.get(k, 1):
                    producer.write(frames)
                if edge is InputStall.RELAYED:
                    pacer.input_stall(edge)

        async with background(feed()):
            taken = await take_until_played(pacer, producer.buffer, played)
        return pacer, taken

    return await on_a_quiet_loop(scenario)


async def test_a_relayed_input_stall_sends_nothing_then_its_burst_on_the_same_slots() -> None:
    """A transform's input that passes a network stall on: the pacer fills no slot while
    it lasts, then sends the held audio at once on the slots it would have had (``pts``
    runs on without a jump, so the listener sees the lateness and holds it), and the
    frames after it go one per slot again."""
    held = dict.fromkeys(range(5, 14), 0)
    # What the stall held (more than the backlog bound) comes at once at slot 14.
    pacer, taken = await through_a_stalled_input(
        {5: InputStall.BEGAN, 14: InputStall.RELAYED}, {**held, 14: 10}, 25, 25
    )
    assert not any(t.silence for t in taken)
    assert values(taken) == list(range(25))  # nothing filled, dropped or skipped
    assert pacer.underruns == 0 and pacer.skipped_slots == 0 and pacer.backlog_dropped == 0
    assert [t.pts for t in taken] == [FRAME * k for k in range(taken[0].pts // FRAME, 25)]
    burst = [t for t in taken if 5 <= t.value < 13]
    assert max(intervals(burst)) < BURST_GAP  # the overdue slots leave back to back
    assert_slot_pace([t for t in taken if t.value >= 16], tolerance=0.004)
    assert pacer.relayed_stalls == 1


async def test_a_stall_the_input_gives_up_skips_its_slots_instead_of_sending_late() -> None:
    """The input waited and nothing came (a run of lost packets): what it hands on next is
    for the current slot, so the slots waited through are skipped, not sent late."""
    pacer, taken = await through_a_stalled_input(
        {5: InputStall.BEGAN, 11: InputStall.GIVEN_UP}, dict.fromkeys(range(5, 11), 0), 20, 14
    )
    assert values(taken) == list(range(14))
    first_after = next(t for t in taken if t.value == 5)  # written at slot 11
    assert first_after.pts // FRAME >= 10  # its own slot, give or take the anchor's phase
    assert 5 <= pacer.skipped_slots <= 6
    assert not any(t.silence for t in taken)


async def test_a_late_consumer_skips_the_missed_slots_instead_of_catching_up() -> None:
    """After a 100 ms pause of the caller, the piled-up frames still leave one per slot."""

    async def scenario() -> tuple[Producer, list[Taken], list[Taken]]:
        producer = make_producer()
        pacer, buffer = producer.pacer, producer.buffer
        async with background(producer.steady(40)):
            before = await take_n(pacer, buffer, 5)
            await asyncio.sleep(5 * SLOT)
            after = await take_n(pacer, buffer, 10)
        return producer, before, after

    producer, before, after = await on_a_quiet_loop(scenario)
    skipped = after[0].skipped_slots - before[-1].skipped_slots
    assert 4 <= skipped <= 6
    jump = after[0].pts - before[-1].pts
    assert jump == FRAME * (1 + skipped), "pts must jump over the missed slots"
    assert_pts_counts_slots(before + after, producer.pacer)
    assert_slot_pace(after)
    assert_never_before_its_slot(before + after, producer)
    # Without a backlog bound, the missed slots become latency, not lost audio.
    assert values(before + after) == list(range(15))
    assert after[-1].available >= 3 * FRAME


async def test_a_late_consumer_keeps_the_audio_of_missed_slots_within_the_bound() -> None:
    """A busy loop skips slots, not audio: dropping a frame per late call cut audible holes.

    The backlog that the lateness leaves is capped by ``max_backlog`` (and a standing one is
    drained once a window), so latency stays bounded without a gap for every hiccup.
    """

    async def scenario() -> tuple[Producer, list[Taken], list[Taken]]:
        producer = make_producer(max_backlog=3 * FRAME)
        pacer, buffer = producer.pacer, producer.buffer
        async with background(producer.steady(40)):
            before = await take_n(pacer, buffer, 5)
            await asyncio.sleep(5 * SLOT)
            after = await take_n(pacer, buffer, 10)
        return producer, before, after

    producer, before, after = await on_a_quiet_loop(scenario)
    skipped = after[0].skipped_slots - before[-1].skipped_slots
    assert 4 <= skipped <= 6
    assert all(t.available <= 3 * FRAME for t in after)
    played = values(before + after)
    assert played == sorted(played), "audio stays in order"
    assert_slot_pace(after)
    assert_never_before_its_slot(before + after, producer)


async def test_with_a_backlog_bound_a_standing_backlog_is_dropped_once_a_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two extra frames queued behind every frame of a window are latency nobody needs.

    One is a jitter allowance and stays; the other is dropped, and only that: the slots stay
    where they are. Moving them as well (every
    frame of that window waited behind the backlog) would put each frame at the very end
    of its slot, where the least jitter turns it into silence.
    """
    monkeypatch.setattr(pacing, "PHASE_WINDOW_FRAMES", 5)

    async def scenario() -> tuple[Producer, list[Taken]]:
        producer = make_producer(max_backlog=8 * FRAME)

        async def one_extra_frame() -> None:
            await asyncio.sleep(0)  # the steady producer writes its first frame
            await sleep_until(producer.written[0] + 6.5 * SLOT)
            producer.write()  # from here on, two frames wait behind every frame taken
            producer.write()

        async with background(producer.steady(50)), background(one_extra_frame()):
            taken = await take_n(producer.pacer, producer.buffer, 30)
        return producer, taken

    producer, taken = await on_a_quiet_loop(scenario)
    pacer = producer.pacer
    assert pacer.backlog_dropped == FRAME
    assert pacer.phase_corrections == 0
    assert pacer.underruns == 0
    # Frames 7 to 13 each leave two behind; the window of frames 10 to 14 drops one of them.
    assert [t.available for t in taken[7:16]] == [2 * FRAME] * 7 + [FRAME, FRAME]
    played = values(taken)
    assert len(set(range(int(played[-1]) + 1)) - set(played)) == 1, "exactly one frame dropped"
    delays_ms = np.array([1000 * (t.time - producer.written[int(t.value)]) for t in taken])
    assert np.median(delays_ms[8:14]) > 30.0, "the extra frames should delay the stream"
    assert 10.0 < np.median(delays_ms[-10:]) < 30.0, delays_ms  # the allowance: one frame
    assert_never_before_its_slot(taken, producer)


async def test_a_backlog_beyond_the_bound_is_dropped_oldest_first() -> None:
    producer = make_producer(max_backlog=3 * FRAME)
    pacer = producer.pacer
    producer.write(20)
    taken = await take_n(pacer, producer.buffer, 3)

    assert pacer.backlog_dropped == 17 * FRAME
    assert values(taken) == [17, 18, 19]
    assert [t.available for t in taken] == [2 * FRAME, FRAME, 0]
    assert_never_before_its_slot(taken, producer)


async def test_a_producer_faster_than_real_time_cannot_build_up_latency() -> None:
    """Two frames per slot: the buffer stays within the bound at every frame."""
    max_backlog = 3 * FRAME

    async def scenario() -> tuple[Producer, list[Taken]]:
        producer = make_producer(max_backlog=max_backlog)
        async with background(producer.steady(30, frames_per_slot=2)):
            taken = await take_n(producer.pacer, producer.buffer, 15)
        return producer, taken

    producer, taken = await on_a_quiet_loop(scenario)
    pacer = producer.pacer
    assert pacer.backlog_dropped > 0
    assert pacer.backlog_dropped % FRAME == 0  # whole frames here, since writes are whole
    assert all(t.available <= max_backlog - FRAME for t in taken)
    assert values(taken) == sorted(values(taken))
    assert_slot_pace(taken)
    assert_never_before_its_slot(taken, producer)


async def test_speech_made_ahead_of_time_leaves_at_exactly_fifty_frames_a_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A backlog is not a phase error: waiting behind queued audio must not speed up the slots.

    Every frame of a backlog is ready before it is asked for and then waits about a slot,
    so a phase check that counted those waits moved the slots a slot earlier every window:
    one frame went out right behind another, and the stream ran one frame a window faster
    than real time (2% with the real window of 50 frames). A window of 5 frames shows it in
    30 frames.
    """
    monkeypatch.setattr(pacing, "PHASE_WINDOW_FRAMES", 5)

    async def scenario() -> tuple[Producer, list[Taken]]:
        producer = make_producer(seconds=5.0)
        producer.write(150)  # 3 s synthesised at once; speech keeps it all
        taken = await take_n(producer.pacer, producer.buffer, 30)
        return producer, taken

    producer, taken = await on_a_quiet_loop(scenario)
    assert producer.pacer.phase_corrections == 0
    assert values(taken) == list(range(30))
    assert_pts_counts_slots(taken, producer.pacer)
    assert_slot_pace(taken, tolerance=0.0005)
    assert_never_before_its_slot(taken, producer)


async def test_a_ready_frame_goes_out_at_once_on_a_steady_producer() -> None:
    """Pacing must add no delay to a transform whose frames arrive on time."""

    async def scenario() -> tuple[Producer, list[Taken]]:
        producer = make_producer()
        async with background(producer.steady(60)):
            taken = await take_n(producer.pacer, producer.buffer, 35)
        return producer, taken

    producer, taken = await on_a_quiet_loop(scenario)
    delays_ms = [1000 * (t.time - producer.written[int(t.value)]) for t in taken]
    assert np.median(delays_ms) < 2.0, delays_ms
    assert producer.pacer.underruns == 0


async def test_slots_move_earlier_when_every_frame_had_to_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A schedule anchored 15 ms after the audio's own rhythm is pulled back into phase.

    The consumer takes its first frame 15 ms after it was written, so every later frame is
    ready about 15 ms before its slot. A phase window of 5 frames keeps the test short; the
    first window holds the anchoring frame, which never waits, so the first correction
    comes with the second. Each correction is the shortest wait of its window, so what is
    left is about the timer jitter of the producer.
    """
    monkeypatch.setattr(pacing, "PHASE_WINDOW_FRAMES", 5)

    async def scenario() -> tuple[Producer, list[Taken]]:
        producer = make_producer()
        async with background(producer.steady(60)):
            await asyncio.sleep(0)  # the producer writes its first frame
            await sleep_until(producer.written[0] + 0.015)
            taken = await take_n(producer.pacer, producer.buffer, 40)
        return producer, taken

    producer, taken = await on_a_quiet_loop(scenario)
    pacer = producer.pacer
    delays_ms = np.array([1000 * (t.time - producer.written[int(t.value)]) for t in taken])
    before, after = np.median(delays_ms[1:10]), np.median(delays_ms[-15:])
    assert before > 10.0, "the late anchor should delay every frame at first"
    assert pacer.phase_corrections >= 1
    assert after < before / 2, delays_ms
    assert pacer.underruns == 0
    assert values(taken) == list(range(40))


async def test_a_stream_that_ends_off_the_frame_grid_sends_its_last_partial_frame() -> None:
    """Expanding a late hop plays a number of samples that is not a whole frame, so a
    speech stream can end with a partial frame in the buffer. Until the stream is said to
    end it waits for more (silence goes out meanwhile); then it leaves, padded with
    silence, and nothing is left behind for the end-of-speech event to wait on."""
    buffer, pacer = make_pacer(cushion=OutputCushion(adaptive=False, expecting=lambda: False))
    buffer.write(np.ones(FRAME + 100, np.float32))
    pacer.notify()
    first, _ = await asyncio.wait_for(pacer.next_frame(), CALL_LIMIT)
    assert np.all(first == 1.0)
    waiting, is_silence = await asyncio.wait_for(pacer.next_frame(), CALL_LIMIT)
    assert is_silence and not np.any(waiting) and buffer.available == 100
    pacer.end_stream()
    last, is_silence = await asyncio.wait_for(pacer.next_frame(), CALL_LIMIT)
    assert not is_silence
    assert np.all(last[:100] == 1.0) and not np.any(last[100:]) and len(last) == FRAME
    assert buffer.available == 0 and buffer.consumed == buffer.written
