"""GET /readyz: 200 while new sessions are welcome, 503 with the reasons when they are not."""

from __future__ import annotations

from collections.abc import Iterator

import aiohttp
import pytest

from media.engines.registry import EngineRegistry
from tests.conftest import running_server


@pytest.fixture(scope="module")
def echo_registry() -> Iterator[EngineRegistry]:
    loaded = EngineRegistry.load(["echo"])
    yield loaded
    loaded.close()


async def test_a_draining_server_or_a_broken_default_engine_is_not_ready(
    echo_registry: EngineRegistry,
):
    async with (
        running_server(echo_registry, breaker_failures=2) as running,
        aiohttp.ClientSession() as http,
    ):

        async def readyz() -> tuple[int, list[str]]:
            async with http.get(running.url + "readyz") as response:
                return response.status, (await response.json())["reasons"]

        assert await readyz() == (200, [])
        sessions = running.server.sessions
        for _ in range(2):
            sessions.breakers["echo"].record_failure()
        assert await readyz() == (503, ["engine_circuit_open"])
        sessions.draining = True
        assert await readyz() == (503, ["engine_circuit_open", "draining"])
