"""Engines as plugins: chosen at start-up, their settings checked, their abilities declared.

The built-in engines register through the ``cosyrtc.engines`` entry-point group like any
other package (``media.engines.registry``); the example package in examples/engine-plugin
is tested over a real call in tests/integration/test_engine_plugin_call.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import aiohttp
import numpy as np
import pytest

from media.engines.registry import EngineRegistry, EngineSettingsError, UnknownEngine, plan
from media.engines.testing import FAKE_SPEAK, FAKE_TRANSFORM
from peer.call import PeerCall
from tests.conftest import RunningServer, running_server
from tests.server.test_cli import run_cli
from tests.server.test_security import wav_bytes


@pytest.fixture(scope="module")
def plugin_registry() -> Iterator[EngineRegistry]:
    loaded = EngineRegistry.load(
        ["echo", "piper", "fake-transform", "fake-speak"], extra=[FAKE_TRANSFORM, FAKE_SPEAK]
    )
    yield loaded
    loaded.close()


@pytest.fixture
async def served(plugin_registry: EngineRegistry) -> AsyncIterator[RunningServer]:
    async with running_server(plugin_registry) as running:
        yield running


def test_the_built_in_engines_are_installed_plugins():
    names = [plugin.name for plugin, _ in plan()]
    assert {"echo", "denoise", "denoise-libdf", "piper", "cosyvoice", "cosyvoice-vc"} <= set(names)


def test_only_the_chosen_engines_load():
    registry = EngineRegistry.load(["echo"])
    assert registry.names == ["echo"] and registry.unavailable == {}


def test_an_engine_nobody_installed_is_refused_by_name():
    with pytest.raises(UnknownEngine, match=r"nosuch.*installed: .*echo"):
        EngineRegistry.load(["echo", "nosuch"])


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"denoise-libdf": {"nope": "1"}}, r"denoise-libdf\.nope does not exist .*warm_pool"),
        ({"denoise-libdf": {"warm_pool": "many"}}, r"denoise-libdf\.warm_pool='many'"),
        ({"denoise-libdf": {"warm_pool": "-1"}}, r"0 or more"),
        ({"denoise": {"max_wait_ms": "50"}}, r"0-20 ms"),
        ({"nowhere": {"x": "1"}}, r"'nowhere', which no installed engine reads"),
    ],
)
def test_engine_settings_are_checked_before_anything_loads(settings, message):
    with pytest.raises(EngineSettingsError, match=message):
        plan(["denoise", "denoise-libdf"], settings)


def test_one_namespace_serves_both_cosyvoice_engines(tmp_path):
    settings = {"cosyvoice": {"model": str(tmp_path), "device": "cpu"}}
    planned = dict((p.name, parsed) for p, parsed in plan(["cosyvoice", "cosyvoice-vc"], settings))
    assert planned["cosyvoice"]["model"] == planned["cosyvoice-vc"]["model"] == tmp_path


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--engines", "echo", "nosuch"], "--engines"),
        (["--engine-setting", "denoise-libdf.warm_pool=lots"], "denoise-libdf.warm_pool"),
        (["--engines", "piper", "--engine", "echo"], "not among --engines"),
    ],
)
def test_serve_refuses_wrong_engine_choices_at_start_up(argv: list[str], message: str):
    done = run_cli("serve", "--port", "1", "--engine", "echo", *argv, timeout=60)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr


async def test_engines_list_their_languages_and_capabilities(served: RunningServer):
    async with aiohttp.ClientSession() as http, http.get(served.url + "engines") as response:
        engines = {e["name"]: e for e in (await response.json())["engines"]}
    assert engines["piper"]["languages"] == ["en"]
    assert engines["echo"]["languages"] == []
    assert engines["fake-transform"]["capabilities"]["voice_prompt"] is True
    assert engines["piper"]["capabilities"] == {
        "incremental_text": False,
        "voice_prompt": False,
        "batched": False,
    }


async def test_text_an_engine_cannot_speak_is_refused_naming_the_engines_that_can(
    served: RunningServer,
):
    """Chinese sent to the English Piper voice came back as seconds of spelled-out letter
    names; now it is an ``unsupported_language`` error, over the channel and over HTTP."""
    async with (
        PeerCall(served.url, np.zeros(48_000, np.float32), engine="piper") as call,
        aiohttp.ClientSession() as http,
    ):
        await call.send({"type": "speak", "text": "你好\uff0c今天天气很好\u3002", "id": "zh"})
        error = await call.wait_for("error", 5, error="unsupported_language")
        assert "piper" in error["message"] and "cjk" in error["message"]
        route = f"{served.url}sessions/{call.session_id}/speak"
        async with http.post(route, json={"text": "Привет, как дела?"}) as response:
            assert response.status == 400
            assert (await response.json())["error"] == "unsupported_language"
        await call.send({"type": "speak", "text": "Hello, Mr. 王.", "id": "en"})
        finished = await call.wait_for("speech_finished", 15, id="en")
        assert finished["interrupted"] is False
        session = served.server.sessions.get(call.session_id or "")
        assert session.pipeline.counters().engine_errors == 0


async def test_a_voice_prompt_never_runs_beside_the_session_s_engine_calls(
    served: RunningServer,
):
    """Prompt uploads used to run on asyncio's default executor, on the very state the
    pipeline's engine thread was processing; now they queue with the session's calls."""
    options = {"delay_ms": 2.0}
    async with (
        PeerCall(
            served.url, np.zeros(5 * 48_000, np.float32), engine="fake-transform", options=options
        ) as call,
        aiohttp.ClientSession() as http,
    ):
        state = served.server.sessions.get(call.session_id or "").pipeline.state
        while state.calls < 20:
            await asyncio.sleep(0.02)
        route = f"{served.url}sessions/{call.session_id}/prompt"
        headers = {"Content-Type": "audio/wav"}

        async def upload() -> int:
            async with http.post(route, data=wav_bytes(1.0), headers=headers) as response:
                return response.status

        statuses = await asyncio.gather(*(upload() for _ in range(20)))
    assert statuses == [200] * 20
    assert state.prompts == 20 and state.calls > 20  # audio kept flowing between them
    assert state.overlaps == 0


async def test_a_prompt_for_an_engine_that_takes_none_is_refused(served: RunningServer):
    async with (
        PeerCall(served.url, np.zeros(48_000, np.float32), engine="echo") as call,
        aiohttp.ClientSession() as http,
    ):
        route = f"{served.url}sessions/{call.session_id}/prompt"
        headers = {"Content-Type": "audio/wav"}
        async with http.post(route, data=wav_bytes(1.0), headers=headers) as response:
            assert response.status == 400
            assert (await response.json())["error"] == "no_voice_prompt"
