"""The page calling over the WebSocket transport (``GET /ws``) instead of WebRTC.

Same browser and fake microphone as tests/browser/test_page.py. The page captures the
microphone with an AudioWorklet, sends 48 kHz PCM16 frames, plays the server's frames from
a jitter buffer and acknowledges them; the session on the server says so (``describe()``'s
``socket`` part), and the page shows the server's events as it does over WebRTC.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from playwright.async_api import Page, WebSocket, expect

from media.engines.registry import EngineRegistry
from tests.browser.test_page import (
    DESKTOP,
    LONG_TEXT,
    MS_TEXT,
    PHONE,
    SHORT_TEXT,
    SILENCE_RMS,
    assert_latency_matches_server,
    chromium,
    mic_wav,  # noqa: F401  (the fixture, shared)
    opened_page,
    pytestmark,  # noqa: F401  (skipped the same way without Chromium)
    shown_ms,
    snapshot,
    start_call,
    stop_call,
    wait_for_output_above_silence,
)
from tests.browser.test_page_auth import TOKEN
from tests.conftest import RunningServer, running_server

# The page's playout buffer aims at 60 ms and never holds more than 200 ms; with its
# acknowledgements (every 60 ms) the server's unplayed audio stays about that small.
MAX_UNPLAYED_MS = 400
# 48 kHz PCM16 is 768 kb/s, and one 8-byte header per 20 ms frame.
PCM_KBPS = 768
SPEECH_ENDED_WITHIN_MS = 1000


class SocketTexts:
    """The JSON messages the page's WebSockets sent and received, as the browser saw them."""

    def __init__(self, page: Page) -> None:
        self.sent: list[dict[str, Any]] = []
        self.received: list[dict[str, Any]] = []
        page.on("websocket", self._watch)

    def _watch(self, ws: WebSocket) -> None:
        ws.on("framesent", lambda payload: self._keep(self.sent, payload))
        ws.on("framereceived", lambda payload: self._keep(self.received, payload))

    @staticmethod
    def _keep(messages: list[dict[str, Any]], payload: str | bytes) -> None:
        if isinstance(payload, str):
            messages.append(json.loads(payload))


def types(messages: list[dict[str, Any]]) -> list[str]:
    return [message["type"] for message in messages]


async def choose_websocket(page: Page) -> None:
    await page.get_by_label("Transport").select_option(label="WebSocket")


def describe_socket_session(server: RunningServer, session_id: str) -> dict[str, Any]:
    """The session as ``GET /sessions/{id}`` describes it, checked to be a WebSocket one (its
    ``socket`` part is absent over WebRTC)."""
    described = server.server.sessions.get(session_id).describe()
    assert "socket" in described, f"not a WebSocket session: {sorted(described)}"
    return described


async def test_echo_over_websocket_plays_the_microphone_back_and_acknowledges_it(
    registry: EngineRegistry,
    mic_wav: Path,  # noqa: F811
):
    """The microphone reaches the server, its echo is heard and shown, acknowledgements keep
    the server's unplayed audio small; Stop ends the session, and so does the server."""
    async with (
        running_server(registry) as server,
        chromium(mic_wav) as browser,
        opened_page(browser, server, DESKTOP) as page,
    ):
        texts = SocketTexts(page)
        await choose_websocket(page)
        state = await start_call(page, "echo")
        assert (state["engine"], state["transport"]) == ("echo", "websocket")
        hello = texts.sent[0]
        assert (hello["type"], hello["engine"]) == ("hello", "echo")
        assert hello["codec"] == {"name": "pcm16", "rate": 48000}
        await expect(page.locator("#log li", has_text="start")).to_contain_text("over WebSocket")
        await wait_for_output_above_silence(page)
        assert (await snapshot(page))["input"]["maxRms"] > SILENCE_RMS

        # The Live panel: the server's latency as over WebRTC, the page's own playout buffer
        # and the bitrate of 48 kHz PCM16 both ways (a second of figures or more by now).
        await assert_latency_matches_server(page, server)
        await expect(page.locator("#latency-buffer")).to_have_text(MS_TEXT)
        buffer_ms = await shown_ms(page, "#latency-buffer")
        assert buffer_ms is not None and buffer_ms <= 200
        for stat in ("#stat-bitrate-in", "#stat-bitrate-out"):
            await expect(page.locator(stat)).to_have_text(re.compile(r"\d+ kb/s"))
            kbps = int((await page.locator(stat).text_content() or "").split()[0])
            assert abs(kbps - PCM_KBPS) < 0.1 * PCM_KBPS, (stat, kbps)

        described = describe_socket_session(server, state["sessionId"])
        socket, receive = described["socket"], described["receive"]
        assert socket["codec"] == {"name": "pcm16", "rate": 48000}
        assert socket["played_seq"] is not None, "the page never acknowledged a frame"
        assert socket["unplayed_ms"] <= MAX_UNPLAYED_MS
        assert socket["frames_dropped"] == 0
        assert receive["frames"] > 50, "the microphone's frames did not reach the server"
        assert (receive["skipped"], receive["undecodable"]) == (0, 0)
        # Acknowledgements every few frames, in order, the last one what the server counts.
        acks = [message["seq"] for message in texts.sent if message["type"] == "ack"]
        assert len(acks) > 10 and acks == sorted(acks)
        # (the server and the browser's report see each ack at slightly different moments)
        assert abs(socket["played_seq"] - acks[-1]) <= 6
        await stop_call(page, server)

        state = await start_call(page, "echo")
        await server.server.sessions.close_session(state["sessionId"])
        await expect(page.locator("#message")).to_contain_text("The server ended the call")
        await expect(page.get_by_role("button", name="Start")).to_be_enabled()
        assert (await snapshot(page))["connectionState"] == "idle"


async def test_piper_speaks_over_websocket_and_can_be_interrupted(
    registry: EngineRegistry,
    mic_wav: Path,  # noqa: F811
):
    """Typed text is spoken and heard; Interrupt stops it (the server's ``clear`` empties the
    page's buffer) and the log shows the interrupted ``speech_finished``."""
    async with (
        running_server(registry) as server,
        chromium(mic_wav) as browser,
        opened_page(browser, server, PHONE) as page,
    ):
        await page.get_by_label("Engine").select_option("piper")
        await page.get_by_label("barge in").uncheck()
        texts = SocketTexts(page)
        await choose_websocket(page)
        state = await start_call(page)
        assert describe_socket_session(server, state["sessionId"])["kind"] == "speak"
        say, log = page.get_by_role("button", name="Say"), page.locator("#log")
        await expect(say).to_be_enabled()

        await page.get_by_label("Text to say").fill(SHORT_TEXT)
        await page.get_by_label("Text to say").press("Enter")
        finished = log.locator("li", has_text="speech_finished")
        await expect(finished).to_have_count(1, timeout=20_000)
        await expect(finished).not_to_contain_text("interrupted")
        await wait_for_output_above_silence(page, timeout_ms=1000)

        await page.get_by_label("Text to say").fill(LONG_TEXT)
        await say.click()
        await expect(log.locator("li", has_text="speech_started")).to_have_count(2)
        await expect(page.locator("#speech-state")).to_have_text("speaking", timeout=10_000)
        await page.wait_for_function(
            "(floor) => window.cosyrtc.snapshot().output.rms > floor", arg=SILENCE_RMS
        )
        await page.get_by_role("button", name="Interrupt").click()
        await expect(finished.nth(1)).to_contain_text("interrupted", timeout=5_000)
        await expect(page.locator("#speech-state")).to_have_text("silent")
        received = types(texts.received)
        assert "clear" in received, "no clear came with the interrupt"
        interrupted = next(i for i, m in enumerate(texts.received) if m.get("interrupted") is True)
        assert received.index("clear") < interrupted
        assert "interrupt" in types(texts.sent)
        await page.wait_for_function(
            "(floor) => window.cosyrtc.snapshot().output.rms < floor",
            arg=SILENCE_RMS,
            timeout=SPEECH_ENDED_WITHIN_MS,
        )
        await stop_call(page, server)


async def test_websocket_carries_the_access_token_as_a_subprotocol(
    registry: EngineRegistry,
    mic_wav: Path,  # noqa: F811
):
    """A browser cannot put a header on a WebSocket: the page offers the token as a second
    subprotocol entry, the server takes it as the bearer token and answers ``cosyrtc``."""
    async with (
        running_server(registry, auth_token=TOKEN) as server,
        chromium(mic_wav) as browser,
    ):
        page = await browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        await page.goto(server.url)
        await page.get_by_label("Access token").fill(TOKEN)
        await page.get_by_role("button", name="Use token").click()
        await choose_websocket(page)
        state = await start_call(page, "echo")
        assert describe_socket_session(server, state["sessionId"])["socket"]["codec"]["name"]
        await wait_for_output_above_silence(page)
        await stop_call(page, server)
        assert not errors, f"script errors on the page: {errors}"
