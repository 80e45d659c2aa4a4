"""The page calling over the WebSocket transport (``GET /ws``) instead of WebRTC.

Same browser and fake microphone as tests/browser/test_page.py. The page captures the
microphone with an AudioWorklet, sends 48 kHz PCM16 frames, plays the server's frames from
a jitter buffer and acknowledges them; the session on the server says so (``describe()``'s
``socket`` part), and the page shows the server's events as it does over WebRTC. A socket
that drops is resumed on a new one, as a WebRTC call is (tests/browser/test_page_resume.py).
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

from playwright.async_api import Page, WebSocket, WebSocketRoute, expect

from media.engines.registry import EngineRegistry
from media.transports.socket_connection import SocketConnection
from server.http.socket_routes import WebSocketLink
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
from tests.browser.test_page_resume import (
    NO_RETRY_WAIT_MS,
    assert_caller_audio_flows,
    next_event,
)
from tests.conftest import RunningServer, running_server

# The page's playout buffer aims at 60 ms and never holds more than 200 ms; with its
# acknowledgements (every 60 ms) the server's unplayed audio stays about that small.
MAX_UNPLAYED_MS = 400
# 48 kHz PCM16 is 768 kb/s, and one 8-byte header per 20 ms frame.
PCM_KBPS = 768
SPEECH_ENDED_WITHIN_MS = 1000
# The page hears of a cut socket at once and resumes straight away (its first attempt does
# not wait); measured 0.01-0.04 s.
RESUMED_WITHIN_S = 5.0
# Frames the page played after the resume, by the server's count of its acknowledgements.
PLAYED_AFTER_RESUME_FRAMES = 25
# How long the page waits on a socket that carries nothing before it replaces it
# (socket-call.js), checked once a second.
QUIET_LIMIT_S = 5.0
QUIET_CHECK_S = 1.0


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


def cut_socket(server: RunningServer, session_id: str) -> None:
    """Drop the session's socket as a failing network does: its TCP connection goes, with
    no closing handshake either way (the page sees close code 1006).

    Nothing public reaches a socket's transport: this goes through the session's
    ``SocketConnection``, its link (``server.http.socket_routes.WebSocketLink``), the aiohttp
    ``WebSocketResponse`` it writes to, and that response's request.
    """
    connection = server.server.sessions.get(session_id).connection
    assert isinstance(connection, SocketConnection), f"not a socket: {connection!r}"
    link = connection._link
    assert isinstance(link, WebSocketLink), f"not an aiohttp socket: {link!r}"
    request = link._ws._req
    assert request is not None and request.transport is not None, "nothing left to cut"
    request.transport.abort()


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


async def test_a_cut_socket_is_resumed_and_its_audio_comes_back(
    registry: EngineRegistry,
    mic_wav: Path,  # noqa: F811
):
    """The socket dies without a close: the page reconnects at once with the last ready's
    resume token and the last frame it played, continues the same session on a new socket
    (nothing played twice, nothing counted lost), audio flows both ways again, and Stop
    still ends the session."""
    async with (
        running_server(registry) as server,
        chromium(mic_wav) as browser,
        opened_page(browser, server, DESKTOP) as page,
    ):
        texts = SocketTexts(page)
        await choose_websocket(page)
        session_id = (await start_call(page, "echo"))["sessionId"]
        session = server.server.sessions.get(session_id)
        events = session.events.subscribe()
        await wait_for_output_above_silence(page)
        first_ready = texts.received[types(texts.received).index("ready")]

        cut_socket(server, session_id)
        detached = await next_event(events, "detached", RESUMED_WITHIN_S)
        assert detached["reason"] == "the socket closed"
        await next_event(events, "resumed", RESUMED_WITHIN_S)

        # The page said what it was doing, then was connected again, to the same session.
        log = page.locator("#log li")
        await expect(log.filter(has_text="reconnecting")).to_have_count(1)
        await expect(log.filter(has_text="reconnecting")).to_contain_text("attempt 1")
        await expect(log.filter(has_text=f"session {session_id}")).to_have_count(2)
        await expect(page.locator("#log li[data-kind=error]")).to_have_count(0)
        await expect(page.locator("#connection-state")).to_have_text("connected")
        await expect(page.locator("#message")).to_contain_text("Connected.")
        assert (await snapshot(page))["sessionId"] == session_id
        assert server.server.sessions.get(session_id) is session
        assert describe_socket_session(server, session_id)["resumes"] == 1

        # The second hello resumed with what the first ready gave and the page had played.
        hellos = [message for message in texts.sent if message["type"] == "hello"]
        assert len(hellos) == 2 and "resume" not in hellos[0]
        resume = hellos[1]["resume"]
        assert resume["session_id"] == session_id
        assert resume["token"] == first_ready["resume_token"]
        assert isinstance(resume["played_seq"], int)
        readies = [message for message in texts.received if message["type"] == "ready"]
        assert len(readies) == 2 and readies[1]["resumed"] is True
        assert readies[1]["resume_token"] != first_ready["resume_token"]
        assert readies[1]["next_seq"] > resume["played_seq"]
        # Everything sent after what the page had played was sent again, some of which the
        # page held already (see packetsLost below).
        assert describe_socket_session(server, session_id)["socket"]["frames_resent"] > 0

        # Audio both ways again: the microphone reaches the engine, and the page plays (and
        # acknowledges) the frames of the new socket.
        await assert_caller_audio_flows(session)
        played = describe_socket_session(server, session_id)["socket"]["played_seq"]
        assert played > readies[1]["next_seq"] + PLAYED_AFTER_RESUME_FRAMES
        await page.wait_for_function(
            "(floor) => window.cosyrtc.snapshot().output.rms > floor", arg=SILENCE_RMS
        )
        # Frames the server sent again that the page held already were dropped, not played
        # twice nor counted as a gap in the sequence.
        browser_stats = (await snapshot(page))["browser"]
        assert browser_stats is not None and browser_stats["packetsLost"] == 0, browser_stats
        assert describe_socket_session(server, session_id)["resumes"] == 1
        await stop_call(page, server)


async def test_a_resume_the_server_refuses_as_session_not_found_starts_a_new_call(
    registry: EngineRegistry,
    mic_wav: Path,  # noqa: F811
):
    """The session ends while its socket is cut (its server lost it): the resume is refused
    with ``session_not_found`` and the page starts a new call by itself, as over WebRTC."""
    async with (
        running_server(registry) as server,
        chromium(mic_wav) as browser,
        opened_page(browser, server, DESKTOP) as page,
    ):
        texts = SocketTexts(page)
        await choose_websocket(page)
        first = (await start_call(page, "echo"))["sessionId"]
        sessions = server.server.sessions
        session = sessions.get(first)
        await wait_for_output_above_silence(page)

        # In one step of the server's loop: the page cannot resume in between.
        cut_socket(server, first)
        await sessions.close_session(first, "the test lost it")
        assert session.closed.is_set()

        restarted = page.locator("#log li", has_text="The server lost the call")
        await expect(restarted).to_have_count(1, timeout=RESUMED_WITHIN_S * 1000)
        await expect(page.locator("#connection-state")).to_have_text("connected")
        second = (await snapshot(page))["sessionId"]
        assert second not in (None, first)
        assert (await snapshot(page))["transport"] == "websocket"
        assert len(sessions) == 1 and describe_socket_session(server, second)["resumes"] == 0
        await expect(page.locator("#message")).to_contain_text("Connected.")

        hellos = [message for message in texts.sent if message["type"] == "hello"]
        assert [hello.get("resume", {}).get("session_id") for hello in hellos] == [
            None,
            first,
            None,
        ]
        refusals = [message for message in texts.received if message["type"] == "error"]
        assert [refusal["error"] for refusal in refusals] == ["session_not_found"]
        await wait_for_output_above_silence(page)
        await stop_call(page, server)


class GoingDark:
    """Relays the page's sockets (Playwright's WebSocket routing) and can make the first
    one's link go dark: from then on nothing crosses it either way, not even a close, as
    when a network dies without a word. Pings stay with the browser's real socket, so the
    server does not notice either."""

    def __init__(self) -> None:
        self.sockets = 0
        self.dark = False

    def relay(self, page_side: WebSocketRoute) -> None:
        server_side = page_side.connect_to_server()
        self.sockets += 1
        if self.sockets > 1:
            return  # relayed as it is

        def alive() -> bool:
            return not self.dark

        def to_server(message: str | bytes) -> None:
            if alive():
                server_side.send(message)

        def to_page(message: str | bytes) -> None:
            if alive():
                page_side.send(message)

        async def close_server(code: int | None, reason: str | None) -> None:
            if alive():
                await server_side.close(code=code, reason=reason)

        async def close_page(code: int | None, reason: str | None) -> None:
            if alive():
                await page_side.close(code=code, reason=reason)

        page_side.on_message(to_server)
        server_side.on_message(to_page)
        page_side.on_close(close_server)
        server_side.on_close(close_page)


async def test_a_socket_gone_silent_is_replaced_and_the_session_resumed(
    registry: EngineRegistry,
    mic_wav: Path,  # noqa: F811
):
    """The socket carries nothing more and nobody closes it: the browser would not notice
    for minutes. The server sends something at least every second (its stats), so after
    5 s of nothing the page gives up on the socket and resumes the session on a new one,
    which replaces the old one on the server too."""
    async with (
        running_server(registry) as server,
        chromium(mic_wav) as browser,
        opened_page(browser, server, DESKTOP) as page,
    ):
        link = GoingDark()
        await page.route_web_socket("**/ws", link.relay)
        await choose_websocket(page)
        session_id = (await start_call(page, "echo"))["sessionId"]
        session = server.server.sessions.get(session_id)
        events = session.events.subscribe()
        await wait_for_output_above_silence(page)

        loop = asyncio.get_running_loop()
        link.dark = True
        went_dark = loop.time()
        detached = await next_event(events, "detached", QUIET_LIMIT_S + 2 * QUIET_CHECK_S)
        assert detached["reason"] == "a new connection resumes it"
        await next_event(events, "resumed", RESUMED_WITHIN_S)
        assert loop.time() - went_dark >= QUIET_LIMIT_S - 0.1
        assert link.sockets == 2

        await expect(page.locator("#log li", has_text="reconnecting")).to_have_count(1)
        await expect(page.locator("#connection-state")).to_have_text("connected")
        assert (await snapshot(page))["sessionId"] == session_id
        assert describe_socket_session(server, session_id)["resumes"] == 1
        await assert_caller_audio_flows(session)
        await stop_call(page, server)


async def test_stop_during_a_socket_resume_deletes_the_session_and_nothing_retries(
    registry: EngineRegistry,
    mic_wav: Path,  # noqa: F811
):
    """Stop pressed while the resume's socket waits for its ready: the session (detached,
    with no socket to hang up on) is deleted, and nothing is tried again behind the
    person's back."""
    async with (
        running_server(registry) as server,
        chromium(mic_wav) as browser,
        opened_page(browser, server, DESKTOP) as page,
    ):
        await choose_websocket(page)
        session_id = (await start_call(page, "echo"))["sessionId"]
        sessions = server.server.sessions
        session = sessions.get(session_id)
        events = session.events.subscribe()

        # From now on a socket opens but the server never answers: it never reaches it.
        hellos: list[dict[str, Any]] = []

        def unanswered(page_side: WebSocketRoute) -> None:
            def keep_hello(message: str | bytes) -> None:
                if isinstance(message, str):
                    hellos.append(json.loads(message))

            page_side.on_message(keep_hello)

        await page.route_web_socket("**/ws", unanswered)
        cut_socket(server, session_id)
        await next_event(events, "detached", RESUMED_WITHIN_S)
        await expect(page.locator("#connection-state")).to_have_text("reconnecting")
        await expect(page.locator("#message")).to_have_text("Reconnecting…")
        async with asyncio.timeout(RESUMED_WITHIN_S):
            while not hellos:
                await asyncio.sleep(0.05)
        assert hellos[0]["resume"]["session_id"] == session_id

        await page.get_by_role("button", name="Stop").click()
        await asyncio.wait_for(session.closed.wait(), 5)
        assert len(sessions) == 0
        # Longer than the pause before a second attempt (1 s).
        await page.wait_for_timeout(NO_RETRY_WAIT_MS)
        assert len(hellos) == 1
        await expect(page.get_by_role("button", name="Start")).to_be_enabled()
        assert (await snapshot(page))["connectionState"] == "idle"
