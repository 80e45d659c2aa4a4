"""CosyVoice over real WebRTC calls on loopback: streaming speech, errors, voice conversion."""

from __future__ import annotations

import asyncio
import io
import wave

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from media.audio.frames import FRAME_SAMPLES, RTC_RATE
from media.engines.cosyvoice.prompts import text_ids
from media.engines.cosyvoice.schedule import HopSchedule
from media.engines.registry import EngineRegistry
from media.pipeline.speak import SpeakPipeline
from peer.call import PeerCall
from peer.speech import espeak
from server.http.app import SERVER_KEY, create_app
from tests.conftest import LOOPBACK, loopback_settings, running_server
from tests.cosyvoice.conftest import SENTENCE

SILENCE_RMS = 1e-3
LONG_TEXT = " ".join([SENTENCE] * 2)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * RTC_RATE), np.float32)


def loud_frames(samples: np.ndarray) -> np.ndarray:
    n = len(samples) // FRAME_SAMPLES
    frames = samples[: n * FRAME_SAMPLES].reshape(n, FRAME_SAMPLES)
    return np.flatnonzero(np.sqrt(np.mean(frames**2, axis=1)) > SILENCE_RMS)


async def test_speech_streams_over_a_call_before_synthesis_finishes(
    cosyvoice_registry: EngineRegistry,
):
    """The first audio leaves on the track while later chunks are still being synthesised."""
    async with (
        running_server(cosyvoice_registry) as server,
        PeerCall(server.url, silence(30), engine="cosyvoice", options={"seed": 3}) as call,
    ):
        pipeline = server.server.sessions.get(call.session_id).pipeline
        assert isinstance(pipeline, SpeakPipeline)
        await call.send({"type": "speak", "text": LONG_TEXT, "id": "long"})
        started = await call.wait_for("speech_started", 20, id="long")
        finished = await call.wait_for("speech_finished", 60, id="long")
        await asyncio.sleep(0.2)
        state = pipeline._state
        assert state.finished_at is not None
        assert started["received_at"] < state.finished_at, "audio only began after synthesis"
        assert finished["interrupted"] is False
        # The tiny LLM says exactly two 40 ms tokens per text token; all of it was sent.
        spoken_ms = 80 * len(text_ids(pipeline.engine.model, LONG_TEXT))
        assert abs(finished["position_ms"] - spoken_ms) <= 0.05 * spoken_ms
        assert len(loud_frames(call.received())) > 50


async def test_a_failing_flow_gives_an_error_event_within_a_second(
    cosyvoice_registry: EngineRegistry, monkeypatch: pytest.MonkeyPatch
):
    engine = cosyvoice_registry.get("cosyvoice")

    def broken(*args, **kwargs):
        raise RuntimeError("injected flow failure")

    async with (
        running_server(cosyvoice_registry) as server,
        PeerCall(server.url, silence(10), engine="cosyvoice") as call,
    ):
        monkeypatch.setattr(engine.model.flow.decoder.estimator, "forward", broken)
        sent_at = await call.send({"type": "speak", "text": SENTENCE, "id": "bad"})
        error = await call.wait_for("error", 5, id="bad")
        assert error["error"] == "synthesis_failed"
        assert error["received_at"] - sent_at < 1.0
        monkeypatch.undo()
        await call.send({"type": "speak", "text": "Still here.", "id": "good"})
        finished = await call.wait_for("speech_finished", 20, id="good")
        assert finished["interrupted"] is False


async def test_voice_conversion_returns_each_phrase_after_it_ends(
    cosyvoice_registry: EngineRegistry,
):
    """A spoken phrase comes back converted, once the phrase is over (non-causal tokenizer).

    Prints the added latency: from the last sample of the phrase leaving the caller to the
    first converted sample arriving back.
    """
    phrase = 0.6 * espeak("Please convert this sentence into another voice.")
    caller = np.concatenate([silence(1.0), phrase, silence(3.0)])
    phrase_end = int(1.0 * RTC_RATE) + len(phrase)
    async with (
        running_server(cosyvoice_registry) as server,
        PeerCall(server.url, caller, engine="cosyvoice-vc", options={"speaker": "tiny-b"}) as call,
    ):
        await asyncio.wait_for(call.source.finished.wait(), 15)
        await asyncio.sleep(0.5)
        received = call.received()
        ended_at = call.source.timeline.time_of(phrase_end)
        engine_state = server.server.sessions.get(call.session_id).pipeline.state
        conversions = list(engine_state.finished)
    loud = loud_frames(received)
    assert len(loud), "nothing came back"
    first_back = call.recorder.timeline.time_of(loud[0] * FRAME_SAMPLES)
    assert first_back > ended_at, "converted audio came back before the phrase ended"
    added_ms = 1000 * (first_back - ended_at)
    returned_s = len(loud) * FRAME_SAMPLES / RTC_RATE
    assert 0.5 * len(phrase) / RTC_RATE < returned_s < 2 * len(phrase) / RTC_RATE + 0.5
    assert conversions and conversions[0].done_at is not None
    convert_ms = 1000 * (conversions[0].done_at - conversions[0].submitted_at)
    print(
        f"vc: {conversions[0].seconds:.2f} s phrase, added latency {added_ms:.0f} ms after it "
        f"ended (conversion {convert_ms:.0f} ms)"
    )
    assert added_ms < 5000


async def test_a_prompt_clip_uploaded_over_http_clones_the_session_voice(
    cosyvoice_registry: EngineRegistry,
):
    """Upload a WAV and its transcript once; the session's next utterance uses that voice."""
    clip = espeak("This is my voice, please copy it.", rate=16_000)
    wav = io.BytesIO()
    with wave.open(wav, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(16_000)
        writer.writeframes((np.clip(clip, -1, 1) * 32767).astype("<i2").tobytes())
    app = create_app(loopback_settings(), cosyvoice_registry)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, LOOPBACK, 0)
    await site.start()
    url = f"http://{LOOPBACK}:{runner.addresses[0][1]}/"
    try:
        async with (
            PeerCall(url, silence(20), engine="cosyvoice") as call,
            aiohttp.ClientSession() as http,
        ):
            route = f"{url}sessions/{call.session_id}/prompt"
            query = {"transcript": "This is my voice, please copy it."}
            headers = {"Content-Type": "audio/wav"}
            async with http.post(route, data=wav.getvalue(), params=query, headers=headers) as r:
                assert r.status == 200, await r.text()
                assert abs((await r.json())["seconds"] - len(clip) / 16_000) < 0.01
            async with http.post(route, data=b"not a wav", headers=headers) as r:
                assert r.status == 400
                assert (await r.json())["error"] == "invalid_audio"
            state = app[SERVER_KEY].sessions.get(call.session_id).pipeline.state
            assert state.speaker == "prompt" and state.prompt.flow.length > 0
            await call.send({"type": "speak", "text": SENTENCE, "id": "cloned"})
            finished = await call.wait_for("speech_finished", 30, id="cloned")
            assert finished["interrupted"] is False
            # the clip's prompt tokens count on the hop grid: the schedule reaches a grid
            # line at its first or (after an early first hop) its second hop
            prompt_tokens = state.prompt.flow.length
            expected = HopSchedule(25, prompt_tokens)
            assert state.last_hops == tuple(expected.next_hop() for _ in state.last_hops)
            assert (prompt_tokens + sum(state.last_hops[:2])) % 25 == 0
    finally:
        await runner.cleanup()


async def test_streamed_text_is_spoken_in_one_context_before_it_is_complete(
    cosyvoice_registry: EngineRegistry,
):
    """``speak_delta`` pieces reach CosyVoice2's bistream LLM as they arrive: audio starts
    before the utterance is flushed, and the pieces come back as one utterance."""
    async with (
        running_server(cosyvoice_registry) as server,
        PeerCall(server.url, silence(30), engine="cosyvoice", options={"seed": 3}) as call,
    ):
        pipeline = server.server.sessions.get(call.session_id).pipeline
        assert isinstance(pipeline, SpeakPipeline)
        words = LONG_TEXT.split()
        half = len(words) // 2
        for word in words[:half]:
            await call.send({"type": "speak_delta", "text": word + " ", "id": "stream"})
        started = await call.wait_for("speech_started", 30, id="stream")
        flushed_at = await call.send({"type": "speak_delta", "text": " ".join(words[half:])})
        await call.send({"type": "flush", "id": "stream"})
        finished = await call.wait_for("speech_finished", 60, id="stream")
    assert started["received_at"] < flushed_at, "audio waited for the whole text"
    assert finished["interrupted"] is False
    assert pipeline.stats.sentences == 1  # one model context for the whole utterance
    assert [e["id"] for e in call.events if e["type"] == "speech_started"] == ["stream"]
