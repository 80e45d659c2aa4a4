"""Sessions over the WebSocket transport (``GET /ws``), end to end over loopback.

The same checks as the WebRTC call tests (tests/integration/test_transform_call.py), with
the headless peer calling over ``/ws`` instead.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from media.audio.frames import FRAME_SAMPLES, RTC_RATE
from media.audio.wav import read_wav
from media.engines.registry import EngineRegistry
from media.transports.socket_frames import pack
from media.transports.socket_output import MAX_WAITING_MS
from peer.cli import CallResult, PeerOptions, call
from peer.probe import ChirpInserter, marker_rtts, silence_after
from peer.socket_call import SocketCall
from peer.speech import SpeechFixture
from server.sessions.session import Session
from tests.conftest import RunningServer, running_server
from tests.fuzz.harness import rss_bytes
from tests.integration.test_speak_call import PARAGRAPH, SILENCE_RMS, frame_rms, silence
from tests.integration.test_transform_call import (
    align_segments,
    assert_denoised,
    assert_speech_came_back,
)
from tests.server.test_workers import two_workers

pytestmark = pytest.mark.usefixtures("collected_first")


async def socket_call(
    server: RunningServer, wav: Path, tmp_path: Path, engine: str, **kwargs: object
) -> CallResult:
    opts = PeerOptions(
        url=server.url,
        input=wav,
        output=tmp_path / f"{engine}-ws-out.wav",
        engine=engine,
        ws=True,
        **kwargs,  # type: ignore[arg-type]
    )
    result = await call(opts)
    assert result.report.ok, result.report.error
    return result


async def test_echo_over_a_socket_returns_what_was_sent(
    server: RunningServer, speech_wav: Path, tmp_path: Path
):
    result = await socket_call(server, speech_wav, tmp_path, "echo")
    _, segments = align_segments(result.sent, result.received)
    # PCM both ways: no codec stands between the two signals.
    assert_speech_came_back(segments, median=0.95, floor=0.9)
    assert len({lag for lag, _ in segments}) <= 2, f"audio was dropped: {segments}"
    assert result.report.gaps == 0
    assert result.report.frames_received >= 0.9 * result.report.frames_sent
    assert result.report.rtt_ms_p50 is not None and result.report.rtt_ms_p50 < 100
    assert len(server.server.sessions) == 0  # the peer hung up: the session ended


async def test_opus_over_a_socket_carries_speech_both_ways(server: RunningServer, speech_wav: Path):
    audio = read_wav(speech_wav, RTC_RATE)[: 6 * RTC_RATE]
    async with SocketCall(server.url, audio, engine="echo", codec={"name": "opus"}) as call:
        assert call.ready is not None and call.ready["codec"] == {"name": "opus", "rate": 48000}
        await call.source.finished.wait()
        await asyncio.sleep(0.5)
    _, segments = align_segments(call.sent(), call.received())
    # Opus twice (the client's encode, the server's "voip" one, which high-passes the voice),
    # as over WebRTC: correlation near 0.9, where PCM gives ~1.
    assert_speech_came_back(segments, median=0.85, floor=0.8)
    assert len({lag for lag, _ in segments}) <= 2, f"audio was dropped: {segments}"


async def test_denoise_over_a_socket_removes_noise_and_keeps_speech(
    server: RunningServer, speech: SpeechFixture, noisy_speech_wav: Path, tmp_path: Path
):
    """The WebRTC denoise check, over ``/ws``: pauses lose >= 20 dB, speech within 6 dB."""
    result = await socket_call(server, noisy_speech_wav, tmp_path, "denoise")
    assert_denoised(speech, result)


def session_of(server: RunningServer, call: SocketCall) -> Session:
    assert call.session_id is not None
    return server.server.sessions.get(call.session_id)


async def test_speak_over_a_socket_with_interrupt_clears_and_reports_the_played_position(
    server: RunningServer,
):
    async with SocketCall(server.url, silence(20), engine="piper") as call:
        since = len(call.events)
        await call.send({"type": "speak", "text": PARAGRAPH, "id": "long"})
        await call.wait_for("speech_started", since=since, id="long")
        await asyncio.sleep(1.0)
        interrupted = await call.send({"type": "interrupt"})
        finished = await call.wait_for("speech_finished", since=since, id="long")
        await asyncio.sleep(0.5)
        kinds = [event["type"] for event in call.events[since:]]
        # The client is told to drop what it holds before it hears that speech ended.
        assert kinds.index("clear") < kinds.index("speech_finished"), kinds
        assert finished["interrupted"] is True
        assert 500 <= finished["position_ms"] <= 3000
        # What the client acknowledged as played: behind what was sent, by its buffer only.
        assert finished["played_ms"] > 0
        heard = silence_after(call.received(), call.recorder.timeline, interrupted)
        assert heard is not None and heard.audible_after_ms == 0.0
        assert heard.to_silence_ms <= 80, heard
        tail = call.received()[-int(0.3 * RTC_RATE) :]
        assert frame_rms(tail).max() <= SILENCE_RMS


async def test_a_stalled_client_costs_bounded_memory_and_nobody_else_latency(
    server: RunningServer, speech_wav: Path
):
    """One client stops reading for 10 s while another talks: the stalled one's backlog is
    dropped (counted) at a bound, and the other's round trip does not move."""
    audio = read_wav(speech_wav, RTC_RATE)
    talker_audio = np.tile(audio, 4)[: 16 * RTC_RATE]
    markers = ChirpInserter()
    async with (
        SocketCall(server.url, silence(20), engine="piper") as stalled,
        SocketCall(server.url, talker_audio, engine="echo", shape=markers.process) as talker,
    ):
        await stalled.send({"type": "speak", "text": PARAGRAPH + " " + PARAGRAPH})
        await stalled.wait_for("speech_started")
        await asyncio.sleep(1.0)
        rss_before = rss_bytes()
        stalled.stall()
        await asyncio.sleep(10.0)
        rss_after = rss_bytes()
        described = session_of(server, stalled).describe()["socket"]
        stalled.stall(False)
        await talker.source.finished.wait()
        await asyncio.sleep(0.5)
    assert described["waiting_ms"] <= MAX_WAITING_MS
    assert described["unplayed_ms"] <= described["credit_ms"]
    assert described["frames_dropped"] > 0, described
    assert rss_after - rss_before < 30 * 2**20
    rtts = marker_rtts(markers, talker.source.timeline, talker.received(), talker.recorder.timeline)
    assert len(rtts) >= 10, rtts
    assert np.median(rtts) < 80, f"the talker's round trip grew: {rtts}"
    assert max(rtts) < 200, rtts


async def test_input_faster_than_real_time_is_dropped_and_told(server: RunningServer):
    """3x real time for 3 s: ``backpressure`` comes back, the oldest input is dropped and
    counted, and a burst marked at the end comes back within the bounded backlog."""
    async with SocketCall(server.url, silence(1), engine="echo") as call:
        call.source.paused = True
        assert call.ws is not None
        tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(FRAME_SAMPLES) / RTC_RATE)).astype(
            np.float32
        )
        seq = 10_000
        for _ in range(150):  # 3 s of audio
            for _ in range(3):
                await call.ws.send_bytes(pack(seq, seq * FRAME_SAMPLES, pcm16(tone * 0.1)))
                seq += 1
            await asyncio.sleep(0.02)
        # The backlog holds at most 200 ms: a loud burst sent now is heard within ~300 ms.
        marked = time.monotonic()
        for _ in range(5):
            await call.ws.send_bytes(pack(seq, seq * FRAME_SAMPLES, pcm16(tone)))
            seq += 1
        await asyncio.sleep(0.8)
        stats = session_of(server, call).pipeline.receive_stats
        pressure = [e for e in call.events if e["type"] == "backpressure"]
    assert pressure, "no backpressure message"
    assert pressure[0]["reason"] == "faster_than_real_time"
    assert max(e["queued_ms"] for e in pressure) <= 400
    assert stats.over_real_time > 100  # about two thirds of 450 frames
    loud_at = first_loud_after(call, marked, level=0.2)
    assert loud_at is not None and loud_at - marked < 0.35, loud_at and loud_at - marked


def pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


def first_loud_after(call: SocketCall, since: float, level: float) -> float | None:
    """When the first frame louder than ``level`` was received after ``since``."""
    received = call.received()
    timeline = call.recorder.timeline
    start = int(max(0, timeline.index_at(since)))
    for begin in range(start, len(received) - FRAME_SAMPLES, FRAME_SAMPLES // 4):
        if np.abs(received[begin : begin + FRAME_SAMPLES]).max() >= level:
            return timeline.time_of(begin)
    return None


async def test_resume_after_the_socket_is_cut_mid_sentence_loses_and_repeats_nothing_played(
    server: RunningServer,
):
    """Cut mid-paragraph, resume with the last frame played: the frames continue where the
    client's acknowledgement left off; only the unacknowledged ones come again."""
    first = SocketCall(server.url, silence(30), engine="piper")
    await first.connect()
    await first.send({"type": "speak", "text": PARAGRAPH, "id": "para"})
    await first.wait_for("speech_started", id="para")
    await asyncio.sleep(1.5)
    acknowledged = first.played_seq  # the last ack this client sent covers up to here
    resume = first.resume_info()
    await first.cut()
    await asyncio.sleep(0.3)
    session = server.server.sessions.get(resume["session_id"])
    assert session.connection is None  # detached, not ended
    async with SocketCall(server.url, silence(30), engine="piper", resume=resume) as second:
        assert second.ready is not None and second.ready["resumed"] is True
        await second.wait_for("speech_finished", id="para", timeout=30)
    received_before = list(first.seqs)
    after = second.seqs
    assert acknowledged is not None
    assert after[0] == second.ready["next_seq"] <= acknowledged + 1
    # Nothing lost: the second socket starts at or before the first frame not received.
    assert after[0] <= received_before[-1] + 1
    # Nothing repeated beyond the unacknowledged part.
    repeated = set(received_before) & set(after)
    assert all(seq > acknowledged - 1 for seq in repeated), (acknowledged, sorted(repeated)[:5])
    assert after == list(range(after[0], after[0] + len(after)))
    speech = frame_rms(second.received())
    assert (speech > SILENCE_RMS).sum() > 20  # the rest of the paragraph came


async def test_sockets_through_the_front_reach_a_worker_and_resume_on_its_owner():
    """Behind a front with two workers: a socket session runs on a worker, comes back to it
    on resume (the id names the worker), and a hang-up ends it there."""
    with two_workers(max_sessions=4) as front:
        tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(20 * RTC_RATE) / RTC_RATE)).astype(
            np.float32
        )
        first = SocketCall(front.url, tone, engine="echo")
        await first.connect()
        await asyncio.sleep(1.5)
        assert first.session_id is not None and first.session_id[:2] in ("w0", "w1")
        heard_first = frame_rms(first.received())
        assert (heard_first > 0.1).sum() > 25, "the tone did not come back through the front"
        resume = first.resume_info()
        await first.cut()
        await asyncio.sleep(0.5)
        async with SocketCall(front.url, tone, engine="echo", resume=resume) as second:
            assert second.ready is not None and second.ready["resumed"] is True
            assert second.session_id == first.session_id
            await asyncio.sleep(1.0)
            assert (frame_rms(second.received()) > 0.1).sum() > 25
            assert await second.end() == 200
        async with aiohttp.ClientSession() as http:
            url = f"{front.url}sessions/{first.session_id}"
            # Hung up: the session ends on its worker, a moment after the socket closed.
            assert await status_within(http, url, 404, timeout=5.0) == 404


async def status_within(http: aiohttp.ClientSession, url: str, wanted: int, timeout: float) -> int:
    """GET ``url`` until it answers ``wanted`` or ``timeout`` passes; the last status."""
    deadline = time.monotonic() + timeout
    while True:
        async with http.get(url) as response:
            status = response.status
        if status == wanted or time.monotonic() >= deadline:
            return status
        await asyncio.sleep(0.1)


async def test_the_token_rides_in_a_header_or_a_subprotocol_and_is_never_echoed(
    registry: EngineRegistry,
):
    async with (
        running_server(registry, auth_token="s3cret-token") as served,
        aiohttp.ClientSession() as http,
    ):
        url = "ws" + served.url[4:] + "ws"
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(url, protocols=("cosyrtc",))
        assert refused.value.status == 401
        with pytest.raises(aiohttp.WSServerHandshakeError) as wrong:
            await http.ws_connect(url, protocols=("cosyrtc", "cosyrtc.bearer.wrong"))
        assert wrong.value.status == 403
        async with http.ws_connect(url, protocols=("cosyrtc", "cosyrtc.bearer.s3cret-token")) as ws:
            assert ws.protocol == "cosyrtc"
            await ws.send_str('{"type": "hello", "engine": "echo"}')
            ready = await ws.receive_json()
            assert ready["type"] == "ready", ready
            await ws.send_str('{"type": "bye"}')
        headers = {"Authorization": "Bearer s3cret-token"}
        async with http.ws_connect(url, protocols=("cosyrtc",), headers=headers) as ws:
            await ws.send_str('{"type": "hello", "engine": "echo"}')
            assert (await ws.receive_json())["type"] == "ready"
