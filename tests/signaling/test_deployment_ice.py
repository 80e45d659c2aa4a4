"""Deployment ICE settings end to end: ``--rtp-port-range`` and ``--announce-ip`` on a server.

Clients in these tests run in the server's process, so they share its aioice adaptations:
offers are made before a setting that would change them takes effect, or filtered.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Iterator
from urllib.parse import urljoin

import aiohttp
import aioice.ice
import numpy as np
import pytest

from bench.common import free_port, spawned_server
from media.audio.frames import RTC_RATE
from media.engines.registry import EngineRegistry
from media.rtc.compat import announce_host_address, bind_host_ports, restrict_host_addresses
from peer.call import PeerCall
from peer.speech import SpeechFixture
from tests.conftest import LOOPBACK, running_server
from tests.signaling.nat import OneToOneNat
from tests.signaling.offers import new_offer, without_prefix
from tests.signaling.ports import free_port_block, udp_ports_bound_here

SDP = "application/sdp"
TRICKLE = "application/trickle-ice-sdpfrag"
END = "a=end-of-candidates\r\n"
PUBLIC = "127.0.0.2"  # the "public" side of the loopback NAT
DOCUMENTATION_ADDRESS = "198.51.100.20"  # RFC 5737: never a real host


@pytest.fixture(autouse=True)
def loopback_candidates() -> Iterator[None]:
    """Offers made here gather on loopback only, unchanged; everything is put back after."""
    before = (
        aioice.ice.get_host_addresses,
        aioice.ice.Connection.get_component_candidates,
        aioice.ice.Connection.local_candidates,
    )
    restrict_host_addresses([LOOPBACK])
    bind_host_ports(None)
    announce_host_address(None)
    yield
    (
        aioice.ice.get_host_addresses,
        aioice.ice.Connection.get_component_candidates,
        aioice.ice.Connection.local_candidates,
    ) = before


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def host_candidates(sdp: str) -> list[tuple[str, int]]:
    found = []
    for line in sdp.splitlines():
        if line.startswith("a=candidate:"):
            fields = line.split()
            assert fields[7] == "host", line  # no STUN/TURN server is configured
            found.append((fields[4], int(fields[5])))
    assert found, "the answer has no candidate"
    return found


async def publish(http: aiohttp.ClientSession, url: str, offer: str) -> aiohttp.ClientResponse:
    async with http.post(urljoin(url, "whip"), data=offer, headers={"Content-Type": SDP}) as r:
        await r.read()
        return r


async def test_every_session_binds_in_the_port_range_and_a_full_range_is_refused_with_503(
    registry: EngineRegistry, http: aiohttp.ClientSession
):
    low, high = free_port_block(3)
    offers = [await new_offer() for _ in range(4)]  # gathered before the range applies
    before = udp_ports_bound_here()
    async with running_server(registry, rtp_port_range=(low, high)) as server:
        answers = []
        for offer in offers[:3]:
            response = await publish(http, server.url, offer)
            assert response.status == 201, await response.text()
            answers.append((response.headers["Location"], await response.text()))
        advertised = [c for _, answer in answers for c in host_candidates(answer)]
        assert sorted(port for _, port in advertised) == [low, low + 1, high]
        opened = udp_ports_bound_here() - before
        assert opened == {(LOOPBACK, port) for port in range(low, high + 1)}

        refused = await publish(http, server.url, offers[3])
        assert refused.status == 503
        assert refused.headers["Retry-After"]
        assert (await refused.json())["error"] == "no_media_ports"
        assert len(server.server.sessions) == 3

        async with http.delete(urljoin(server.url, answers[0][0])) as deleted:
            assert deleted.status == 200
        again = await publish(http, server.url, offers[3])
        assert again.status == 201, await again.text()
        assert host_candidates(await again.text()) == host_candidates(answers[0][1])


async def test_answer_announces_the_public_address_at_the_ports_really_bound(
    registry: EngineRegistry, http: aiohttp.ClientSession
):
    offer = await new_offer()
    before = udp_ports_bound_here()
    async with running_server(registry, announce_ip=DOCUMENTATION_ADDRESS) as server:
        response = await publish(http, server.url, offer)
        assert response.status == 201, await response.text()
        answer = await response.text()
        advertised = host_candidates(answer)
        assert {address for address, _ in advertised} == {DOCUMENTATION_ADDRESS}
        assert f"c=IN IP4 {DOCUMENTATION_ADDRESS}" in answer
        opened = udp_ports_bound_here() - before
        assert {(LOOPBACK, port) for _, port in advertised} == opened


async def test_call_through_a_one_to_one_nat_reaches_the_server_at_its_announced_address(
    registry: EngineRegistry, speech: SpeechFixture
):
    """The deployment the flags are for: the server binds a private address, a NAT forwards
    the public address's range to it, and the caller only ever sees the public address.

    The caller's offer has no candidates, so the server cannot reach it first: every packet
    of the call, ICE checks, DTLS and the audio both ways, crosses the NAT, which only
    happens if the answer named the public address and the ports the NAT forwards.
    """
    low, high = free_port_block(4)
    audio = speech.clean[: 2 * RTC_RATE]
    async with (
        OneToOneNat(PUBLIC, LOOPBACK, range(low, high + 1)) as nat,
        running_server(registry, announce_ip=PUBLIC, rtp_port_range=(low, high)) as server,
    ):
        call = PeerCall(
            server.url,
            audio,
            engine="echo",
            data_channel=False,
            offer_filter=lambda sdp: without_prefix(sdp, "a=candidate:", "a=end-of-candidates"),
        )
        async with call:
            assert call.answer is not None
            for address, port in host_candidates(call.answer.sdp):
                assert address == PUBLIC and low <= port <= high
            async with asyncio.timeout(10):
                await call.source.finished.wait()
            await asyncio.sleep(0.3)  # the last frames' way back
    received = call.received()
    assert np.sqrt(np.mean(received**2)) > 0.25 * np.sqrt(np.mean(audio**2))
    # 2 s of 20 ms packets each way, plus ICE and DTLS.
    assert nat.traffic.inbound > 90 and nat.traffic.outbound > 90


@pytest.fixture
def front_with_deployment_ice() -> Iterator[tuple[str, tuple[int, int]]]:
    """``serve --workers 2`` with a port range and an announced address; yields URL, range."""
    low, high = free_port_block(4)
    port = free_port()
    command = [sys.executable, "-m", "server", "serve", "--port", str(port), "--workers", "2"]
    command += ["--engine", "echo", "--ice-host", LOOPBACK, "--announce-ip", PUBLIC]
    command += ["--rtp-port-range", f"{low}-{high}", "--spare-workers", "0"]
    with spawned_server(command, port, core=None, ready_path="engines", ready_timeout=120) as s:
        yield s.url, (low, high)


async def test_workers_apply_the_deployment_settings_and_trickle_reaches_the_owner(
    front_with_deployment_ice: tuple[str, tuple[int, int]], http: aiohttp.ClientSession
):
    """Each worker builds its own app from the same flags; the front forwards PATCH too."""
    url, (low, high) = front_with_deployment_ice
    sessions = []
    for _ in range(2):  # the front places the second session on the other worker
        response = await publish(http, url, await new_offer())
        assert response.status == 201, await response.text()
        for address, port in host_candidates(await response.text()):
            assert address == PUBLIC and low <= port <= high
        sessions.append((response.headers["Location"], response.headers["ETag"]))
    assert {location.rsplit("/", 1)[1][:3] for location, _ in sessions} == {"w0-", "w1-"}

    for location, etag in sessions:
        for if_match, status in (('"stale"', 412), (etag, 204)):
            headers = {"Content-Type": TRICKLE, "If-Match": if_match}
            async with http.patch(urljoin(url, location), data=END, headers=headers) as patched:
                assert patched.status == status, await patched.text()
        async with http.delete(urljoin(url, location)) as deleted:
            assert deleted.status == 200
