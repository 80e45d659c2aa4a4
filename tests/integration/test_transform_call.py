"""Real calls over loopback: an aiortc peer streams speech and records what comes back."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from media.audio.frames import FRAME_SAMPLES, RTC_RATE
from peer.cli import CallResult, PeerOptions, call
from peer.probe import align
from peer.speech import SpeechFixture
from tests.conftest import LOOPBACK, RunningServer
from tests.resources import Resources, settled

pytestmark = pytest.mark.usefixtures("collected_first")


async def make_call(
    server: RunningServer, wav: Path, tmp_path: Path, engine: str, **kwargs: object
) -> CallResult:
    opts = PeerOptions(
        url=server.url,
        input=wav,
        output=tmp_path / f"{engine}-out.wav",
        engine=engine,
        ice_hosts=(LOOPBACK,),
        **kwargs,  # type: ignore[arg-type]
    )
    result = await call(opts)
    assert result.report.ok, result.report.error
    return result


SEGMENT = RTC_RATE  # realign every second
SEARCH = RTC_RATE // 4
STRETCHED_FLOOR = 0.5  # one second the output cushion stretched around a stall


def align_segments(
    reference: np.ndarray, received: np.ndarray
) -> tuple[np.ndarray, list[tuple[int, float]]]:
    """``received`` cut to line up with ``reference`` one second at a time.

    A call may drop a frame under load (the server keeps latency bounded rather than play
    late audio), which shifts everything after it; aligning the whole signal at once would
    then measure the drop, not what the engine did to the audio. Each segment is aligned on
    its own, near the previous segment's lag. Returns the aligned signal (zeros where
    nothing lines up) and each segment's (lag, correlation); silent segments keep the lag.
    """
    global_lag, _ = align(reference, received, max_lag=RTC_RATE // 2)
    aligned = np.zeros_like(reference)
    lag, found = global_lag, []
    for start in range(0, len(reference) - SEGMENT + 1, SEGMENT):
        piece = reference[start : start + SEGMENT]
        lo = max(0, start + lag - SEARCH)
        window = received[lo : start + lag + SEGMENT + SEARCH]
        if np.sqrt(np.mean(piece**2)) > 1e-3 and len(window) > SEGMENT:
            shift, corr = align(piece, window, max_lag=len(window), min_overlap=SEGMENT)
            lag = lo + shift - start
            found.append((lag, corr))
        begin = start + lag
        if begin >= 0 and begin + SEGMENT <= len(received):
            aligned[start : start + SEGMENT] = received[begin : begin + SEGMENT]
    return aligned, found


def assert_speech_came_back(segments: list[tuple[int, float]], median: float, floor: float) -> None:
    """Each second's correlation with what was sent: ``median`` overall, ``floor`` per second.

    One second may fall below ``floor`` (not below ``STRETCHED_FLOOR``): when the machine
    stalls the caller and the server together, the server's output cushion stretches the
    audio around the late frame and sheds the stretch a moment later. That keeps the call's
    timeline (no drop, no hole) but not the sample-exact waveform of that second.
    """
    correlations = sorted(corr for _, corr in segments)
    assert np.median(correlations) >= median, f"normalised correlation per second: {segments}"
    assert correlations[0] >= STRETCHED_FLOOR, segments
    assert correlations[1] >= floor, f"more than one second changed: {segments}"


def frame_levels_db(samples: np.ndarray) -> np.ndarray:
    frames = len(samples) // FRAME_SAMPLES
    power = np.mean(samples[: frames * FRAME_SAMPLES].reshape(frames, FRAME_SAMPLES) ** 2, axis=1)
    return 10 * np.log10(power + 1e-12)


async def test_echo_returns_what_was_sent(server: RunningServer, speech_wav: Path, tmp_path: Path):
    result = await make_call(server, speech_wav, tmp_path, "echo")
    _, segments = align_segments(result.sent, result.received)
    # Opus "voip" high-passes the voice on both legs, which caps a low voice near 0.9.
    assert_speech_came_back(segments, median=0.9, floor=0.8)
    assert len({lag for lag, _ in segments}) <= 3, f"audio was dropped repeatedly: {segments}"
    assert result.report.gaps == 0
    assert result.report.frames_received >= 0.9 * result.report.frames_sent
    assert result.report.rtt_ms_p50 is not None and result.report.rtt_ms_p50 < 400


async def test_denoise_removes_noise_in_pauses_and_keeps_speech(
    server: RunningServer, speech: SpeechFixture, noisy_speech_wav: Path, tmp_path: Path
):
    """Speech plus white noise at 5 dB SNR: pauses lose >= 20 dB, speech stays within 6 dB."""
    result = await make_call(server, noisy_speech_wav, tmp_path, "denoise")
    assert_denoised(speech, result)


def assert_denoised(speech: SpeechFixture, result: CallResult) -> None:
    """What came back resembles the clean speech; pauses lose >= 20 dB of the noise that was
    sent, speech keeps its level within 6 dB."""
    out, segments = align_segments(speech.clean, result.received)
    corr = float(np.median([c for _, c in segments]))
    assert corr > 0.5, f"denoised output does not resemble the speech: {segments}"
    n = len(out) // FRAME_SAMPLES
    clean_db = frame_levels_db(speech.clean[: n * FRAME_SAMPLES])
    noisy_db = frame_levels_db(result.sent[: n * FRAME_SAMPLES])
    out_db = frame_levels_db(out)
    mask = speech.speech_mask[: n * FRAME_SAMPLES].reshape(n, FRAME_SAMPLES)
    # Pauses: frames fully outside speech, skipping the first second while the model settles.
    pause = ~mask.any(axis=1)
    pause[: RTC_RATE // FRAME_SAMPLES] = False
    speech_frames = mask.all(axis=1) & (clean_db > clean_db.max() - 25)
    reduction = np.median(noisy_db[pause]) - np.median(out_db[pause])
    # Active speech level: power over the voiced frames, as a level meter would integrate it.
    speech_change = 10 * np.log10(
        np.sum(10 ** (out_db[speech_frames] / 10)) / np.sum(10 ** (clean_db[speech_frames] / 10))
    )
    print(f"noise floor in pauses -{reduction:.1f} dB, speech level {speech_change:+.1f} dB")
    assert reduction >= 20, f"noise floor in pauses fell by only {reduction:.1f} dB"
    assert abs(speech_change) <= 6, f"speech level changed by {speech_change:.1f} dB"


async def test_whip_call_and_delete_release_everything(
    server: RunningServer, speech_wav: Path, tmp_path: Path
):
    """A WHIP call ends with DELETE on its Location; nothing of the session is left behind."""
    before = await Resources.count()

    result = await make_call(server, speech_wav, tmp_path, "denoise", whip=True, tail=0.5)
    assert result.report.frames_received > 0
    assert len(server.server.sessions) == 0
    assert (await settled(before)).within(before)


@pytest.mark.parametrize("engine", ["echo", "denoise"])
async def test_session_that_never_connects_is_closed_after_ice_timeout(registry, engine: str):
    """An offer whose peer never runs ICE must not hold a session slot forever."""
    from aiortc import RTCPeerConnection

    from media.rtc.ice import rtc_configuration
    from tests.conftest import running_server

    async with running_server(registry, ice_timeout=1.0) as running:
        pc = RTCPeerConnection(rtc_configuration([]))
        pc.addTransceiver("audio", direction="sendrecv")
        await pc.setLocalDescription(await pc.createOffer())
        sdp = pc.localDescription.sdp
        await pc.close()  # the peer vanishes right after offering
        import aiohttp

        async with aiohttp.ClientSession() as http:
            payload = {"sdp": sdp, "type": "offer", "engine": engine}
            async with http.post(running.url + "offer", json=payload) as response:
                assert response.status == 200
        assert len(running.server.sessions) == 1
        for _ in range(40):
            if len(running.server.sessions) == 0:
                break
            await asyncio.sleep(0.1)
        assert len(running.server.sessions) == 0


async def test_peer_also_calls_a_stock_aiortc_examples_server(speech_wav: Path, tmp_path: Path):
    """The headless peer measures a plain aiortc server too (no session id, no DELETE)."""
    from aiohttp import web

    from bench.stock_server import create_app

    runner = web.AppRunner(create_app())
    await runner.setup()
    site = web.TCPSite(runner, LOOPBACK, 0)
    await site.start()
    try:
        url = f"http://{LOOPBACK}:{runner.addresses[0][1]}/"
        opts = PeerOptions(
            url=url,
            input=speech_wav,
            output=tmp_path / "stock.wav",
            engine=None,
            ice_hosts=(LOOPBACK,),
            rtt="chirp",
        )
        result = await call(opts)
    finally:
        await runner.cleanup()
    assert result.report.ok, result.report.error
    assert result.report.session_id is None
    assert result.report.rtt_ms_p50 is not None
    # Aligned a second at a time: stock aiortc's jitter buffer shifts the rest of the call
    # when a stall of this machine makes it drop or wait (whole-call alignment: 0.78 once).
    _, segments = align_segments(result.sent, result.received)
    assert np.median([corr for _, corr in segments]) >= 0.8, segments
