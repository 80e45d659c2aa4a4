"""A cluster of three nodes coordinated through a real Redis, exercised as callers use it."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import redis.asyncio as aioredis

from bench.cluster import Node, RedisServer, cluster_of, start_node, wait_until_serving
from bench.common import free_port
from bench.overload import real_offers
from media.rtc.compat import restrict_host_addresses
from peer.call import PeerCall
from peer.socket_call import SocketCall
from signaling.client import SignalingError

ICE_TIMEOUT = ("--ice-timeout", "5")  # half-open offers free their slot soon
EXCLUDED_WITHIN_S = 2.0


@pytest.fixture(autouse=True)
def loopback_candidates() -> None:
    restrict_host_addresses(["127.0.0.1"])


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def post_offer(http: aiohttp.ClientSession, node: Node, sdp: str) -> tuple[int, Any]:
    async with http.post(node.url + "offer", json={"sdp": sdp, "type": "offer"}) as response:
        return response.status, await response.json()


def owner(session_id: str) -> str:
    return session_id.split(".", 1)[0]


async def cluster_view(http: aiohttp.ClientSession, node: Node) -> dict[str, dict[str, Any]]:
    async with http.get(node.url + "cluster") as response:
        assert response.status == 200, await response.text()
        return {n["node_id"]: n for n in (await response.json())["nodes"]}


def tone(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * 48_000)) / 48_000
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


async def test_thirty_calls_offered_at_one_node_spread_over_all_three(
    redis_server: RedisServer, http: aiohttp.ClientSession
):
    with cluster_of(redis_server, [12, 12, 12], *ICE_TIMEOUT) as nodes:
        offers = await real_offers(30)
        replies = []
        for group in range(0, 30, 10):  # bursts of ten at once
            batch = offers[group : group + 10]
            replies += await asyncio.gather(*(post_offer(http, nodes[0], s) for s in batch))
    assert all(status == 200 for status, _ in replies), replies
    spread = Counter(owner(body["session_id"]) for _, body in replies)
    assert set(spread) == {"n2", "n3", "n4"}
    assert max(spread.values()) - min(spread.values()) <= 2, spread


async def test_every_route_works_through_a_node_that_does_not_own_the_session(
    redis_server: RedisServer, http: aiohttp.ClientSession
):
    with cluster_of(redis_server, [4, 4, 4]) as nodes:
        by_id = {node.node_id: node for node in nodes}
        async with PeerCall(nodes[0].url, tone(6), engine="echo") as call:
            assert call.session_id is not None
            home = owner(call.session_id)
            stranger = next(n for n in nodes if n.node_id != home)
            route = f"{stranger.url}sessions/{call.session_id}"
            async with http.get(route) as described:
                assert described.status == 200
                assert (await described.json())["session_id"] == call.session_id
            async with http.post(route + "/speak", json={"text": "hi"}) as speak:
                # Reached the owner: it answers for its echo session, not "not found".
                assert (speak.status, (await speak.json())["error"]) == (400, "not_a_speak_session")
            async with http.post(route + "/interrupt", json={"type": "interrupt"}) as stop:
                assert (stop.status, (await stop.json())["error"]) == (400, "not_a_speak_session")
            async with http.get(route + "/events") as events:
                assert events.content_type == "text/event-stream"
                assert (await events.content.readline()).startswith(b": connected")
            # A resume offered at a node that does not own the session reaches the owner,
            # and the call continues there under the same id.
            assert call.answer is not None
            async with PeerCall(stranger.url, tone(2), resume=call.answer.resume) as resumed:
                assert resumed.session_id == call.session_id
                async with http.get(by_id[home].url + f"sessions/{call.session_id}") as there:
                    assert (await there.json())["resumes"] == 1
                async with http.delete(route) as deleted:
                    assert deleted.status == 200
            async with http.get(by_id[home].url + f"sessions/{call.session_id}") as gone:
                assert gone.status == 404

        # WHIP: published at one node, trickled to and ended through another.
        publisher = PeerCall(nodes[1].url, tone(4), engine="echo", whip=True)
        try:
            await publisher.connect()
            assert publisher.answer is not None and publisher.session_id is not None
            home = owner(publisher.session_id)
            stranger = next(n for n in nodes if n.node_id not in (home, nodes[1].node_id))
            resource = f"{stranger.url}whip/sessions/{publisher.session_id}"
            # New credentials ask for an ICE restart: the owner's own refusal proves the PATCH
            # reached it (a node without the session would answer 404).
            fragment = (
                "a=ice-ufrag:abcd\r\na=ice-pwd:abcdefghijklmnopqrstuvwx\r\n"
                "m=audio 9 UDP/TLS/RTP/SAVPF 0\r\na=mid:0\r\n"
            )
            async with http.patch(
                resource,
                data=fragment,
                headers={"Content-Type": "application/trickle-ice-sdpfrag", "If-Match": "*"},
            ) as patched:
                assert (await patched.json())["error"] == "ice_restart_unsupported"
            async with http.delete(resource) as deleted:
                assert deleted.status == 200
        finally:
            await publisher.close()


async def test_twenty_concurrent_offers_for_the_last_five_slots_admit_exactly_five(
    redis_server: RedisServer, http: aiohttp.ClientSession
):
    with cluster_of(redis_server, [2, 2, 1], *ICE_TIMEOUT) as nodes:
        offers = await real_offers(20)
        replies = await asyncio.gather(
            *(post_offer(http, nodes[i % 3], sdp) for i, sdp in enumerate(offers))
        )
    statuses = Counter(status for status, _ in replies)
    assert statuses == {200: 5, 503: 15}, statuses
    refused = [body for status, body in replies if status == 503]
    assert {body["error"] for body in refused} == {"at_capacity"}
    admitted = Counter(owner(body["session_id"]) for status, body in replies if status == 200)
    assert admitted == {"n2": 2, "n3": 2, "n4": 1}


async def test_a_drained_node_takes_no_new_sessions_and_its_call_goes_on(
    redis_server: RedisServer, http: aiohttp.ClientSession
):
    with cluster_of(redis_server, [8, 8, 8], *ICE_TIMEOUT) as nodes:
        async with PeerCall(nodes[0].url, tone(10), engine="echo") as call:
            assert call.session_id is not None
            home = next(n for n in nodes if n.node_id == owner(call.session_id))
            async with http.post(home.url + "admin/drain") as drained:
                assert drained.status == 202
            view = await cluster_view(http, nodes[0])
            assert view[home.node_id]["draining"] is True
            before = len(call.received())
            offers = await real_offers(10)
            replies = await asyncio.gather(*(post_offer(http, home, sdp) for sdp in offers))
            await asyncio.sleep(1.0)
            after = len(call.received())
    placed = Counter(owner(body["session_id"]) for status, body in replies if status == 200)
    assert sum(placed.values()) == 10 and home.node_id not in placed, placed
    assert after - before >= 0.8 * 48_000  # the drained node's call kept flowing


async def test_a_killed_node_is_out_of_placement_within_two_seconds(
    redis_server: RedisServer, http: aiohttp.ClientSession
):
    with cluster_of(redis_server, [8, 8, 8], *ICE_TIMEOUT) as nodes:
        victim = nodes[2]
        offers = await real_offers(3)
        placed = [await post_offer(http, nodes[0], sdp) for sdp in offers]
        victims_session = next(
            body["session_id"] for _, body in placed if owner(body["session_id"]) == victim.node_id
        )
        os.kill(victim.process.pid, signal.SIGKILL)
        killed = time.monotonic()
        while victim.node_id in await cluster_view(http, nodes[0]):
            assert time.monotonic() - killed < EXCLUDED_WITHIN_S + 0.5
            await asyncio.sleep(0.05)
        excluded_after = time.monotonic() - killed
        began = time.monotonic()
        async with http.get(nodes[0].url + f"sessions/{victims_session}") as gone:
            assert gone.status == 404
            assert (await gone.json())["error"] == "session_not_found"
        answered_in = time.monotonic() - began
        more = await real_offers(6)
        replies = [await post_offer(http, nodes[1], sdp) for sdp in more]
    assert excluded_after <= EXCLUDED_WITHIN_S
    assert answered_in < 1.0
    assert all(status == 200 for status, _ in replies)
    assert victim.node_id not in {owner(body["session_id"]) for _, body in replies}


async def test_redis_down_keeps_calls_going_and_admits_locally_until_it_returns(
    redis_server: RedisServer, http: aiohttp.ClientSession
):
    with cluster_of(redis_server, [8, 8, 8], *ICE_TIMEOUT) as nodes:
        async with PeerCall(nodes[0].url, tone(12), engine="echo") as call:
            redis_server.kill()
            before = len(call.received())
            local = [await post_offer(http, nodes[1], sdp) for sdp in await real_offers(3)]
            await asyncio.sleep(1.0)
            during = len(call.received())
            redis_server.start()
            await asyncio.sleep(1.5)  # every node's next heartbeats rejoin
            view = await cluster_view(http, nodes[0])
            resumed = [await post_offer(http, nodes[1], sdp) for sdp in await real_offers(6)]
        log = nodes[1].log()
    assert during - before >= 0.8 * 48_000  # the live call never noticed
    assert [status for status, _ in local] == [200, 200, 200]
    assert {owner(body["session_id"]) for _, body in local} == {nodes[1].node_id}
    assert set(view) == {"n2", "n3", "n4"}
    assert all(status == 200 for status, _ in resumed)
    assert len({owner(body["session_id"]) for _, body in resumed}) >= 2  # placed again
    assert "Redis unavailable" in log and "Redis is back" in log


async def test_a_flooding_address_cannot_make_another_wait_across_the_cluster(
    redis_server: RedisServer,
):
    cap = 3
    flooder = aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=("127.0.0.1", 0)))
    neighbour = aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=("127.0.0.9", 0)))
    try:
        with cluster_of(
            redis_server, [10, 10, 10], "--max-client-sessions", str(cap), *ICE_TIMEOUT
        ) as nodes:
            offers = await real_offers(12)
            flooded = [
                (await post_offer(flooder, nodes[i % 3], sdp))[0] for i, sdp in enumerate(offers)
            ]
            theirs = [
                (await post_offer(neighbour, nodes[i % 3], sdp))[0]
                for i, sdp in enumerate(await real_offers(cap))
            ]
    finally:
        await flooder.close()
        await neighbour.close()
    assert flooded.count(200) == cap and set(flooded) == {200, 429}
    assert theirs == [200] * cap


async def test_a_rolling_restart_of_every_node_refuses_nothing(
    redis_server: RedisServer, http: aiohttp.ClientSession, tmp_path: Path
):
    """Each node in turn gets SIGTERM (it marks itself draining in Redis at once, finishes
    its sessions, exits) and is started again, while offers keep coming at the others, as a
    load balancer would send them: every offer is admitted, none on a draining node."""
    # Each offer never connects and holds its slot for the ICE timeout (5 s): at one offer
    # per ~0.4 s the two serving nodes hold ~13, well within their 40 slots.
    with cluster_of(redis_server, [20, 20, 20], *ICE_TIMEOUT, "--drain-timeout", "3") as nodes:
        offers = await real_offers(60)
        replies: list[tuple[int, Any, str]] = []
        restarting: list[Node] = []
        draining: set[str] = set()  # between SIGTERM and the old process's exit

        async def offer_at_the_others() -> None:
            while offers:
                down = restarting[0].node_id if restarting else None
                entry = next(n for n in nodes[len(replies) % 3 :] + nodes if n.node_id != down)
                drained = ",".join(draining)  # as the offer leaves: it may only be placed
                status, body = await post_offer(http, entry, offers.pop())
                replies.append((status, body, drained))  # on a node not draining then
                await asyncio.sleep(0.4)

        offering = asyncio.create_task(offer_at_the_others())
        loop = asyncio.get_running_loop()
        try:
            for position in range(3):
                node = nodes[position]
                restarting[:] = [node]
                draining.add(node.node_id)
                node.process.send_signal(signal.SIGTERM)
                await loop.run_in_executor(None, node.process.wait, 30)
                await asyncio.sleep(0.3)  # offers sent before the exit have been answered
                draining.discard(node.node_id)
                nodes[position] = start_node(
                    node.index, redis_server, tmp_path, "--max-sessions", "20", *ICE_TIMEOUT
                )
                await loop.run_in_executor(None, wait_until_serving, [nodes[position]])
                restarting.clear()
        finally:
            offering.cancel()
            await asyncio.gather(offering, return_exceptions=True)
    refused = [(status, body) for status, body, _ in replies if status != 200]
    assert not refused, refused
    assert len(replies) >= 15, len(replies)
    for _, body, drained in replies:
        assert owner(body["session_id"]) not in drained.split(","), (body, drained)


async def test_an_offer_placed_on_a_node_that_vanished_is_placed_again(
    redis_server: RedisServer, http: aiohttp.ClientSession
):
    """A node gone before its record expired (here: a record that looks idle and roomy, at
    an address nothing listens on, so placement picks it first) costs the caller nothing:
    the offer is placed again on a live node."""
    with cluster_of(redis_server, [6, 6, 6], *ICE_TIMEOUT) as nodes:
        ghost_url = f"http://127.0.0.1:{free_port()}/"
        store = aioredis.from_url(redis_server.url)
        try:
            await store.hset(
                "cosyrtc:node:ghost",
                mapping={"url": ghost_url, "capacity": 1000, "live": 0, "cpu": 0,
                         "engines": "echo,denoise,piper", "draining": 0},
            )  # fmt: skip
            await store.sadd("cosyrtc:nodes", "ghost")
            replies = [await post_offer(http, nodes[0], sdp) for sdp in await real_offers(4)]
        finally:
            await store.aclose()
    assert [status for status, _ in replies] == [200] * 4, replies
    assert {owner(body["session_id"]) for _, body in replies} <= {"n2", "n3", "n4"}


async def test_a_socket_session_resumes_through_a_node_that_does_not_own_it(
    redis_server: RedisServer,
):
    """A WebSocket session opened at one node, its socket cut, resumed with a hello sent to
    another node: relayed to the owner, the same session continues."""
    with cluster_of(redis_server, [4, 4, 4]) as nodes:
        first = SocketCall(nodes[0].url, tone(10), engine="echo")
        await first.connect()
        await asyncio.sleep(1.0)
        assert first.session_id is not None and owner(first.session_id) == nodes[0].node_id
        resume = first.resume_info()
        await first.cut()
        await asyncio.sleep(0.5)
        async with SocketCall(nodes[2].url, tone(10), engine="echo", resume=resume) as second:
            assert second.ready is not None and second.ready["resumed"] is True
            assert second.session_id == first.session_id
            await asyncio.sleep(1.0)
            assert len(second.received()) > 48_000 // 2  # audio flows through the relay
            assert await second.end() == 200
        stale = SocketCall(nodes[1].url, tone(1), engine="echo", resume=resume)
        with pytest.raises(SignalingError) as refused:  # hung up: nothing to resume
            await stale.connect()
        await stale.close()
        assert refused.value.code == "session_not_found"
