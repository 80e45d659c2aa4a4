"""Speak sessions on ``cosyvoice-triton`` over real calls, with a real Triton server behind.

The stand-in speaks a tone whose pitch encodes the text, so what the caller hears says which
text the server spoke; its events file says what the server saw and when.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from media.audio.frames import RTC_RATE
from peer.call import PeerCall
from scripts.triton_standin import pitch_hz
from signaling.client import SignalingError
from tests.conftest import running_server
from tests.triton.conftest import (
    READY_WAIT_S,
    Served,
    Standin,
    needs_triton,
    triton_engine,
    triton_registry,
)

pytestmark = [needs_triton, pytest.mark.usefixtures("collected_first")]

ENGINE = "cosyvoice-triton"
OPTIONS = {"barge_in": False}  # the caller sends silence; nothing to barge in with
LONG_TEXT = "This answer is long enough to still be streaming when the caller cuts in. " * 4


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * RTC_RATE), np.float32)


def dominant_hz(audio: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(audio * np.hanning(len(audio))))
    return float(np.argmax(spectrum) * RTC_RATE / len(audio))


def loud(audio: np.ndarray) -> np.ndarray:
    """From the first to the last loud sample: the speech, without the silence around it."""
    where = np.flatnonzero(np.abs(audio) > 0.05)
    return audio[where[0] : where[-1] + 1] if len(where) else audio[:0]


async def speak(call: PeerCall, text: str) -> tuple[dict[str, Any], dict[str, Any], np.ndarray]:
    """Speak ``text`` to the end: (speech_started, speech_finished, audio received)."""
    since, start_frame = len(call.events), len(call.received())
    sent_at = await call.send({"type": "speak", "text": text})
    started = await call.wait_for("speech_started", 10, since=since)
    finished = await call.wait_for("speech_finished", 20, since=since, id=started["id"])
    await asyncio.sleep(0.2)  # the last frames are still on the wire
    started["after_s"] = started["received_at"] - sent_at
    return started, finished, call.received()[start_frame:]


async def test_first_audio_over_a_call_is_the_tone_of_the_text(served: Served):
    text = "Hello from the Triton server."
    async with (
        running_server(served.registry, engine=ENGINE) as server,
        PeerCall(server.url, silence(20), engine=ENGINE, options=OPTIONS) as call,
    ):
        started, finished, audio = await speak(call, text)
    assert started["after_s"] < 1.0, f"first audio after {started['after_s']:.2f} s"
    assert finished["interrupted"] is False
    heard = loud(audio)
    assert len(heard) > 0.5 * RTC_RATE, "too little audio came back"
    assert abs(dominant_hz(heard) - pitch_hz(text)) < 3


async def test_eight_calls_at_once_each_hear_their_own_text(served: Served):
    """Eight sessions speak at the same moment: eight streams on one channel, and every
    caller hears the tone of its own text, not a neighbour's.

    The engine computes on the Triton server (``own_compute``): a stream waiting for audio
    waits on the pool's waiting threads, so one engine thread serves all eight.
    """
    texts = [f"Caller {n} would like to hear about the weather." for n in range(8)]
    async with running_server(served.registry, engine=ENGINE, engine_threads=1) as server:
        calls = [PeerCall(server.url, silence(15), engine=ENGINE, options=OPTIONS) for _ in texts]
        try:
            await asyncio.gather(*(call.connect() for call in calls))
            results = await asyncio.gather(
                *(speak(call, text) for call, text in zip(calls, texts, strict=True))
            )
        finally:
            await asyncio.gather(*(call.close() for call in calls))
    for text, (started, finished, audio) in zip(texts, results, strict=True):
        assert started["after_s"] < 1.5 and finished["interrupted"] is False
        assert abs(dominant_hz(loud(audio)) - pitch_hz(text)) < 3, text


async def test_interrupt_closes_the_stream_on_the_server_within_one_chunk(served: Served):
    """``interrupt`` mid-sentence: the engine closes the utterance's gRPC stream and the
    model sees the request cancelled before it sends more than one further chunk."""
    engine = served.engine
    async with (
        running_server(served.registry, engine=ENGINE) as server,
        PeerCall(server.url, silence(20), engine=ENGINE, options=OPTIONS) as call,
    ):
        since = len(call.events)
        await call.send({"type": "speak", "text": LONG_TEXT, "id": "long"})
        await call.wait_for("speech_started", 10, since=since, id="long")
        await asyncio.sleep(0.3)
        interrupted_at = await call.send({"type": "interrupt"})
        finished = await call.wait_for("speech_finished", 5, since=since, id="long")
        await asyncio.sleep(0.2)
    assert finished["interrupted"] is True
    # The sentence being spoken: the last request the server got before the interrupt.
    request = [e for e in served.standin.events("request") if e["at"] < interrupted_at][-1]["id"]
    (cancelled,) = served.standin.events("cancelled", id=request)
    chunks = served.standin.events("chunk", id=request)
    late = [chunk for chunk in chunks if chunk["at"] > interrupted_at]
    assert len(late) <= 1, f"{len(late)} chunks after the interrupt"
    assert cancelled["at"] - interrupted_at < 0.1
    assert engine.active_streams == 0


async def test_a_server_killed_mid_utterance_errors_the_session_and_is_recovered_from(
    make_standin: Callable[[], Standin],
):
    """SIGKILL the Triton server while it streams: the live session gets an ``error`` event
    within a moment and goes on; new sessions are refused with 503 ``engine_unavailable``
    naming the server; when the server is back the engine reconnects by itself, and both
    the old session and a new one speak again."""
    standin = make_standin()
    registry = triton_registry(standin.url)
    engine = triton_engine(registry)
    try:
        assert await asyncio.to_thread(engine.wait_until_available, READY_WAIT_S)
        async with (
            running_server(registry, engine=ENGINE) as server,
            PeerCall(server.url, silence(30), engine=ENGINE, options=OPTIONS) as call,
        ):
            since = len(call.events)
            await call.send({"type": "speak", "text": LONG_TEXT, "id": "cut"})
            await call.wait_for("speech_started", 10, since=since, id="cut")
            standin.kill()
            killed_at = time.monotonic()
            error = await call.wait_for("error", 5, since=since)
            assert error["error"] == "synthesis_failed" and error["id"] == "cut"
            assert error["received_at"] - killed_at < 1.0
            (cut,) = standin.events("request")
            assert standin.events("chunk", id=cut["id"]), "killed before it streamed"
            assert not standin.events("finished", id=cut["id"]), "killed after it finished"
            assert engine.unavailable_reason is not None
            assert standin.url in engine.unavailable_reason

            with pytest.raises(SignalingError) as refused:
                async with PeerCall(server.url, silence(5), engine=ENGINE, options=OPTIONS):
                    pass
            assert (refused.value.status, refused.value.code) == (503, "engine_unavailable")
            assert standin.url in refused.value.message

            standin.start()
            assert await asyncio.to_thread(engine.wait_until_available, READY_WAIT_S)
            text = "The server is back."
            _, finished, audio = await speak(call, text)
            assert finished["interrupted"] is False
            assert abs(dominant_hz(loud(audio)) - pitch_hz(text)) < 3
            async with PeerCall(server.url, silence(10), engine=ENGINE, options=OPTIONS) as second:
                _, _, audio = await speak(second, text)
            assert abs(dominant_hz(loud(audio)) - pitch_hz(text)) < 3
    finally:
        registry.close()
