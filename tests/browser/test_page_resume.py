"""The page resumes its session on a new connection when the old one drops.

Same browser and fake microphone as tests/browser/test_page.py; echo calls, so the server's
count of frames in says whether the microphone still reaches it. The session's own event
stream (what ``GET /sessions/{id}/events`` serves) says when it detached and resumed.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from playwright.async_api import Page, Route, expect

from media.audio.queues import DropOldestQueue
from media.engines.registry import EngineRegistry
from server.sessions.events import Event
from server.sessions.session import Session
from tests.browser.test_page import (
    DESKTOP,
    chromium,
    mic_wav,  # noqa: F401  (the fixture, shared)
    opened_page,
    pytestmark,  # noqa: F401  (skipped the same way without Chromium)
    snapshot,
    start_call,
    stop_call,
    wait_for_output_above_silence,
)
from tests.conftest import running_server
from tests.netfaults.relay import UdpRelay

# Small enough that a dead link detaches the session at once; a resume that carried no
# audio would detach it again within the test.
RTP_TIMEOUT_S = 1.0
RESUME_GRACE_S = 15.0
# The page hears of a detach at once (the server closes the data channel) and resumes
# straight away; measured ~0.3 s.
RESUMED_WITHIN_S = 5.0
# Over a dead link the page hears nothing: Chromium reports "disconnected" after a few
# seconds of unanswered ICE checks, and the page waits 2 s more before resuming.
RESUMED_AFTER_DEAD_LINK_WITHIN_S = 15.0
AUDIO_CHECK_S = 1.5
NO_RETRY_WAIT_MS = 2500


async def next_event(events: DropOldestQueue[Event | None], kind: str, timeout: float) -> Event:
    """The session's next event of type ``kind``, skipping the others (stats mostly)."""
    async with asyncio.timeout(timeout):
        while True:
            event = await events.get()
            assert event is not None, f"the session ended while waiting for {kind!r}"
            if event["type"] == kind:
                return event


async def assert_caller_audio_flows(session: Session) -> None:
    """The pipeline keeps receiving the microphone: more frames in after a while."""
    before = session.pipeline.stats.frames_in
    await asyncio.sleep(AUDIO_CHECK_S)
    assert session.pipeline.stats.frames_in > before + 25, "no caller audio since the resume"


async def assert_page_resumed(page: Page, session: Session, session_id: str) -> None:
    """Same session, on a new connection that carries audio both ways, and the page says so."""
    assert session.resumes == 1
    assert session.connection_state == "connected"
    await assert_caller_audio_flows(session)
    await expect(page.locator("#connection-state")).to_have_text("connected")
    await expect(page.locator("#message")).to_contain_text("Connected.")
    await expect(page.locator("#log li", has_text="reconnecting")).to_have_count(1)
    # The new connection's audio reaches the page's meter (reset when its track came).
    await wait_for_output_above_silence(page)
    assert (await snapshot(page))["sessionId"] == session_id
    assert session.resumes == 1  # the audio kept the session attached meanwhile


async def test_page_resumes_a_session_the_server_detached_and_stop_still_deletes_it(
    registry: EngineRegistry,
    mic_wav: Path,  # noqa: F811
):
    """A detach closes the data channel, which the page used to read as "the server ended
    the call": the page must resume instead, and Stop must then still end the session,
    whose id has not changed."""
    async with (
        running_server(registry, rtp_timeout=RTP_TIMEOUT_S, resume_grace=RESUME_GRACE_S) as server,
        chromium(mic_wav) as browser,
        opened_page(browser, server, DESKTOP) as page,
    ):
        session_id = (await start_call(page, "echo"))["sessionId"]
        sessions = server.server.sessions
        session = sessions.get(session_id)
        events = session.events.subscribe()
        await wait_for_output_above_silence(page)

        # The server's own path for a caller gone quiet (private: no public API detaches).
        await sessions._detach(session, "the test dropped the connection")
        await next_event(events, "resumed", RESUMED_WITHIN_S)

        assert sessions.get(session_id) is session
        await assert_page_resumed(page, session, session_id)
        await stop_call(page, server)


async def through_relay(relay: UdpRelay, route: Route) -> None:
    """A first offer and its answer name the relay's stand-ins, so the call's every datagram
    crosses it; a resume goes direct, as from a phone that moved to another network."""
    offer = route.request.post_data_json
    if "resume" in offer:
        await route.continue_()
        return
    offer["sdp"] = relay.rewrite_offer(offer["sdp"])
    response = await route.fetch(post_data=json.dumps(offer))
    answer = await response.json()
    answer["sdp"] = relay.rewrite_answer(answer["sdp"])
    await route.fulfill(response=response, json=answer)


async def test_page_resumes_after_its_network_goes_dead(
    registry: EngineRegistry,
    mic_wav: Path,  # noqa: F811
):
    """Nothing crosses the link any more, either way: the server detaches the session after
    ``rtp_timeout`` and the page hears nothing of it; only its own connection state says
    "disconnected", and the page must resume on that."""
    async with (
        running_server(registry, rtp_timeout=RTP_TIMEOUT_S, resume_grace=RESUME_GRACE_S) as server,
        chromium(mic_wav) as browser,
        opened_page(browser, server, DESKTOP) as page,
    ):
        with UdpRelay(seed=7) as relay:
            await page.route("**/offer", lambda route: through_relay(relay, route))
            session_id = (await start_call(page, "echo"))["sessionId"]
            session = server.server.sessions.get(session_id)
            events = session.events.subscribe()
            await wait_for_output_above_silence(page)
            assert relay.to_server.stats.forwarded > 0

            relay.blackout()
            await next_event(events, "detached", RTP_TIMEOUT_S + 2)
            # The server's goodbye was lost with the link: the page still believes in it.
            assert (await snapshot(page))["connectionState"] == "connected"
            await next_event(events, "resumed", RESUMED_AFTER_DEAD_LINK_WITHIN_S)

            await assert_page_resumed(page, session, session_id)
            await stop_call(page, server)


async def test_stop_during_a_resume_deletes_the_session_and_nothing_retries(
    registry: EngineRegistry,
    mic_wav: Path,  # noqa: F811
):
    """Stop pressed while a resume offer is on its way: the session is deleted, and the
    failed offer (the network is down) is not retried behind the person's back."""
    async with (
        running_server(registry, rtp_timeout=RTP_TIMEOUT_S, resume_grace=RESUME_GRACE_S) as server,
        chromium(mic_wav) as browser,
        opened_page(browser, server, DESKTOP) as page,
    ):
        resume_offers: list[Route] = []
        offered, stopped = asyncio.Event(), asyncio.Event()

        async def fail_resumes_after_stop(route: Route) -> None:
            if "resume" not in route.request.post_data_json:
                await route.continue_()
                return
            resume_offers.append(route)
            offered.set()
            await stopped.wait()
            await route.abort("internetdisconnected")

        await page.route("**/offer", fail_resumes_after_stop)
        session_id = (await start_call(page, "echo"))["sessionId"]
        sessions = server.server.sessions
        session = sessions.get(session_id)
        await sessions._detach(session, "the test dropped the connection")
        await asyncio.wait_for(offered.wait(), 5)
        await expect(page.locator("#connection-state")).to_have_text("reconnecting")
        await expect(page.locator("#message")).to_have_text("Reconnecting…")

        await page.get_by_role("button", name="Stop").click()
        await asyncio.wait_for(session.closed.wait(), 5)
        assert len(sessions) == 0
        stopped.set()
        # Longer than the pause before a second attempt (1 s) and its offer.
        await page.wait_for_timeout(NO_RETRY_WAIT_MS)
        assert len(resume_offers) == 1
        await expect(page.get_by_role("button", name="Start")).to_be_enabled()
        assert (await snapshot(page))["connectionState"] == "idle"
