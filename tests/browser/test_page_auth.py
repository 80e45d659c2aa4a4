"""The page against a server that wants a token: it asks, keeps it for the tab, and calls.

Same browser and fake microphone as tests/browser/test_page.py.
"""

from __future__ import annotations

from pathlib import Path

from playwright.async_api import expect

from media.engines.registry import EngineRegistry
from tests.browser.test_page import (
    DESKTOP,
    chromium,
    mic_wav,  # noqa: F401  (the fixture, shared)
    pytestmark,  # noqa: F401  (skipped the same way without Chromium)
    snapshot,
    start_call,
    stop_call,
    wait_for_output_above_silence,
)
from tests.conftest import running_server

TOKEN = "page-token-0123456789"


async def test_page_asks_for_the_token_then_calls_with_it(
    registry: EngineRegistry,
    mic_wav: Path,  # noqa: F811
):
    """A wrong token is refused and asked for again; the right one opens the engine list,
    the offer and the DELETE that Stop sends (the session closes on the server)."""
    async with (
        running_server(registry, auth_token=TOKEN) as server,
        chromium(mic_wav) as browser,
    ):
        page = await browser.new_page(viewport=DESKTOP)
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        await page.goto(server.url)
        field = page.get_by_label("Access token")
        use = page.get_by_role("button", name="Use token")
        message = page.locator("#message")
        await expect(field).to_be_visible()
        await expect(message).to_contain_text("needs an access token")
        await expect(page.get_by_role("button", name="Start")).to_be_disabled()

        await field.fill("not-the-token")
        await use.click()
        await expect(message).to_contain_text("did not accept this access token")
        await expect(field).to_be_focused()

        await field.fill(TOKEN)
        await use.click()
        await expect(page.get_by_role("button", name="Start")).to_be_enabled()
        await expect(field).to_be_hidden()
        stored = await page.evaluate("Object.values(sessionStorage)")
        assert stored == [TOKEN]
        assert await page.evaluate("localStorage.length") == 0

        state = await start_call(page, "echo")
        assert state["engine"] == "echo"
        await wait_for_output_above_silence(page)
        assert (await snapshot(page))["sessionId"] is not None
        await stop_call(page, server)
        assert not errors, f"script errors on the page: {errors}"
