"""Per-stage latency: where each frame's time went, and that the stages account for all of it."""

from __future__ import annotations

import asyncio

import aiohttp
import numpy as np
import pytest

from media.engines.registry import EngineRegistry
from media.pipeline.stages import (
    SPEAK_STAGES,
    TRANSFORM_STAGES,
    DurationHistogram,
    SpeakStages,
    TransformStages,
)
from peer.call import PeerCall
from peer.speech import SpeechFixture
from tests.conftest import running_server
from tests.netfaults.relay import Impairment, UdpRelay

FRAME = 960
STAGE_SUM_TOLERANCE_MS = 2.0


def row(stages: TransformStages | SpeakStages) -> dict[str, float]:
    """The last frame's stages (and in-to-out), in ms."""
    names = (*stages.window.names, *stages.window.extra)
    last = stages.window.rows[-1]
    return {name: round(value * 1000, 6) for name, value in zip(names, last, strict=True)}


def test_a_duration_lands_in_the_first_bucket_at_or_above_it():
    histogram = DurationHistogram((0.001, 0.01))
    for seconds in (0.0005, 0.001, 0.002, 0.01, 5.0):
        histogram.observe(seconds)
    assert histogram.cumulative() == [(0.001, 2), (0.01, 4), (float("inf"), 5)]
    assert histogram.count == 5
    assert histogram.sum == pytest.approx(5.0135)


def test_histograms_add_only_when_their_buckets_agree():
    total, part = DurationHistogram((0.001,)), DurationHistogram((0.001,))
    part.observe(0.0001)
    part.observe(1.0)
    total.add(part)
    total.add(part)
    assert total.counts == [2, 2]
    with pytest.raises(ValueError):
        total.add(DurationHistogram((0.002,)))


def test_each_frame_is_timed_from_the_chunks_that_hold_its_last_sample():
    """Guards the position bookkeeping: an evicted chunk takes no positions, and an engine
    that returns a call's output one call late makes the wait show as engine time."""
    stages = TransformStages()
    # Three 20 ms chunks arrive 20 ms apart; each waits 2 ms in the receive path.
    for index, arrived in enumerate((0.000, 0.020, 0.040)):
        stages.pushed(FRAME, arrived, arrived + 0.002, 0.0001, arrived + 0.0021)
        assert stages.queued == index + 1
    stages.evicted()  # the queue dropped the first one
    # The engine holds the second chunk's audio and returns it with the third's.
    stages.dequeued(0.045)
    stages.produced(0.046, 0.0, written_end=0, written=0.046)
    stages.dequeued(0.046)
    stages.produced(0.050, 0.0002, written_end=2 * FRAME, written=0.0505)
    assert stages.queued == 0
    # The first output frame is the second chunk's audio.
    stages.departed(FRAME, ready=0.051, taken=0.060, sent=0.0603, in_to_out=0.0403)
    assert row(stages) == {
        "receive": 2.0,
        "resample": 0.3,
        "queue": 0.045 * 1000 - 22.1,
        "engine": 5.0,
        "output_buffer": 0.5,
        "pacing": 9.0,
        "encode": 0.3,
        "in_to_out": 40.3,
    }
    # The second frame is the third chunk's; its engine time is its own call.
    stages.departed(2 * FRAME, ready=0.080, taken=0.080, sent=0.0802, in_to_out=0.0402)
    assert row(stages)["queue"] == pytest.approx(3.9)
    assert row(stages)["engine"] == pytest.approx(4.0)
    assert stages.in_to_out.count == 2 and stages.engine_calls.count == 2


def test_a_frame_without_an_in_to_out_measurement_is_left_out_of_the_window():
    """The window's stage means must be over the same frames as its in-to-out mean."""
    stages = TransformStages()
    stages.pushed(FRAME, 0.0, 0.0, 0.0, 0.0)
    stages.dequeued(0.001)
    stages.produced(0.002, 0.0, FRAME, 0.002)
    stages.departed(FRAME, 0.003, 0.004, 0.005, in_to_out=None)
    assert len(stages.window.rows) == 0
    assert stages.window.summary_ms() == {"frames": 0, **dict.fromkeys(TRANSFORM_STAGES)} | {
        "in_to_out": None
    }


def test_speech_cleared_by_an_interrupt_is_not_timed_as_what_follows():
    stages = SpeakStages()
    stages.synthesised(4 * FRAME, synthesis=0.030, resample=0.001, at=1.0)
    stages.departed(FRAME, ready=1.0, taken=1.02, sent=1.021)
    assert row(stages) == pytest.approx(
        {"synthesis": 30.0, "resample": 1.0, "output_buffer": 0.0, "pacing": 20.0, "encode": 1.0}
    )
    stages.cleared()
    stages.departed(2 * FRAME, ready=1.04, taken=1.04, sent=1.041)  # the faded frame
    assert len(stages.window.rows) == 1
    stages.synthesised(6 * FRAME, synthesis=0.010, resample=0.0, at=2.0)
    stages.padded(7 * FRAME, at=2.0)
    stages.departed(7 * FRAME, ready=2.1, taken=2.1, sent=2.1)
    assert row(stages)["synthesis"] == 0.0  # padding, not synthesis
    assert stages.synthesis.count == 2


@pytest.fixture(scope="module")
def jitter() -> Impairment:
    """Up to 40 ms of extra delay on the way in: packets overtake each other (20 ms apart)
    and the receive path holds the ones that arrive early."""
    return Impairment(jitter_ms=40.0, loss=0.02)


async def test_a_calls_stages_add_up_to_its_measured_in_to_out_time(
    registry: EngineRegistry, speech: SpeechFixture, jitter: Impairment
):
    """Each stage is timed by its own clock readings and each frame's in-to-out time by the
    InToOutMeter's own arrival records; if a stage were missed or counted twice, or a frame
    were timed from the wrong chunk (off by one 20 ms frame), the sums would disagree.

    The call goes through a jittery, lossy link into ``denoise`` (an engine in a worker
    thread), so the receive wait, the queue and the engine all hold real time.
    """
    async with running_server(registry) as running:
        with UdpRelay(seed=9) as relay:
            peer = PeerCall(
                running.url,
                speech.clean,
                engine="denoise",
                offer_filter=relay.rewrite_offer,
                answer_filter=relay.rewrite_answer,
            )
            async with peer, aiohttp.ClientSession() as http:
                relay.to_server.impairment = jitter
                await asyncio.sleep(4.0)
                since = len(peer.events)
                event = await peer.wait_for("stats", since=since, timeout=3.0)
                async with http.get(f"{running.url}sessions/{peer.session_id}") as response:
                    described = (await response.json())["stats"]["stages_ms"]
    for stages in (event["stages_ms"], described):
        assert stages["frames"] >= 50, stages
        total = sum(stages[name]["mean"] for name in TRANSFORM_STAGES)
        measured = stages["in_to_out"]["mean"]
        print(f"stages {stages}; sum {total:.3f} ms; in-to-out {measured:.3f} ms")
        assert abs(total - measured) <= STAGE_SUM_TOLERANCE_MS, stages
    assert relay.to_server.stats.lost > 0
    assert described["receive"]["mean"] > 0.2, "the jitter margin did not show"
    assert described["engine"]["mean"] > 0.2, "the engine call did not show"
    assert described["encode"]["mean"] > 0.0


async def test_a_speak_sessions_stages_are_synthesis_buffer_pacing_and_encode(
    registry: EngineRegistry,
):
    async with running_server(registry) as running:
        silence = np.zeros(48_000 * 10, np.float32)
        async with PeerCall(running.url, silence, engine="piper") as peer:
            await peer.send({"type": "speak", "text": "Where does the time go?"})
            await peer.wait_for("speech_finished", timeout=15.0)
            session = running.server.sessions.get(peer.session_id or "")
            described = session.describe()
            histograms = session.pipeline.stages
            assert isinstance(histograms, SpeakStages)
    stages = described["stats"]["stages_ms"]
    assert set(stages) == {"frames", *SPEAK_STAGES}
    assert stages["frames"] > 10
    assert stages["synthesis"]["mean"] > 0.0
    assert stages["encode"]["mean"] > 0.0
    assert histograms.first_audio.count == 1
    assert histograms.synthesis.count > 0
