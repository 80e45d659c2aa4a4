"""Shared fixtures: engines loaded once, an in-process server per test, speech WAVs."""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from media.engines.registry import EngineRegistry
from peer.speech import SpeechFixture, add_white_noise, save, speech_with_pauses
from server.config import Settings
from server.http.app import SERVER_KEY, Server, create_app

LOOPBACK = "127.0.0.1"


@dataclass
class RunningServer:
    url: str
    app: web.Application

    @property
    def server(self) -> Server:
        return self.app[SERVER_KEY]


@pytest.fixture
def collected_first() -> Iterator[None]:
    """Collect this process's garbage and freeze what is left, for a timing-sensitive call.

    These tests run the server, the caller and the relay on one event loop, in a process
    that earlier tests (torch models, thousands of fuzzed sessions) left a large heap: a
    full collection mid-call walks all of it and stalls everything at once for 100-300 ms,
    which a link cannot do to a real server. A real server freezes what start-up built
    (``server.deploy.runner.freeze_startup_objects``); this does the same for the earlier
    tests' heap while the call runs, and thaws it afterwards.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@pytest.fixture(scope="session")
def registry() -> Iterator[EngineRegistry]:
    loaded = EngineRegistry.load()
    yield loaded
    loaded.close()


def loopback_settings(**overrides: Any) -> Settings:
    """Loopback-only settings: ICE on 127.0.0.1, no STUN/TURN servers.

    Every test client calls from 127.0.0.1, so the per-client session cap is off unless a
    test asks for it (tests/server/test_client_limits.py does).
    """
    base = Settings(
        host=LOOPBACK,
        engine="echo",
        ice_hosts=(LOOPBACK,),
        engine_threads=2,
        max_client_sessions=0,
    )
    return dataclasses.replace(base, **overrides)


@asynccontextmanager
async def running_server(
    registry: EngineRegistry, **overrides: Any
) -> AsyncIterator[RunningServer]:
    app = create_app(loopback_settings(**overrides), registry)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, LOOPBACK, 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield RunningServer(f"http://{LOOPBACK}:{port}/", app)
    finally:
        await runner.cleanup()


@pytest.fixture
async def server(registry: EngineRegistry) -> AsyncIterator[RunningServer]:
    async with running_server(registry) as running:
        yield running


@pytest.fixture(scope="session")
def speech() -> SpeechFixture:
    return speech_with_pauses()


@pytest.fixture(scope="session")
def speech_wav(tmp_path_factory: pytest.TempPathFactory, speech: SpeechFixture) -> Path:
    return save(tmp_path_factory.mktemp("wav") / "speech.wav", speech.clean)


@pytest.fixture(scope="session")
def noisy_speech_wav(tmp_path_factory: pytest.TempPathFactory, speech: SpeechFixture) -> Path:
    noisy = add_white_noise(speech.clean, snr_db=5.0)
    return save(tmp_path_factory.mktemp("wav") / "noisy.wav", noisy)
