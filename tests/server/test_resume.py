"""Resume: a caller whose network drops comes back on a new connection to the same session.

The drop is real: every datagram of the first connection crosses a userspace UDP relay
that the test then cuts, so the server sees what it would see on the internet (RTP stops,
ICE consent has not failed yet) and detaches the session after ``rtp_timeout``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
import pytest

from media.audio.frames import FRAME_SAMPLES, RTC_RATE
from media.audio.resample import StreamResampler
from media.engines.base import SpeakEngine
from media.engines.registry import EngineRegistry
from peer.call import PeerCall
from signaling.client import SignalingError
from tests.conftest import running_server
from tests.integration.test_transform_call import frame_levels_db
from tests.netfaults.relay import UdpRelay

VOICED_DB = -45.0
LONG_TEXT = (
    "The quarterly report covers sales in every region, the new hires in the support team, "
    "and the plan for the warehouse move that starts next month."
)


async def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.05)
    assert condition(), what


def noise(seconds: float, seed: int = 5) -> np.ndarray:
    """Continuous audio: every 20 ms of it is audible, so any hole in the echo is visible."""
    rng = np.random.default_rng(seed)
    return (0.1 * rng.standard_normal(int(seconds * RTC_RATE))).astype(np.float32)


def voiced_frames(audio: np.ndarray) -> int:
    return int(np.sum(frame_levels_db(audio) > VOICED_DB))


def relayed(url: str, relay: UdpRelay, audio: np.ndarray, engine: str) -> PeerCall:
    return PeerCall(
        url,
        audio,
        engine=engine,
        offer_filter=relay.rewrite_offer,
        answer_filter=relay.rewrite_answer,
    )


async def test_transform_session_resumes_with_its_state(registry: EngineRegistry):
    async with running_server(registry, rtp_timeout=0.5, resume_grace=10.0) as running:
        with UdpRelay(seed=3) as relay:
            first = relayed(running.url, relay, noise(30), "echo")
            second: PeerCall | None = None
            try:
                await first.connect()
                assert first.answer is not None and first.answer.resume is not None
                session = running.server.sessions.get(first.session_id or "")
                pipeline = session.pipeline
                await asyncio.sleep(1.0)

                relay.blackout()  # the caller's network is gone, without a word
                await wait_until(lambda: session.connection is None, 5, "detached")
                frames_at_detach = pipeline.stats.frames_in
                assert frames_at_detach > 30
                assert running.server.sessions.get(session.id) is session  # kept for resume

                second = PeerCall(running.url, noise(30, seed=6), resume=first.answer.resume)
                await second.connect()
                assert second.session_id == session.id
                assert second.answer is not None
                assert second.answer.resume_token != first.answer.resume_token
                await asyncio.sleep(1.0)

                assert session.pipeline is pipeline and session.resumes == 1
                assert session.detached_at is None and session.grace is None
                # The same engine state and counters carry on rather than start over.
                assert pipeline.stats.frames_in > frames_at_detach + 25
                assert pipeline.stats.engine_errors == 0
                assert voiced_frames(second.received()) > 25  # the echo comes back

                with pytest.raises(SignalingError) as spent:  # a token works once
                    async with PeerCall(running.url, noise(1), resume=first.answer.resume):
                        pass
                assert (spent.value.status, spent.value.code) == (403, "invalid_resume_token")
            finally:
                if second is not None:
                    await second.close()
                await first.close()


def played_once_voiced_frames(engine: SpeakEngine, text: str) -> int:
    """Voiced 20 ms frames of ``text`` spoken once, straight from the engine."""
    import threading

    state = engine.new_state(engine.validate_options({}))
    try:
        chunks = list(engine.synthesize(state, text, threading.Event()))
    finally:
        engine.close_state(state)
    audio = StreamResampler(engine.sample_rate, RTC_RATE).process(np.concatenate(chunks))
    return voiced_frames(audio[: len(audio) // FRAME_SAMPLES * FRAME_SAMPLES])


async def test_speech_continues_where_it_stopped(registry: EngineRegistry):
    """Half an utterance on the first connection, the rest on the second: no replay."""
    engine = registry.get("piper")
    assert isinstance(engine, SpeakEngine)
    whole = await asyncio.to_thread(played_once_voiced_frames, engine, LONG_TEXT)
    async with running_server(
        registry, engine="piper", rtp_timeout=0.5, resume_grace=10.0
    ) as running:
        with UdpRelay(seed=4) as relay:
            first = relayed(running.url, relay, np.zeros(RTC_RATE * 30, np.float32), "piper")
            second: PeerCall | None = None
            try:
                await first.connect()
                assert first.answer is not None and first.answer.resume is not None
                session = running.server.sessions.get(first.session_id or "")
                await first.send({"type": "speak", "text": LONG_TEXT, "id": "long"})
                await first.wait_for("speech_started", timeout=15, id="long")
                await asyncio.sleep(2.5)
                relay.blackout()
                await wait_until(lambda: session.connection is None, 5, "detached")
                heard_first = voiced_frames(first.received())

                await asyncio.sleep(0.5)  # time passes; the speech must not
                second = PeerCall(
                    running.url, np.zeros(RTC_RATE * 30, np.float32), resume=first.answer.resume
                )
                await second.connect()
                finished = await second.wait_for("speech_finished", timeout=30, id="long")
                heard_second = voiced_frames(second.received())
            finally:
                if second is not None:
                    await second.close()
                await first.close()
    assert finished["interrupted"] is False
    assert heard_first > 0.2 * whole and heard_second > 0.2 * whole
    # A restart would replay what the first connection heard: together they would be well
    # over one telling. (Frames sent while the server had not yet noticed the drop are
    # lost, so the sum may fall short of it.)
    assert heard_first + heard_second < 1.1 * whole


async def test_resume_refusals_are_specific(registry: EngineRegistry):
    async with (
        running_server(registry, rtp_timeout=0.5, resume_grace=5.0) as running,
        PeerCall(running.url, noise(10), engine="echo") as call,
    ):
        assert call.answer is not None and call.answer.resume is not None
        cases = [
            ({"session_id": "nope", "token": "x"}, None, 404, "session_not_found"),
            ({**call.answer.resume, "token": "wrong"}, None, 403, "invalid_resume_token"),
            (call.answer.resume, "piper", 400, "resume_engine_mismatch"),
        ]
        for resume, engine, status, code in cases:
            with pytest.raises(SignalingError) as refused:
                async with PeerCall(running.url, noise(1), engine=engine, resume=resume):
                    pass
            assert (refused.value.status, refused.value.code) == (status, code)
        session = running.server.sessions.get(call.session_id or "")
        assert session.connection is not None and session.resumes == 0  # refusals touch nothing


async def test_a_session_not_resumed_in_time_is_reclaimed(registry: EngineRegistry):
    async with running_server(registry, rtp_timeout=0.5, resume_grace=0.5) as running:
        with UdpRelay(seed=5) as relay:
            async with relayed(running.url, relay, noise(30), "echo") as call:
                session = running.server.sessions.get(call.session_id or "")
                await asyncio.sleep(0.5)
                relay.blackout()
                await wait_until(lambda: session.closed.is_set(), 5, "reclaimed")
                assert len(running.server.sessions) == 0
                with pytest.raises(SignalingError) as late:
                    async with PeerCall(running.url, noise(1), resume=call.answer.resume):  # type: ignore[union-attr]
                        pass
                assert late.value.status == 404
