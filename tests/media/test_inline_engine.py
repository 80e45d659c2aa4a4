"""An inline engine (echo) runs in the callback that feeds it: each frame is in the output
before ``feed`` returns, no task is woken per frame, and a failed call is recovered from
without losing the order of the frames that come meanwhile."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from media.audio.frames import FRAME_SAMPLES
from media.audio.opus import OpusEncoder
from media.engines.echo import EchoEngine
from media.pipeline.transform import TransformPipeline


class FailingEcho(EchoEngine):
    """Echo whose calls numbered in ``failing`` raise (counted from 0)."""

    def __init__(self, failing: set[int]) -> None:
        super().__init__()
        self.failing = failing
        self.calls = 0

    def process(self, state: None, chunk: np.ndarray) -> tuple[np.ndarray, None]:
        call, self.calls = self.calls, self.calls + 1
        if call in self.failing:
            raise RuntimeError(f"call {call} fails")
        return chunk, state


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(1) as pool:
        yield pool


def frame(value: float) -> np.ndarray:
    return np.full(FRAME_SAMPLES, value, np.float32)


def written(pipeline: TransformPipeline) -> list[float]:
    """The level of each frame written to the output so far."""
    buffer = pipeline.output.buffer
    samples = buffer.read(buffer.available)
    return [float(samples[k]) for k in range(0, len(samples), FRAME_SAMPLES)]


async def test_each_frame_is_in_the_output_when_feed_returns(executor: ThreadPoolExecutor):
    engine = FailingEcho(set())
    pipeline = await TransformPipeline.create(engine, {}, executor, OpusEncoder())
    try:
        pipeline._on_attach(first=True)
        for k in range(1, 6):
            pipeline.feed(frame(k / 10))
            assert written(pipeline) == [pytest.approx(k / 10)]
        assert pipeline.stats.engine_calls == 5
        assert pipeline._tasks == []  # no worker task to wake
    finally:
        await pipeline.close()


async def test_a_failed_call_is_silence_and_what_came_meanwhile_follows_in_order(
    executor: ThreadPoolExecutor,
):
    engine = FailingEcho({1})
    pipeline = await TransformPipeline.create(engine, {}, executor, OpusEncoder())
    try:
        pipeline._on_attach(first=True)
        pipeline.feed(frame(0.1))
        pipeline.feed(frame(0.2))  # fails: its state is reset off the loop
        pipeline.feed(frame(0.3))  # wait in the queue for the reset
        pipeline.feed(frame(0.4))
        assert written(pipeline) == [pytest.approx(0.1)]
        async with asyncio.timeout(5):
            while pipeline.stats.engine_calls < 3:
                await asyncio.sleep(0.01)
        assert written(pipeline) == [0.0, pytest.approx(0.3), pytest.approx(0.4)]
        pipeline.feed(frame(0.5))  # inline again
        assert written(pipeline) == [pytest.approx(0.5)]
        assert pipeline.stats.engine_errors == 1
        assert pipeline._tasks == []
    finally:
        await pipeline.close()
