"""A full server refuses new calls at once and keeps the calls it already has.

Guards against two failures at capacity: a refusal that queues behind media work (the
caller waits on a server that cannot take it instead of trying another), and a burst of
offers that slows the admitted calls (their audio comes back late for everyone).
"""

from __future__ import annotations

import asyncio
import gc
import time

import aiohttp

from bench.common import percentile
from bench.loadclient import EncodedClip, LoadCaller
from bench.overload import offer_spread, real_offers
from media.engines.registry import EngineRegistry
from peer.speech import SpeechFixture
from tests.conftest import running_server

ADMITTED = 4
EXCESS_ROUNDS = 2  # the server is offered ADMITTED more calls, twice over: 8 refusals timed
OFFER_WINDOW_S = 4.0
OFFER_GROUP = 2  # excess offers sent at once, spread over the window
SETTLE_S = 1.0
# The server, its sessions and these callers share one event loop, and on a loaded 2-core
# machine other processes preempt it. Measured at load averages of 3-5.5 (up to 2.7 times
# as many runnable processes as cores): refusal medians 3-25 ms, one at 62 ms; the slowest
# refusal of a run 12-245 ms; admitted RTT p50 36-65 ms, p95 41-475 ms. The bounds leave
# room for that, and still fail a refusal that does real work first (connecting, loading:
# seconds) or a burst that stalls the calls. bench.capacity measures the targets (refusal
# within 50 ms, RTT p95 <= 150 ms) with server and callers in separate pinned processes.
REFUSAL_P50_MS = 100.0
REFUSAL_MAX_MS = 500.0
RTT_P50_MS = 150.0
RTT_P95_MS = 500.0
MIN_RTTS_PER_CALL = 3  # markers every 0.5 s: ~8 per call in the window; none means stalled


async def test_offers_past_max_sessions_are_refused_fast_while_admitted_calls_flow(
    registry: EngineRegistry, speech: SpeechFixture
):
    clip = EncodedClip.encode(speech.clean, with_markers=True)
    async with (
        running_server(registry, max_sessions=ADMITTED, rate_limit=0) as server,
        aiohttp.ClientSession() as http,
    ):
        calls = [LoadCaller(server.url, "echo", clip, probe=True) for _ in range(ADMITTED)]
        try:
            await asyncio.gather(*(call.connect(http) for call in calls))
            offers = await real_offers(ADMITTED * EXCESS_ROUNDS)
            await asyncio.sleep(SETTLE_S)
            # Earlier tests' garbage is this process's, not the server's: collect it now, so
            # a full collection (80-250 ms here) does not stall the shared loop in the window.
            gc.collect()
            started = time.monotonic()
            outcomes = await offer_spread(
                http, server.url, offers, "echo", OFFER_WINDOW_S, group=OFFER_GROUP
            )
            await asyncio.sleep(max(0.0, started + OFFER_WINDOW_S - time.monotonic()))
            per_call = [[r * 1000 for r in call.rtts_since(started)] for call in calls]
            live = len(server.server.sessions)
        finally:
            await asyncio.gather(*(call.close(http) for call in calls))

    answers = [(o.status, o.retry_after) for o in outcomes]
    assert all(o.refused_with_retry for o in outcomes), f"answers to excess offers: {answers}"
    assert live == ADMITTED
    times = sorted(o.response_ms for o in outcomes)
    median = percentile(times, 50)
    assert median is not None and median <= REFUSAL_P50_MS, f"refusal times (ms): {times}"
    assert times[-1] <= REFUSAL_MAX_MS, f"refusal times (ms): {times}"
    counts = [len(r) for r in per_call]
    assert min(counts) >= MIN_RTTS_PER_CALL, f"RTT samples per call during the burst: {counts}"
    rtts = [r for call in per_call for r in call]
    rtt_p50, rtt_p95 = percentile(rtts, 50), percentile(rtts, 95)
    assert rtt_p50 is not None and rtt_p50 <= RTT_P50_MS, f"RTTs (ms): {sorted(rtts)}"
    assert rtt_p95 is not None and rtt_p95 <= RTT_P95_MS, f"RTTs (ms): {sorted(rtts)}"
