"""GET /metrics of one process: sessions, refusals, frames, latencies, the loop, the process."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import aiohttp
import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from media.engines.registry import EngineRegistry
from media.pipeline.base import PipelineCounters, ReceiveStats
from peer.call import PeerCall
from server.ops.metrics_merge import merge_expositions
from server.ops.session_metrics import SESSION_COUNTERS, _Tracked
from tests.conftest import running_server

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture(scope="module")
def echo_registry() -> Iterator[EngineRegistry]:
    loaded = EngineRegistry.load(["echo"])
    yield loaded
    loaded.close()


async def scrape(http: aiohttp.ClientSession, url: str) -> Samples:
    async with http.get(url + "metrics") as response:
        assert response.status == 200
        assert response.content_type == "text/plain"
        return parse(await response.text())


async def test_metrics_count_sessions_frames_and_refusals_and_never_go_backwards(
    echo_registry: EngineRegistry,
):
    """Guards the close of a session: its counts must stay in the totals after the session
    manager forgets it, or every counter would drop when a call ends."""
    async with (
        running_server(echo_registry, max_sessions=1) as server,
        aiohttp.ClientSession() as http,
    ):
        json_type = {"Content-Type": "application/json"}
        async with http.post(server.url + "offer", data="{", headers=json_type) as response:
            assert (await response.json())["error"] == "invalid_json"
        bad_sdp = {"sdp": "v=0", "type": "offer"}
        async with http.post(server.url + "offer", json=bad_sdp) as response:
            malformed = (await response.json())["error"]
        call = PeerCall(server.url, np.zeros(48_000 * 10, np.float32), engine="echo")
        await call.pc.setLocalDescription(await call.pc.createOffer())
        offer = {"sdp": call.pc.localDescription.sdp, "type": "offer"}
        async with http.post(server.url + "offer", json={**offer, "engine": "nope"}) as response:
            assert (await response.json())["error"] == "unknown_engine"
        await call.close()

        async with PeerCall(server.url, np.zeros(48_000 * 10, np.float32), engine="echo") as peer:
            await asyncio.sleep(2.0)
            async with http.post(server.url + "offer", json=offer) as response:
                assert (await response.json())["error"] == "at_capacity"
            during = await scrape(http, server.url)
            assert await peer.end() == 200
        after = await scrape(http, server.url)

    for reason in ("invalid_json", malformed, "unknown_engine", "at_capacity"):
        assert value(during, "cosyrtc_sessions_rejected_total", reason=reason) == 1, reason
    echo = {"engine": "echo"}
    assert value(during, "cosyrtc_sessions_live", engine="echo", kind="transform") == 1
    assert value(during, "cosyrtc_sessions_created_total", **echo) == 1
    assert value(during, "cosyrtc_packets_received_total", **echo) > 50
    assert value(during, "cosyrtc_frames_sent_total", **echo) > 50
    assert value(during, "cosyrtc_in_to_out_seconds_count", **echo) > 50
    assert value(during, "cosyrtc_engine_call_seconds_count", **echo) > 50
    assert value(during, "cosyrtc_event_loop_lag_seconds_count") > 5
    assert value(during, "process_resident_memory_bytes") > 10_000_000
    assert value(during, "process_cpu_seconds_total") > 0

    assert value(after, "cosyrtc_sessions_live", engine="echo", kind="transform") == 0
    assert value(after, "cosyrtc_sessions_closed_total", **echo, reason="deleted") == 1
    for name in SESSION_COUNTERS:
        total = f"cosyrtc_{name}_total"
        assert value(after, total, **echo) >= value(during, total, **echo), name
    assert value(after, "cosyrtc_in_to_out_seconds_count", **echo) >= value(
        during, "cosyrtc_in_to_out_seconds_count", **echo
    )


def fake_session(receive: ReceiveStats) -> Any:
    """Just what ``session_counters`` reads of a speak session."""
    output = SimpleNamespace(frames_sent=0, silence_sent=0)
    counters = PipelineCounters(0, 0, None, None)
    pipeline = SimpleNamespace(
        receive_stats=receive,
        output=output,
        underruns=0,
        backlog_dropped_seconds=0.0,
        counters=lambda: counters,
    )
    return SimpleNamespace(pipeline=pipeline, resumes=0, socket_output=None)


def test_counts_carry_over_when_a_resumed_session_gets_a_new_receive_path():
    session = fake_session(ReceiveStats(packets=120))
    tracked = _Tracked(session)
    assert tracked.read()["packets_received"] == 120
    session.pipeline.receive_stats = ReceiveStats(packets=30)  # the new connection's path
    assert tracked.read()["packets_received"] == 150
    session.pipeline.receive_stats.packets = 40
    assert tracked.read()["packets_received"] == 160


def test_merged_exposition_labels_each_process_and_describes_each_family_once():
    worker_text = (
        "# HELP cosyrtc_frames_sent_total Frames.\n"
        "# TYPE cosyrtc_frames_sent_total counter\n"
        'cosyrtc_frames_sent_total{engine="echo"} 5.0\n'
        "# HELP process_resident_memory_bytes RSS.\n"
        "# TYPE process_resident_memory_bytes gauge\n"
        "process_resident_memory_bytes 1000.0\n"
    )
    own = CollectorRegistry()
    Counter("cosyrtc_sessions_rejected", "Refused.", ["reason"], registry=own).labels(
        "at_capacity"
    ).inc()
    text = merge_expositions({"0": worker_text, "1": worker_text, "2": None}, own).decode()
    assert text.count("# TYPE cosyrtc_frames_sent_total counter") == 1
    assert text.count("# HELP process_resident_memory_bytes") == 1
    samples = parse(text)
    for worker in ("0", "1"):
        assert value(samples, "cosyrtc_frames_sent_total", engine="echo", worker=worker) == 5
        assert value(samples, "process_resident_memory_bytes", worker=worker) == 1000
        assert value(samples, "cosyrtc_worker_up", worker=worker) == 1
    assert value(samples, "cosyrtc_worker_up", worker="2") == 0
    rejected = ("cosyrtc_sessions_rejected_total", "at_capacity", "front")
    assert value(samples, rejected[0], reason=rejected[1], worker=rejected[2]) == 1
