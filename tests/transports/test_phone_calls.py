"""Phone calls: the test plays the phone network, speaking Twilio's published protocol."""

from __future__ import annotations

import asyncio
import base64
import urllib.parse
from collections.abc import AsyncIterator

import aiohttp
import numpy as np
import pytest

from media.audio import mulaw
from media.audio.resample import StreamResampler
from media.engines.registry import EngineRegistry
from peer.speech import espeak
from signaling.twilio import signature, stream_token
from tests.conftest import RunningServer, running_server
from tests.integration.test_speak_call import PARAGRAPH
from tests.transports.phone import PhoneStream

AUTH_TOKEN = "twilio-account-auth-token"
PUBLIC = "https://voice.example.com"
RATE = 8_000


@pytest.fixture
async def phone_server(registry: EngineRegistry) -> AsyncIterator[RunningServer]:
    async with running_server(registry, twilio_auth_token=AUTH_TOKEN, public_url=PUBLIC) as s:
        yield s


def media_url(server: RunningServer) -> str:
    return "ws" + server.url[4:] + "twilio/media"


def tone(seconds: float, hz: float = 440.0, level: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (level * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def dominant_hz(samples: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.argmax(spectrum) * RATE / len(samples))


async def test_a_tone_comes_back_through_echo_at_8khz_in_mu_law(phone_server: RunningServer):
    sent = tone(3.0)
    params = {"call_sid": "CA1", "token": stream_token(AUTH_TOKEN, "CA1"), "engine": "echo"}
    async with PhoneStream(media_url(phone_server), params, sent) as phone:
        await asyncio.sleep(3.5)
    assert all(event["streamSid"] == phone.sid for event in phone.messages)
    payloads = [payload for _, payload in phone.received]
    assert payloads and all(len(p) == 160 for p in payloads)  # 20 ms of 8 kHz mu-law each
    heard = phone.audio()
    loud = heard[np.abs(heard) > 0.05]
    assert len(loud) > 2 * RATE, "the tone did not come back for most of the call"
    middle = heard[len(heard) // 2 - RATE // 2 : len(heard) // 2 + RATE // 2]
    assert abs(dominant_hz(middle) - 440) < 5
    level_db = 20 * np.log10(np.sqrt(np.mean(middle**2)) / np.sqrt(np.mean(sent**2)))
    assert abs(level_db) < 1.5, level_db
    # Correct mu-law: re-encoding what was decoded gives the same bytes back.
    assert mulaw.encode(mulaw.decode(payloads[50])) == payloads[50]


async def test_barge_in_on_a_phone_call_sends_clear_and_marks_report_the_position(
    phone_server: RunningServer,
):
    speech = espeak("Wait, stop, I have a question.")
    caller = np.concatenate(
        [np.zeros(int(2.5 * RATE), np.float32), 0.5 * StreamResampler(48_000, RATE).process(speech)]
    )
    params = {
        "call_sid": "CA2",
        "token": stream_token(AUTH_TOKEN, "CA2"),
        "engine": "piper",
        "options": '{"barge_in": true}',
        "say": PARAGRAPH,
    }
    async with PhoneStream(media_url(phone_server), params, caller) as phone:
        for _ in range(40):
            await asyncio.sleep(0.1)
            if len(phone.received) > 50:
                break
        (session,) = phone_server.server.sessions.live_sessions()
        await asyncio.sleep(1.0)
        socket = session.describe()["socket"]
        played_by_phone = len(phone.marks_echoed) * 100  # one mark per 100 ms played
        assert socket["played_ms"] > 500, socket
        assert abs(socket["played_ms"] - played_by_phone) <= 300, (socket, played_by_phone)
        for _ in range(60):
            await asyncio.sleep(0.1)
            if phone.clears:
                break
        assert phone.clears, "caller speech did not barge in"
        cleared = phone.clears[0]
        await asyncio.sleep(0.6)
        after = [payload for at, payload in phone.received if at > cleared + 0.1]
        levels = [round(float(np.abs(mulaw.decode(p)).max()), 3) for p in after]
        assert all(level < 0.01 for level in levels), levels
        # Marks of audio dropped by the clear come back at once and do not count as played.
        assert session.describe()["socket"]["played_ms"] <= 100 * len(phone.marks_echoed)
        listener = session.events.subscribe()
        await phone.send_dtmf("5")
        async with asyncio.timeout(2):
            while (event := await listener.get()) is not None and event["type"] != "dtmf":
                pass
        assert event == {"type": "dtmf", "digit": "5"}
    async with asyncio.timeout(5):
        await session.closed.wait()
    assert session.close_reason == "connection_closed"


async def test_a_stream_without_the_calls_token_is_refused(phone_server: RunningServer):
    params = {"call_sid": "CA3", "token": "forged", "engine": "echo"}
    async with PhoneStream(media_url(phone_server), params, tone(1.0)) as phone:
        await asyncio.sleep(0.5)
        assert phone.ws is not None and phone.ws.closed
        assert phone.ws.close_code == 1008
    assert len(phone_server.server.sessions) == 0


async def test_the_voice_webhook_answers_twiml_only_to_a_signed_request(
    phone_server: RunningServer,
):
    form = {"CallSid": "CA4", "AccountSid": "AC" + "1" * 32, "From": "+15550100"}
    query = "?engine=piper&say=Hello%20there"
    url = phone_server.url + "twilio/voice" + query
    signed = signature(AUTH_TOKEN, PUBLIC + "/twilio/voice" + query, form)
    body = urllib.parse.urlencode(form)
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    async with aiohttp.ClientSession() as http:
        async with http.post(url, data=body, headers=headers) as response:
            assert response.status == 403
            assert (await response.json())["error"] == "invalid_signature"
        bad = {**headers, "X-Twilio-Signature": signed[:-2] + "AA"}
        async with http.post(url, data=body, headers=bad) as response:
            assert response.status == 403
        good = {**headers, "X-Twilio-Signature": signed}
        async with http.post(url, data=body, headers=good) as response:
            assert response.status == 200
            assert response.content_type == "text/xml"
            twiml = await response.text()
    assert '<Stream url="wss://voice.example.com/twilio/media">' in twiml
    assert f'<Parameter name="token" value="{stream_token(AUTH_TOKEN, "CA4")}"/>' in twiml
    assert '<Parameter name="engine" value="piper"/>' in twiml
    assert '<Parameter name="say" value="Hello there"/>' in twiml


async def test_phone_routes_are_off_without_a_twilio_token(server: RunningServer):
    async with (
        aiohttp.ClientSession() as http,
        http.post(server.url + "twilio/voice", data="CallSid=CA5") as response,
    ):
        assert response.status == 404
        assert (await response.json())["error"] == "twilio_not_configured"


def test_payloads_are_base64_mu_law():
    assert base64.b64decode(base64.b64encode(mulaw.encode(tone(0.02)))) == mulaw.encode(tone(0.02))
