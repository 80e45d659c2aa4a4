"""Offers sent to a server that is already full, each timed to its response.

A server at ``--max-sessions`` must refuse a new offer at once, with 503 and Retry-After: a
refusal that waits behind media work leaves the caller hanging when another server could
take the call, and an offer that is admitted anyway overloads the calls already there.
bench.capacity uses this for its overload phase, tests/integration/test_overload.py for its
bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin

import aiohttp
from aiortc import RTCPeerConnection

from bench.common import percentile
from media.rtc.ice import rtc_configuration

OFFER_GROUP = 5  # offers sent at once; groups are spread evenly over the offering window


@dataclass(frozen=True)
class OfferOutcome:
    """What one offer got back: status, Retry-After and the time to the response headers."""

    status: int
    retry_after: str | None
    response_ms: float
    session_id: str | None

    @property
    def refused_with_retry(self) -> bool:
        return self.status == 503 and self.retry_after is not None


async def real_offers(count: int) -> list[str]:
    """SDP offers from real peer connections, closed again once their offer is made.

    A refused offer needs no peer behind it, so the clients' cost of making peers stays out
    of the timed part; an offer the server wrongly admits simply never connects.
    """
    offers = []
    for _ in range(count):
        pc = RTCPeerConnection(rtc_configuration([]))
        pc.addTransceiver("audio", direction="sendrecv")
        await pc.setLocalDescription(await pc.createOffer())
        offers.append(pc.localDescription.sdp)
        await pc.close()
    return offers


async def timed_offer(http: aiohttp.ClientSession, url: str, sdp: str, engine: str) -> OfferOutcome:
    """POST one offer; the clock stops when the response's headers are in."""
    payload = {"sdp": sdp, "type": "offer", "engine": engine}
    started = time.perf_counter()
    async with http.post(urljoin(url, "offer"), json=payload) as response:
        elapsed_ms = (time.perf_counter() - started) * 1000
        body = await response.json(content_type=None)
    session_id = body.get("session_id") if response.status == 200 else None
    return OfferOutcome(
        response.status, response.headers.get("Retry-After"), round(elapsed_ms, 2), session_id
    )


async def offer_spread(
    http: aiohttp.ClientSession,
    url: str,
    offers: Sequence[str],
    engine: str,
    seconds: float,
    group: int = OFFER_GROUP,
) -> list[OfferOutcome]:
    """Send ``offers`` in concurrent groups spread evenly over ``seconds``.

    Any offer the server admits is ended straight away (DELETE), so a wrong admission is
    counted, not left to load the server for the rest of the run.
    """
    groups = [offers[start : start + group] for start in range(0, len(offers), group)]
    gap = seconds / max(len(groups), 1)
    outcomes: list[OfferOutcome] = []
    started = time.monotonic()
    for index, batch in enumerate(groups):
        await asyncio.sleep(max(0.0, started + index * gap - time.monotonic()))
        outcomes += await asyncio.gather(*(timed_offer(http, url, sdp, engine) for sdp in batch))
    for outcome in outcomes:
        if outcome.session_id is not None:
            with contextlib.suppress(aiohttp.ClientError):
                await http.delete(urljoin(url, f"sessions/{outcome.session_id}"))
    return outcomes


def summarise(outcomes: Sequence[OfferOutcome]) -> dict[str, Any]:
    """Counts by kind of answer and the refusal times, for a table row and the JSON."""
    refused = [o for o in outcomes if o.refused_with_retry]
    times = [o.response_ms for o in refused]
    return {
        "offered": len(outcomes),
        "refused_503_retry_after": len(refused),
        "admitted_over_limit": sum(1 for o in outcomes if o.status == 200),
        # Anything else: an error status, or a 503 that does not say when to retry.
        "other_answers": [
            o.status for o in outcomes if o.status != 200 and not o.refused_with_retry
        ],
        "refusal_ms_p50": percentile(times, 50),
        "refusal_ms_p95": percentile(times, 95),
        "refusal_ms_max": round(max(times), 2) if times else None,
    }
