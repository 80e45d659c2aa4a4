"""The tick scheduler of batched engines, driven with a model that records its steps."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from media.engines.batching import SchedulerClosed, SchedulerFull, SlotLeft, TickScheduler

HOP = 4
WAIT = 0.02


class RecordingModel:
    """Output = input + 1000 * the slot's step count: order and slot mix-ups show."""

    hop = HOP

    def __init__(self, fail_on_slot: int | None = None) -> None:
        self.steps: list[list[int]] = []
        self.counts: dict[int, int] = {}
        self.fail_on_slot = fail_on_slot
        self.lock = threading.Lock()

    def process(self, slots: Sequence[int], hops: np.ndarray) -> np.ndarray:
        with self.lock:
            self.steps.append(list(slots))
            if self.fail_on_slot in slots:
                raise RuntimeError("injected")
            out = []
            for slot, hop in zip(slots, hops, strict=True):
                self.counts[slot] = self.counts.get(slot, 0) + 1
                out.append(hop + 1000 * self.counts[slot])
            return np.stack(out)


def hops(value: float, count: int = 1) -> np.ndarray:
    return np.full((count, HOP), value, np.float32)


@pytest.fixture
def model() -> RecordingModel:
    return RecordingModel()


@pytest.fixture
def scheduler(model: RecordingModel) -> Iterator[TickScheduler]:
    running = TickScheduler(model, max_wait_s=WAIT)
    yield running
    running.close()


def test_hops_of_every_live_slot_go_in_one_step(scheduler, model):
    for slot in range(8):
        scheduler.join(slot)
    futures = [scheduler.submit(slot, hops(slot)) for slot in range(8)]
    results = [f.result(timeout=2) for f in futures]
    assert model.steps == [list(range(8))]
    for slot, result in enumerate(results):
        np.testing.assert_array_equal(result, np.full(HOP, slot + 1000))


def test_a_late_slot_does_not_delay_the_others_past_the_deadline(scheduler, model):
    scheduler.join(0)
    scheduler.join(1)  # live, but sends nothing
    began = time.monotonic()
    scheduler.submit(0, hops(1)).result(timeout=2)
    waited = time.monotonic() - began
    assert model.steps == [[0]]
    assert WAIT * 0.8 <= waited < WAIT + 0.2


def test_a_lone_slot_runs_at_once(scheduler, model):
    scheduler.join(0)
    began = time.monotonic()
    scheduler.submit(0, hops(1)).result(timeout=2)
    assert time.monotonic() - began < WAIT  # nobody else to wait for


def test_a_chunk_of_several_hops_takes_one_step_per_hop_in_order(scheduler, model):
    scheduler.join(0)
    scheduler.join(1)
    first = scheduler.submit(0, hops(5, count=3))
    second = scheduler.submit(1, hops(7, count=1))
    out = first.result(timeout=2)
    np.testing.assert_array_equal(out, np.repeat([5 + 1000, 5 + 2000, 5 + 3000], HOP))
    np.testing.assert_array_equal(second.result(timeout=2), np.full(HOP, 7 + 1000))
    assert model.steps == [[0, 1], [0], [0]]


def test_two_chunks_of_one_slot_never_share_a_step(scheduler, model):
    scheduler.join(0)
    scheduler.join(1)
    a = scheduler.submit(0, hops(1))
    b = scheduler.submit(0, hops(2))
    c = scheduler.submit(1, hops(3))
    assert a.result(timeout=2)[0] == 1 + 1000 and b.result(timeout=2)[0] == 2 + 2000
    assert c.result(timeout=2)[0] == 3 + 1000
    assert all(len(step) == len(set(step)) for step in model.steps)


def test_a_slot_that_leaves_is_not_waited_for_and_its_hops_are_dropped(scheduler, model):
    scheduler.join(0)
    scheduler.join(1)
    stale = scheduler.submit(1, hops(9))
    scheduler.leave(1)
    assert stale.cancelled()
    began = time.monotonic()
    scheduler.submit(0, hops(1)).result(timeout=2)
    assert time.monotonic() - began < WAIT
    assert 1 not in {slot for step in model.steps for slot in step}


class ClosingModel(RecordingModel):
    """Refuses a slot that is closed, as the real batched models do; slot 1 leaves (and is
    closed) while the first step of the round runs."""

    def __init__(self) -> None:
        super().__init__()
        self.closed: set[int] = set()
        self.on_first_step: threading.Event = threading.Event()
        self.may_go_on = threading.Event()

    def process(self, slots: Sequence[int], hops: np.ndarray) -> np.ndarray:
        if closed := self.closed.intersection(slots):
            raise KeyError(f"slot {closed.pop()} is not open")
        if not self.on_first_step.is_set():
            self.on_first_step.set()
            assert self.may_go_on.wait(2)
        return super().process(slots, hops)


def test_a_slot_that_leaves_mid_round_fails_only_its_own_chunk():
    model = ClosingModel()
    scheduler = TickScheduler(model, max_wait_s=WAIT)
    try:
        scheduler.join(0)
        scheduler.join(1)
        staying = scheduler.submit(0, hops(5, count=2))
        leaving = scheduler.submit(1, hops(7, count=2))
        assert model.on_first_step.wait(2)

        def close_slot_1() -> None:  # as an engine's close_state does
            scheduler.leave(1)
            with scheduler.model_lock:
                model.closed.add(1)

        closer = threading.Thread(target=close_slot_1)
        closer.start()
        time.sleep(0.05)  # the closer now waits for the step under way
        model.may_go_on.set()
        closer.join(2)
        np.testing.assert_array_equal(
            staying.result(timeout=2), np.repeat([5 + 1000, 5 + 2000], HOP)
        )
        with pytest.raises(SlotLeft):
            leaving.result(timeout=2)
        assert model.steps == [[0, 1], [0]]
    finally:
        scheduler.close()


def test_a_slot_cannot_queue_more_than_its_share(model):
    scheduler = TickScheduler(model, max_wait_s=10, max_hops_waiting=4)
    try:
        scheduler.join(0)
        scheduler.join(1)  # never sends: the round waits, so hops pile up
        scheduler.submit(0, hops(1, count=3))
        with pytest.raises(SchedulerFull):
            scheduler.submit(0, hops(1, count=2))
    finally:
        scheduler.close()


def test_a_failing_step_fails_its_sessions_and_the_scheduler_goes_on():
    model = RecordingModel(fail_on_slot=3)
    scheduler = TickScheduler(model, max_wait_s=WAIT)
    try:
        scheduler.join(3)
        with pytest.raises(RuntimeError, match="injected"):
            scheduler.submit(3, hops(1)).result(timeout=2)
        scheduler.leave(3)
        scheduler.join(4)
        assert scheduler.submit(4, hops(2)).result(timeout=2)[0] == 2 + 1000
    finally:
        scheduler.close()


def test_a_closed_scheduler_takes_no_more(scheduler):
    scheduler.close()
    with pytest.raises(SchedulerClosed):
        scheduler.submit(0, hops(1))
