"""Data-channel caps: message size and rate, per session, on real aiortc calls and alone."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from media.engines.registry import EngineRegistry
from peer.call import PeerCall
from server.sessions.channel_limits import ChannelLimits
from server.sessions.control import ControlError
from tests.clock import FakeClock
from tests.conftest import running_server

SPEAK_OPTIONS = {"barge_in": False}


def errors(call: PeerCall, since: int = 0) -> list[str]:
    return [e["error"] for e in call.events[since:] if e.get("type") == "error"]


async def test_oversized_message_is_refused_unparsed_and_the_session_goes_on(
    registry: EngineRegistry,
):
    """A valid speak message one byte over the cap is refused, not spoken."""
    async with (
        running_server(registry, dc_max_message_bytes=1024) as server,
        PeerCall(
            server.url, np.zeros(48_000 * 20, np.float32), engine="piper", options=SPEAK_OPTIONS
        ) as call,
    ):
        message = {"type": "speak", "text": "", "id": "big"}
        message["text"] = "a" * (1025 - len(json.dumps(message)))
        assert len(json.dumps(message).encode()) == 1025
        await call.send(message)
        refused = await call.wait_for("error")
        assert refused["error"] == "message_too_large"
        assert "1024" in refused["message"]

        since = len(call.events)
        await call.send({"type": "speak", "text": "Still here.", "id": "after"})
        await call.wait_for("speech_queued", since=since, id="after")
        assert not any(e.get("id") == "big" for e in call.events)


async def test_a_flood_is_dropped_with_one_rate_limited_error_then_recovers(
    registry: EngineRegistry,
):
    """Five a second: a burst of 40 gets five answers and one rate_limited, no more."""
    async with (
        running_server(registry, dc_max_messages=5) as server,
        PeerCall(
            server.url, np.zeros(48_000 * 20, np.float32), engine="piper", options=SPEAK_OPTIONS
        ) as call,
    ):
        for index in range(40):
            await call.send({"type": f"unknown-{index}"})
        await call.wait_for("error", error="rate_limited")
        await asyncio.sleep(0.3)  # anything still on its way arrives
        answered = errors(call)
        assert answered.count("rate_limited") == 1
        assert 5 <= answered.count("unknown_type") <= 7  # the burst, plus refill meanwhile
        session = server.server.sessions.get(call.session_id)
        assert session.limits.dropped == 40 - answered.count("unknown_type")

        await asyncio.sleep(1.0)  # the bucket refills
        since = len(call.events)
        await call.send({"type": "speak", "text": "Back again.", "id": "after"})
        await call.wait_for("speech_queued", since=since, id="after")


def test_size_counts_encoded_bytes_of_text_and_bytes_alike():
    limits = ChannelLimits(max_bytes=8, per_second=100, clock=FakeClock())
    assert limits.admit("12345678") is True
    assert limits.admit(b"12345678") is True
    with pytest.raises(ControlError) as too_large:
        limits.admit("ééééé")  # five characters, ten bytes
    assert too_large.value.code == "message_too_large"
    with pytest.raises(ControlError):
        limits.admit(b"123456789")


def test_rate_refuses_once_per_burst_and_refills_with_time():
    clock = FakeClock()
    limits = ChannelLimits(max_bytes=1024, per_second=2, clock=clock)
    assert limits.admit("a") and limits.admit("b")
    with pytest.raises(ControlError) as refused:
        limits.admit("c")
    assert refused.value.code == "rate_limited"
    assert limits.admit("d") is False  # same burst: dropped without an answer
    clock.now += 0.5  # one token back
    assert limits.admit("e") is True
    with pytest.raises(ControlError):  # a new burst is answered again
        limits.admit("f")
    assert limits.dropped == 3
