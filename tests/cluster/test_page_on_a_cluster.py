"""The page on a cluster: a call whose node dies comes back as a new call on another node.

Chromium (tests/browser/test_page.py's fixtures) loads the page from a drained node, so
every call it places lands on one of the two others, and that node can be killed while the
page's own node stays up. The resume goes to the dead node's id, is refused with 404
``session_not_found``, and the page starts a new call by itself; a session the server ends
on purpose still ends on the page (tests/browser/test_page.py).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import aiohttp
from playwright.async_api import expect

from bench.cluster import RedisServer, cluster_of
from server.http.routes import node_of
from tests.browser.test_page import (
    CONNECT_MS,
    DESKTOP,
    chromium,
    mic_wav,  # noqa: F401  (the fixture, shared)
    pytestmark,  # noqa: F401  (skipped the same way without Chromium)
    snapshot,
    start_call,
)

# Chromium notices the dead node after ~5 s of unanswered ICE checks, the page waits 2 s,
# and the resume is refused once the node's record has expired (2 s): a new call well
# inside this.
NEW_CALL_WITHIN_MS = 40_000


async def test_a_call_whose_node_dies_starts_again_on_another_node(
    redis_server: RedisServer,
    mic_wav: Path,  # noqa: F811
):
    with cluster_of(redis_server, [8, 8, 8]) as (home, *others):
        async with aiohttp.ClientSession() as http, http.post(home.url + "admin/drain") as drained:
            assert drained.status == 202
        async with chromium(mic_wav) as browser:
            page = await browser.new_page(viewport=DESKTOP)
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            await page.goto(home.url)
            await expect(page.get_by_role("button", name="Start")).to_be_enabled()
            first = (await start_call(page, "echo"))["sessionId"]
            owner = next(node for node in others if node.node_id == node_of(first))
            os.kill(owner.process.pid, signal.SIGKILL)

            restarted = page.locator("#log li", has_text="The server lost the call")
            await expect(restarted).to_have_count(1, timeout=NEW_CALL_WITHIN_MS)
            state = page.locator("#connection-state")
            await expect(state).to_have_text("connected", timeout=CONNECT_MS)
            second = (await snapshot(page))["sessionId"]
            survivor = next(node for node in others if node is not owner)
            assert node_of(second) == survivor.node_id
            assert (await snapshot(page))["engine"] == "echo"
            await expect(page.locator("#message")).to_contain_text("Connected.")
            await page.get_by_role("button", name="Stop").click()
            await expect(page.get_by_role("button", name="Start")).to_be_enabled()
            assert not errors, f"script errors on the page: {errors}"
