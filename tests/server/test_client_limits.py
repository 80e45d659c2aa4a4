"""No single client can take the service: a cap on the sessions one address holds.

Tried as a new user would before the cap: one address sent 70 offers and never connected;
64 were admitted in 1.4 s and every other caller got 503 ``at_capacity`` until the 15 s
ICE timeout, again and again (the rate limit allows a burst of 120).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiortc import RTCPeerConnection

from media.engines.registry import EngineRegistry
from media.rtc.compat import restrict_host_addresses
from tests.conftest import RunningServer, running_server
from tests.server.test_workers import two_workers

FLOODER = "127.0.0.1"
NEIGHBOUR = "127.0.0.2"
CAP = 3


async def half_open_offer() -> str:
    """An offer whose peer is gone before ICE can start: the session never connects."""
    pc = RTCPeerConnection()
    pc.addTransceiver("audio", direction="sendrecv")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


@pytest.fixture
async def from_addresses() -> AsyncIterator[dict[str, aiohttp.ClientSession]]:
    """HTTP clients whose connections come from two loopback addresses."""
    clients = {
        address: aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(address, 0)))
        for address in (FLOODER, NEIGHBOUR)
    }
    yield clients
    for client in clients.values():
        await client.close()


async def offer(http: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None):
    body = {"sdp": await half_open_offer(), "type": "offer", "engine": "echo"}
    async with http.post(url + "offer", json=body, headers=headers or {}) as response:
        return response.status, dict(response.headers), await response.json()


@pytest.fixture
async def capped(registry: EngineRegistry) -> AsyncIterator[RunningServer]:
    restrict_host_addresses(["127.0.0.1"])
    async with running_server(
        registry, max_client_sessions=CAP, ice_timeout=2.0, max_sessions=20
    ) as server:
        yield server


async def test_an_address_at_its_cap_gets_429_and_another_address_is_admitted(
    capped: RunningServer, from_addresses: dict[str, aiohttp.ClientSession]
):
    flooder, neighbour = from_addresses[FLOODER], from_addresses[NEIGHBOUR]
    for _ in range(CAP):
        status, _, _ = await offer(flooder, capped.url)
        assert status == 200
    status, headers, body = await offer(flooder, capped.url)
    assert (status, body["error"]) == (429, "client_session_limit")
    assert int(headers["Retry-After"]) > 0
    status, _, _ = await offer(neighbour, capped.url)
    assert status == 200
    assert len(capped.server.sessions) == CAP + 1


async def test_sessions_that_never_connect_stop_counting_when_ice_gives_up(
    capped: RunningServer, from_addresses: dict[str, aiohttp.ClientSession]
):
    flooder = from_addresses[FLOODER]
    for _ in range(CAP):
        assert (await offer(flooder, capped.url))[0] == 200
    assert (await offer(flooder, capped.url))[0] == 429
    deadline = time.monotonic() + 5
    while capped.server.sessions.client_sessions(FLOODER) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert capped.server.sessions.client_sessions(FLOODER) == 0  # within the 2 s ICE timeout
    assert (await offer(flooder, capped.url))[0] == 200


async def test_the_proxy_header_decides_the_address_only_when_trusted(
    registry: EngineRegistry, from_addresses: dict[str, aiohttp.ClientSession]
):
    restrict_host_addresses(["127.0.0.1"])
    proxy = from_addresses[FLOODER]  # every request through one proxy address
    forwarded = [{"X-Forwarded-For": f"203.0.113.{n}, 10.0.0.{n}"} for n in range(CAP + 1)]
    async with running_server(registry, max_client_sessions=CAP, max_sessions=20) as plain:
        statuses = [(await offer(proxy, plain.url, h))[0] for h in forwarded]
    assert statuses == [200] * CAP + [429]  # the header is ignored: all one client
    async with running_server(
        registry,
        max_client_sessions=CAP,
        max_sessions=20,
        client_address_header="X-Forwarded-For",
    ) as behind_proxy:
        statuses = [(await offer(proxy, behind_proxy.url, h))[0] for h in forwarded]
        assert statuses == [200] * (CAP + 1)  # the last entry (the proxy's) differs each time
        keys = set(behind_proxy.server.sessions.sessions_by_client())
    assert keys == {f"10.0.0.{n}" for n in range(CAP + 1)}


async def test_behind_the_front_a_flooding_address_cannot_make_another_wait(
    from_addresses: dict[str, aiohttp.ClientSession],
):
    """Two workers: the front counts each address's sessions across both of them."""
    restrict_host_addresses(["127.0.0.1"])
    flooder, neighbour = from_addresses[FLOODER], from_addresses[NEIGHBOUR]
    with two_workers(20, "--max-client-sessions", str(CAP), "--ice-timeout", "3") as front:
        stop = asyncio.Event()

        async def flood() -> list[int]:
            statuses = []
            while not stop.is_set():
                statuses.append((await offer(flooder, front.url))[0])
            return statuses

        flooding = asyncio.create_task(flood())
        await asyncio.sleep(1.0)
        neighbour_statuses = [(await offer(neighbour, front.url))[0] for _ in range(CAP)]
        stop.set()
        flooded = await flooding
    assert neighbour_statuses == [200] * CAP
    assert flooded.count(200) <= CAP + 1  # one may slip in while a load reading is stale
    assert set(flooded) <= {200, 429}
