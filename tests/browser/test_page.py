"""The page in a real browser: Debian's Chromium calls an in-process server over loopback.

A speech WAV made with espeak-ng plays as Chromium's fake microphone. The page is driven
through its labelled controls, as a person would, and read back through what it shows and
through ``window.cosyrtc.snapshot()`` (its meters' levels and the latest stats).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from media.audio.frames import RTC_RATE
from media.audio.wav import write_wav
from media.engines.registry import EngineRegistry
from peer.speech import espeak
from tests.conftest import RunningServer, running_server

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="Debian's chromium is missing: `make test` installs it (apt-get install chromium)",
)

# The machine running the tests has no internet: everything that would call Google is off.
# --mute-audio (a Playwright default) is dropped: muted elements feed Web Audio silence.
BROWSER_ARGS = (
    "--use-fake-device-for-media-stream",
    "--allow-loopback-in-peer-connection",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
)
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 360, "height": 780}
MS_TEXT = re.compile(r"(\d+(?:\.\d+)?) ms")  # how the page shows a duration
SILENCE_RMS = 0.003  # about -50 dBFS; speech played back is far above it
CONNECT_MS = 15_000
# Seconds of chart and meters before the desktop screenshot: for the picture only.
HISTORY_FOR_SCREENSHOT_MS = 5_000
MIC_SENTENCES = "Testing the browser page. One, two, three, four, five."
SHORT_TEXT = "Hello from the browser test."
LONG_TEXT = (
    "This sentence is long on purpose, so that there is plenty of time to interrupt it. "
    "It goes on about rivers, mountains, bakeries and the small town beside the lake."
)


@pytest.fixture(scope="module")
def mic_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Speech with short pauses, 48 kHz mono 16-bit: what Chromium's fake microphone plays."""
    voiced = espeak(MIC_SENTENCES)
    voiced = voiced / max(1e-6, float(np.abs(voiced).max())) * 0.5
    pause = np.zeros(RTC_RATE // 4, np.float32)
    path = tmp_path_factory.mktemp("mic") / "speech.wav"
    write_wav(path, np.concatenate([pause, voiced, pause]), RTC_RATE)
    return path


@asynccontextmanager
async def chromium(mic_wav: Path, *, allow_microphone: bool = True) -> AsyncIterator[Browser]:
    """Chromium with the WAV as its microphone.

    Without ``--use-fake-ui-for-media-stream`` nothing grants the permission, and headless
    Chromium turns the prompt down: the page gets the NotAllowedError a person's "Block" gives.
    """
    args = [*BROWSER_ARGS, f"--use-file-for-fake-audio-capture={mic_wav}"]
    if allow_microphone:
        args.append("--use-fake-ui-for-media-stream")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=args, ignore_default_args=["--mute-audio"]
        )
        try:
            yield browser
        finally:
            await browser.close()


@asynccontextmanager
async def opened_page(
    browser: Browser, server: RunningServer, viewport: dict[str, int]
) -> AsyncIterator[Page]:
    """The page, loaded and ready; fails the test on any uncaught script error."""
    page = await browser.new_page(viewport=viewport)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    await page.goto(server.url)
    await expect(page.get_by_role("button", name="Start")).to_be_enabled()
    yield page
    assert not errors, f"script errors on the page: {errors}"


async def start_call(page: Page, engine: str | None = None) -> dict[str, Any]:
    """Start a call (with ``engine`` picked first, if given) and wait until it connects."""
    if engine is not None:
        await page.get_by_label("Engine").select_option(engine)
    await page.get_by_role("button", name="Start").click()
    await expect(page.locator("#connection-state")).to_have_text("connected", timeout=CONNECT_MS)
    return await snapshot(page)


async def stop_call(page: Page, server: RunningServer) -> None:
    """Stop, then wait for the server to close the session (the page's DELETE is async)."""
    sessions = server.server.sessions
    session = sessions.get((await snapshot(page))["sessionId"])
    await page.get_by_role("button", name="Stop").click()
    await asyncio.wait_for(session.closed.wait(), 5)
    assert len(sessions) == 0
    await expect(page.get_by_role("button", name="Start")).to_be_enabled()


async def save_screenshot(page: Page, name: str, *, full_page: bool = False) -> None:
    """The page from its top (pressing Start scrolls the focused Stop button into view)."""
    ARTIFACTS.mkdir(exist_ok=True)
    await page.evaluate("window.scrollTo(0, 0)")
    await page.screenshot(path=ARTIFACTS / name, full_page=full_page)


async def assert_fits_and_every_control_is_labelled(page: Page, width: int) -> None:
    """No sideways scrolling, and a name for every control a screen reader would announce."""
    assert await page.evaluate("document.documentElement.scrollWidth") <= width
    unlabelled = await page.evaluate(
        """() => [...document.querySelectorAll("input, select, textarea, button")]
            .filter((c) => !c.closest("[hidden]"))
            .filter((c) => !(c.labels?.length || c.getAttribute("aria-label")
                             || (c.tagName === "BUTTON" && c.textContent.trim())))
            .map((c) => c.outerHTML)"""
    )
    assert unlabelled == []


async def snapshot(page: Page) -> dict[str, Any]:
    return await page.evaluate("window.cosyrtc.snapshot()")


async def wait_for_output_above_silence(page: Page, timeout_ms: int = 10_000) -> None:
    await page.wait_for_function(
        "(floor) => window.cosyrtc.snapshot().output.maxRms > floor",
        arg=SILENCE_RMS,
        timeout=timeout_ms,
    )


async def shown_ms(page: Page, selector: str) -> float | None:
    """A milliseconds value as the page shows it ("3.1 ms"), or None while it shows a dash."""
    text = (await page.locator(selector).text_content() or "").strip()
    match = MS_TEXT.fullmatch(text)
    return float(match[1]) if match else None


async def assert_latency_matches_server(page: Page, server: RunningServer) -> None:
    """The shown in->out latency is the server's (GET /sessions/{id}), within a tolerance.

    Both are medians over the last second but taken at different moments (the page's value
    is up to a second old), so a few readings are compared before giving up.
    """
    await page.wait_for_function(
        "() => /\\d/.test(document.querySelector('#latency-server').textContent)",
        timeout=10_000,
    )
    url = f"{server.url}sessions/{(await snapshot(page))['sessionId']}"
    readings = []
    async with aiohttp.ClientSession() as http:
        for _ in range(5):
            shown = await shown_ms(page, "#latency-server")
            async with http.get(url) as response:
                measured = (await response.json())["stats"]["in_to_out_ms"]
            readings.append((shown, measured))
            if shown is not None and abs(shown - measured) <= max(2.0, 0.25 * measured):
                return
            await asyncio.sleep(0.5)
    pytest.fail(f"page vs server in->out ms never agreed: {readings}")


async def test_transform_calls_play_back_show_the_server_latency_and_end_cleanly(
    registry: EngineRegistry, mic_wav: Path
):
    """echo, then denoise on the same page: Stop then Start must make a fresh call."""
    async with (
        running_server(registry) as server,
        chromium(mic_wav) as browser,
        opened_page(browser, server, DESKTOP) as page,
    ):
        session_ids = []
        for engine in ("echo", "denoise"):
            state = await start_call(page, engine)
            assert state["engine"] == engine
            session_ids.append(state["sessionId"])
            await wait_for_output_above_silence(page)
            assert (await snapshot(page))["input"]["maxRms"] > SILENCE_RMS
            await assert_latency_matches_server(page, server)
            # Sampled from getStats() once a second, on its own clock.
            await expect(page.locator("#latency-buffer")).to_have_text(MS_TEXT)
            buffer_ms = await shown_ms(page, "#latency-buffer")
            assert buffer_ms is not None and buffer_ms < 1000
            if engine == "denoise":
                await page.wait_for_timeout(HISTORY_FOR_SCREENSHOT_MS)
                await save_screenshot(page, "page-desktop.png")
            await stop_call(page, server)
        assert session_ids[0] != session_ids[1]


async def test_piper_speaks_typed_text_and_can_be_interrupted(
    registry: EngineRegistry, mic_wav: Path
):
    """At phone width: typed text is spoken (audio back, speech_finished in the log).

    Barge-in is switched off in the options form: the fake microphone talks all the time
    and would otherwise cut every sentence short.
    """
    async with (
        running_server(registry) as server,
        chromium(mic_wav) as browser,
        opened_page(browser, server, PHONE) as page,
    ):
        await page.get_by_label("Engine").select_option("piper")
        await assert_fits_and_every_control_is_labelled(page, PHONE["width"])
        await page.get_by_label("barge in").uncheck()
        await start_call(page)
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
        await expect(page.locator("#speech-state")).to_have_text("speaking", timeout=10_000)
        await page.get_by_role("button", name="Interrupt").click()
        await expect(finished.nth(1)).to_contain_text("interrupted", timeout=5_000)

        await save_screenshot(page, "page-phone.png", full_page=True)
        await stop_call(page, server)


async def test_denied_microphone_is_explained_and_speak_goes_on_without_it(
    registry: EngineRegistry, mic_wav: Path
):
    """No permission: a transform says what to do and holds no session; piper still speaks."""
    async with (
        running_server(registry) as server,
        chromium(mic_wav, allow_microphone=False) as browser,
        opened_page(browser, server, DESKTOP) as page,
    ):
        await page.get_by_label("Engine").select_option("echo")
        await page.get_by_role("button", name="Start").click()
        await expect(page.locator("#message")).to_contain_text("Microphone access was denied")
        await expect(page.get_by_role("button", name="Start")).to_be_enabled()
        assert len(server.server.sessions) == 0

        await start_call(page, "piper")
        await expect(page.locator("#message")).to_contain_text("without a microphone")
        await expect(page.get_by_role("button", name="Say")).to_be_enabled()
        await page.get_by_label("Text to say").fill(SHORT_TEXT)
        await page.get_by_label("Text to say").press("Enter")
        finished = page.locator("#log li", has_text="speech_finished")
        await expect(finished).to_have_count(1, timeout=20_000)
        await stop_call(page, server)


async def test_call_ended_by_the_server_ends_on_the_page(registry: EngineRegistry, mic_wav: Path):
    """The server closing a session (DELETE from elsewhere, ICE timeout) shows at once.

    Left to ICE, Chromium took ~6 s to say "disconnected" and ~17 s to give up; the closed
    data channel tells the page straight away.
    """
    async with (
        running_server(registry) as server,
        chromium(mic_wav) as browser,
        opened_page(browser, server, DESKTOP) as page,
    ):
        state = await start_call(page, "echo")
        await server.server.sessions.close_session(state["sessionId"])
        await expect(page.locator("#message")).to_contain_text("The server ended the call")
        await expect(page.get_by_role("button", name="Start")).to_be_enabled()
        assert (await snapshot(page))["connectionState"] == "idle"
