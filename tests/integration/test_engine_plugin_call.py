"""A third-party engine, installed from its own package, serves a real call.

``examples/engine-plugin`` (the ``cosyrtc-pitch`` package, installed by ``make test``)
declares ``pitch`` in the ``cosyrtc.engines`` group; nothing in the server names it.
"""

from __future__ import annotations

import asyncio

import aiohttp
import numpy as np
import pytest

from media.audio.frames import RTC_RATE
from media.engines.registry import EngineRegistry, installed_plugins
from peer.call import PeerCall
from tests.conftest import running_server

pytestmark = pytest.mark.skipif(
    "pitch" not in installed_plugins(),
    reason="the example plugin is not installed: `make test` installs examples/engine-plugin",
)


def dominant_hz(audio: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(audio * np.hanning(len(audio))))
    return float(np.argmax(spectrum) * RTC_RATE / len(audio))


async def test_the_plugin_engine_is_listed_and_shifts_a_call_an_octave_up():
    registry = EngineRegistry.load(["echo", "pitch"])
    tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(4 * RTC_RATE) / RTC_RATE)).astype(np.float32)
    try:
        async with running_server(registry) as server:
            async with aiohttp.ClientSession() as http, http.get(server.url + "engines") as r:
                listed = {e["name"]: e for e in (await r.json())["engines"]}
            assert listed["pitch"]["kind"] == "transform"
            assert "semitones" in listed["pitch"]["options"]["properties"]
            async with PeerCall(
                server.url, tone, engine="pitch", options={"semitones": 12}
            ) as call:
                await asyncio.wait_for(call.source.finished.wait(), 15)
                await asyncio.sleep(0.5)  # the last of it on its way back
            received = call.received()
    finally:
        registry.close()
    audible = np.flatnonzero(np.abs(received) > 0.05)
    assert len(audible), "nothing came back"
    start = audible[0] + RTC_RATE // 2  # past the connection's first moments
    steady = received[start : start + 2 * RTC_RATE]
    assert len(steady) == 2 * RTC_RATE  # two seconds of the call came back
    assert abs(dominant_hz(steady) - 880) < 0.03 * 880
