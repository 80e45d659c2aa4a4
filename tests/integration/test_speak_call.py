"""Speak sessions over real calls: text in over the data channel or HTTP, speech back."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator

import aiohttp
import numpy as np
import pytest

from media.audio.frames import FRAME_SAMPLES, RTC_RATE
from media.engines.registry import EngineRegistry
from media.engines.testing import FAKE_SPEAK
from media.pipeline.speak import SpeakPipeline
from media.pipeline.speak.prebuffer import PreBuffer
from media.pipeline.speak.utterances import MAX_QUEUED_UTTERANCES
from peer.call import PeerCall
from peer.packet_tap import SILENT_PEAK, PacketTap
from peer.probe import silence_after
from peer.speech import espeak
from tests.conftest import RunningServer, running_server
from tests.transcribe import transcribe, word_recall

SENTENCES = (
    "The weather today is sunny and warm.",
    "Please send the report before Friday morning.",
    "My favourite colour is green.",
)
PARAGRAPH = (
    "This is a long paragraph that keeps the speaker busy for a good while. "
    "It talks about the river, the mountains and the small town beside the lake. "
    "Every morning the baker opens the shop and the smell of bread fills the street. "
    "Children walk to school and the old men sit on the bench near the fountain. "
    "In the evening the lights come on one by one and the town goes quiet again."
)
SILENCE_RMS = 1e-3

# Calls judged by their timing or sound: see the fixture.
pytestmark = pytest.mark.usefixtures("collected_first")


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * RTC_RATE), np.float32)


def speak_pipeline(server: RunningServer, call: PeerCall) -> SpeakPipeline:
    assert call.session_id is not None
    pipeline = server.server.sessions.get(call.session_id).pipeline
    assert isinstance(pipeline, SpeakPipeline)
    return pipeline


def frame_rms(samples: np.ndarray) -> np.ndarray:
    n = len(samples) // FRAME_SAMPLES
    return np.sqrt(np.mean(samples[: n * FRAME_SAMPLES].reshape(n, FRAME_SAMPLES) ** 2, axis=1))


def speech_span(samples: np.ndarray) -> tuple[int, int]:
    """First and last frame index with sound."""
    loud = np.flatnonzero(frame_rms(samples) > SILENCE_RMS)
    assert len(loud), "no speech came back"
    return int(loud[0]), int(loud[-1])


def longest_pause_ms(samples: np.ndarray) -> float:
    rms = frame_rms(samples)
    first, last = speech_span(samples)
    longest = run = 0
    for value in rms[first : last + 1]:
        run = run + 1 if value <= SILENCE_RMS else 0
        longest = max(longest, run)
    return longest * 1000 * FRAME_SAMPLES / RTC_RATE


async def say(call: PeerCall, text: str, timeout: float = 20) -> tuple[dict, np.ndarray]:
    """Speak ``text``; return the finish event and the audio received meanwhile."""
    since, start_frame = len(call.events), call.recorder.frames
    await call.send({"type": "speak", "text": text})
    queued = await call.wait_for("speech_queued", since=since)
    finished = await call.wait_for("speech_finished", timeout, since=since, id=queued["id"])
    await asyncio.sleep(0.2)  # the last frames are still on the wire
    return finished, call.received()[start_frame * FRAME_SAMPLES :]


async def test_spoken_words_are_right(server: RunningServer):
    """The sentences come back as speech a recogniser understands: mean word recall >= 0.6.

    pocketsphinx's small model misses words in clean speech too (Piper's voice scores ~0.8
    on these), so the bar is on the mean, with a lower floor for each sentence.
    """
    recalls, heard_all = [], []
    async with PeerCall(server.url, silence(40), engine="piper") as call:
        for sentence in SENTENCES:
            finished, audio = await say(call, sentence)
            assert finished["interrupted"] is False
            assert finished["position_ms"] > 500
            heard = transcribe(audio, RTC_RATE)
            recalls.append(word_recall(sentence, heard))
            heard_all.append(heard)
    assert np.mean(recalls) >= 0.6, f"recall {recalls} for {heard_all}"
    assert min(recalls) >= 0.4, f"recall {recalls} for {heard_all}"


async def test_speak_delta_pieces_of_one_sentence_come_back_as_one_sentence(
    server: RunningServer,
):
    """Pieces streamed as an LLM emits them are spoken as one sentence, without gaps.

    Guards against speaking each piece as it arrives, which puts a pause and a prosody
    break at every piece boundary.
    """
    sentence = "Streaming text arrives in small pieces but should sound like one sentence."
    pieces = [word + " " for word in sentence.split()]
    async with PeerCall(server.url, silence(40), engine="piper") as call:
        whole, whole_audio = await say(call, sentence)
        since, start_frame = len(call.events), call.recorder.frames
        for piece in pieces:
            await call.send({"type": "speak_delta", "text": piece, "id": "streamed"})
            await asyncio.sleep(0.04)
        await call.send({"type": "flush", "id": "streamed"})
        finished = await call.wait_for("speech_finished", 20, since=since, id="streamed")
        await asyncio.sleep(0.2)
        streamed_audio = call.received()[start_frame * FRAME_SAMPLES :]
    starts = [e for e in call.events[since:] if e["type"] == "speech_started"]
    assert [e["id"] for e in starts] == ["streamed"]
    assert abs(finished["position_ms"] - whole["position_ms"]) <= 0.1 * whole["position_ms"]
    assert longest_pause_ms(streamed_audio) <= longest_pause_ms(whole_audio) + 60


async def test_interrupt_silences_the_track_and_stops_synthesis(server: RunningServer):
    """Interrupt mid-paragraph: silent within 50 ms, no model run afterwards, position told.

    The server's figure runs to where the listener's decoder falls silent: the faded frame
    plus the encoder's 6.5 ms lookahead that carries its end (it stopped at the fade before).
    """
    async with PeerCall(server.url, silence(40), engine="piper") as call:
        pipeline = speak_pipeline(server, call)
        engine = pipeline.engine
        since = len(call.events)
        await call.send({"type": "speak", "text": PARAGRAPH, "id": "long"})
        await call.wait_for("speech_started", since=since, id="long")
        await asyncio.sleep(1.0)
        await call.send({"type": "interrupt"})
        finished = await call.wait_for("speech_finished", since=since, id="long")
        runs_at_finish = engine.model_runs
        await asyncio.sleep(1.0)
        assert finished["interrupted"] is True
        assert 200 <= finished["position_ms"] <= 3000  # about 1 s was sent; less under load
        assert pipeline.last_interrupt_ms is not None and pipeline.last_interrupt_ms <= 50
        assert engine.model_runs == runs_at_finish, "synthesis went on after the interrupt"
        tail = call.received()[-int(0.5 * RTC_RATE) :]
        assert frame_rms(tail).max() <= SILENCE_RMS


async def test_no_audio_of_an_interrupted_utterance_leaves_after_its_first_silent_frame(
    server: RunningServer,
):
    """Every packet after an interrupt, inspected: once one is silent, all the rest are.

    Seen on the wire by an independent probe on a Piper paragraph, three runs alike: after
    `interrupt` the server sent a near-empty packet, nothing for a slot, then three more
    packets carrying ~60 ms of speech (~95 ms after the interrupt). The fade left half a
    frame in the buffer, which the pacer sent as a 10 ms packet and the encoder's
    lookahead then spread the speech into the packets after it.
    """
    async with PeerCall(server.url, silence(30), engine="piper") as call:
        tap = PacketTap(call.receive)
        for round_ in range(3):
            since = len(call.events)
            await call.send({"type": "speak", "text": PARAGRAPH, "id": f"p{round_}"})
            await call.wait_for("speech_started", since=since, id=f"p{round_}")
            await asyncio.sleep(0.8 + 0.013 * round_)  # interrupts at different phases
            interrupted = await call.send({"type": "interrupt"})
            await call.wait_for("speech_finished", since=since, id=f"p{round_}")
            await asyncio.sleep(0.4)
            after = [peak for _, peak in tap.levels_after(interrupted)]
            first_silent = next(i for i, peak in enumerate(after) if peak < SILENT_PEAK)
            assert first_silent <= 2, f"round {round_}: speech went on: {after[:8]}"
            assert tap.audible_after_silence(interrupted) == 0, f"round {round_}: {after[:8]}"


async def test_interrupt_is_silent_where_the_listener_hears_it_within_60ms(
    server: RunningServer,
):
    """Interrupt to silence measured on what the peer played out, over ten interrupts.

    At the listener it is the wait for the next slot (up to 20 ms), the fade (5 ms), the
    encoder's lookahead (6.5 ms) and the path. Before the fix the speech that followed the
    first silent packet ran to ~95 ms. One interrupt in ten may meet a stalled machine
    (other suites share these two cores), so the bar is on the 90th percentile here;
    ``bench/netimpair.py --interrupts`` measures the 95th over more.
    """
    heard: list[float] = []
    async with PeerCall(server.url, silence(40), engine="piper") as call:
        for round_ in range(10):
            since = len(call.events)
            await call.send({"type": "speak", "text": PARAGRAPH, "id": f"q{round_}"})
            await call.wait_for("speech_started", since=since, id=f"q{round_}")
            await asyncio.sleep(0.5 + 0.0071 * round_)
            interrupted = await call.send({"type": "interrupt"})
            await call.wait_for("speech_finished", since=since, id=f"q{round_}")
            await asyncio.sleep(0.3)
            result = silence_after(call.received(), call.recorder.timeline, interrupted)
            assert result is not None
            assert result.audible_after_ms == 0.0
            heard.append(result.to_silence_ms)
    print(f"interrupt to silence at the listener (ms): {heard}")
    assert np.median(heard) <= 45.0, heard
    assert np.percentile(heard, 90) <= 60.0, heard


@pytest.fixture(scope="module")
def slow_registry() -> Iterator[EngineRegistry]:
    loaded = EngineRegistry.load(["echo", "fake-speak"], extra=[FAKE_SPEAK])
    yield loaded
    loaded.close()


SLOW_TEXT = "A slow engine speaks this sentence at about real time, chunk by chunk."


async def slow_utterance(registry: EngineRegistry, delay_ms: float) -> SpeakPipeline:
    """Speak SLOW_TEXT on the fake engine at ``delay_ms`` per 20 ms chunk; the pipeline."""
    async with (
        running_server(registry) as served,
        PeerCall(
            served.url, silence(10), engine="fake-speak", options={"delay_ms": delay_ms}
        ) as call,
    ):
        pipeline = speak_pipeline(served, call)
        # The sentence takes ~5 s at this pace; a loaded machine (the full suite) has taken
        # over 20 s to finish it without the pre-buffer.
        finished, _ = await say(call, SLOW_TEXT, timeout=45)
        assert finished["interrupted"] is False
        return pipeline


async def test_a_slow_engine_does_not_stutter_mid_sentence(slow_registry: EngineRegistry):
    """An engine a little slower than real time (CosyVoice on a busy machine: 22 ms of work
    per 20 ms chunk): the pre-buffer, sized from the measured real-time factor, holds
    playback back until it can run through to the end of the sentence."""
    pipeline = await slow_utterance(slow_registry, delay_ms=22.0)
    stats = pipeline.stats
    assert stats.real_time_factor is not None and stats.real_time_factor > 1.0
    assert stats.prebuffered_ms > 100.0
    assert stats.underruns <= 1, f"{stats.underruns} slots found no speech mid-sentence"


async def test_without_the_pre_buffer_the_same_engine_stutters(
    slow_registry: EngineRegistry, monkeypatch: pytest.MonkeyPatch
):
    """The control for the test above: playback from the first chunk runs dry again and
    again (each time bridged by expansion, and counted)."""
    monkeypatch.setattr(PreBuffer, "needed", lambda self, utterance, last_chunk: 0)
    pipeline = await slow_utterance(slow_registry, delay_ms=22.0)
    assert pipeline.stats.underruns >= 3


async def barge_in_call(
    server: RunningServer, caller: np.ndarray, barge_in: bool, shape: Callable | None = None
) -> list[dict]:
    """Speak a paragraph while the caller's side plays ``caller``; return the events."""
    async with PeerCall(
        server.url, caller, engine="piper", options={"barge_in": barge_in}, shape=shape
    ) as call:
        await call.send({"type": "speak", "text": PARAGRAPH, "id": "talk"})
        await call.wait_for("speech_started", id="talk")
        deadline = time.monotonic() + len(caller) / RTC_RATE
        while time.monotonic() < deadline:
            if any(e["type"] == "speech_finished" for e in call.events):
                break
            await asyncio.sleep(0.1)
        return call.events


async def test_caller_speech_interrupts_only_when_barge_in_is_on(server: RunningServer):
    caller = np.concatenate(
        [silence(2.5), 0.5 * espeak("Wait, stop, I have a question."), silence(3.0)]
    )
    events = await barge_in_call(server, caller, barge_in=True)
    assert any(e["type"] == "barge_in" for e in events)
    finished = [e for e in events if e["type"] == "speech_finished"]
    assert finished and finished[0]["interrupted"] is True

    events = await barge_in_call(server, caller, barge_in=False)
    assert not any(e["type"] == "barge_in" for e in events)
    assert not any(e["type"] == "speech_finished" and e["interrupted"] for e in events)


class Loudspeaker:
    """Plays what the caller hears back into its microphone: a delay line in wall time.

    Each outgoing frame gets the audio that arrived ``delay_s`` earlier, attenuated, as a
    loudspeaker next to a microphone would return it.
    """

    def __init__(self, delay_s: float, gain_db: float) -> None:
        self.delay_s = delay_s
        self.gain = 10 ** (gain_db / 20)
        self.call: PeerCall | None = None

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        if self.call is None or not self.call.recorder.frames:
            return frame
        timeline = self.call.recorder.timeline
        start = int(timeline.index_at(time.monotonic() - self.delay_s))
        heard = self.call.received()[max(start, 0) : max(start, 0) + len(frame)]
        echo = np.zeros_like(frame)
        echo[: len(heard)] = self.gain * heard
        return frame + echo


async def test_own_speech_echoed_back_by_a_loudspeaker_does_not_interrupt(server: RunningServer):
    """The caller's microphone hears the server's speech (60 ms later, -10 dB): no barge-in.

    Guards against running the VAD on the raw microphone, where a caller on a loudspeaker
    would cut the server off with its own voice.
    """
    loudspeaker = Loudspeaker(delay_s=0.06, gain_db=-10)
    async with PeerCall(
        server.url, silence(8), engine="piper", options={"barge_in": True}, shape=loudspeaker
    ) as call:
        loudspeaker.call = call
        await call.send({"type": "speak", "text": PARAGRAPH, "id": "talk"})
        await call.wait_for("speech_started", id="talk")
        await asyncio.sleep(6)
        events = list(call.events)
    assert not any(e["type"] == "barge_in" for e in events)
    assert not any(e["type"] == "speech_finished" and e["interrupted"] for e in events)


async def test_http_routes_and_event_stream_drive_a_whip_session(server: RunningServer):
    """A WHIP client without a data channel speaks and interrupts over HTTP and reads SSE."""
    async with (
        PeerCall(server.url, silence(20), engine="piper", whip=True, data_channel=False) as call,
        aiohttp.ClientSession() as http,
    ):
        base = f"{server.url}sessions/{call.session_id}"
        events: list[dict] = []

        async def read_events() -> None:
            async with http.get(base + "/events") as response:
                assert response.headers["Content-Type"].startswith("text/event-stream")
                async for line in response.content:
                    if line.startswith(b"data: "):
                        events.append(json.loads(line[6:]))

        reader = asyncio.create_task(read_events())
        await asyncio.sleep(0.2)
        async with http.post(base + "/speak", json={"text": "Hello over HTTP."}) as response:
            assert response.status == 202
            first = (await response.json())["id"]
        async with http.post(base + "/speak", json={"text": PARAGRAPH, "id": "para"}) as response:
            assert response.status == 202
            assert (await response.json())["id"] == "para"
        for _ in range(150):
            if any(e["type"] == "speech_started" and e["id"] == "para" for e in events):
                break
            await asyncio.sleep(0.1)
        async with http.post(base + "/interrupt") as response:
            assert response.status == 200
        await asyncio.sleep(0.5)
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    kinds = [(e["type"], e.get("id")) for e in events]
    assert ("speech_started", first) in kinds
    assert ("speech_finished", first) in kinds
    para_finished = [e for e in events if e["type"] == "speech_finished" and e["id"] == "para"]
    assert para_finished and para_finished[0]["interrupted"] is True


async def test_bad_messages_get_specific_errors_and_the_session_keeps_working(
    server: RunningServer,
):
    cases = [
        ("{not json", "invalid_json"),
        (json.dumps([1, 2]), "invalid_message"),
        (json.dumps({"type": "dance"}), "unknown_type"),
        (json.dumps({"text": "no type"}), "invalid_message"),
        (json.dumps({"type": "speak"}), "missing_text"),
        (json.dumps({"type": "speak", "text": "   "}), "missing_text"),
        (json.dumps({"type": "speak", "text": "x" * 5000}), "text_too_long"),
        (json.dumps({"type": "speak", "text": "hi", "id": 7}), "invalid_id"),
        # Found by fuzzing: json.loads raises ValueError, not JSONDecodeError, for a number
        # past Python's 4300-digit limit, and the message went unanswered.
        ('{"type": "speak", "text": "hi", "id": ' + "9" * 5000 + "}", "invalid_json"),
    ]
    async with PeerCall(server.url, silence(20), engine="piper") as call:
        for raw, code in cases:
            since = len(call.events)
            await call.send(raw)
            error = await call.wait_for("error", since=since)
            assert error["error"] == code, raw
            assert error["message"]
        finished, audio = await say(call, "Still here.")
        assert finished["interrupted"] is False
        assert frame_rms(audio).max() > SILENCE_RMS
        async with aiohttp.ClientSession() as http:
            url = f"{server.url}sessions/not-a-session/speak"
            async with http.post(url, json={"text": "hi"}) as response:
                assert response.status == 404
                assert (await response.json())["error"] == "session_not_found"
            url = f"{server.url}sessions/{call.session_id}/speak"
            async with http.post(url, json={"text": ""}) as response:
                assert response.status == 400
                assert (await response.json())["error"] == "missing_text"
            async with http.post(url, data="text", headers={"Content-Type": "text/plain"}) as r:
                assert r.status == 415
            # Found by fuzzing: both were 500s (an unknown charset, a 5000-digit number).
            bogus = {"Content-Type": "application/json; charset=bogus"}
            async with http.post(url, data='{"text": ""}', headers=bogus) as response:
                assert (await response.json())["error"] == "missing_text"
            async with http.post(url, data="9" * 5000, headers=bogus) as response:
                assert (await response.json())["error"] == "invalid_json"


async def test_speech_waiting_to_be_spoken_is_bounded(server: RunningServer):
    """Past ``MAX_QUEUED_UTTERANCES`` a new utterance is refused, and the queue stays as is."""
    silence = np.zeros(RTC_RATE * 5, np.float32)
    async with (
        PeerCall(server.url, silence, engine="piper") as call,
        aiohttp.ClientSession() as http,
    ):
        url = f"{server.url}sessions/{call.session_id}/speak"
        statuses = []
        for index in range(MAX_QUEUED_UTTERANCES + 2):
            async with http.post(url, json={"text": f"Sentence number {index}."}) as response:
                statuses.append(response.status)
                body = await response.json()
        assert statuses.count(202) >= MAX_QUEUED_UTTERANCES  # one may already be speaking
        assert statuses[-1] == 400 and body["error"] == "queue_full"
        pipeline = server.server.sessions.get(call.session_id or "").pipeline
        assert isinstance(pipeline, SpeakPipeline)
        pipeline.interrupt()  # drops the queue: new speech is taken again
        async with http.post(url, json={"text": "Back again."}) as response:
            assert response.status == 202
