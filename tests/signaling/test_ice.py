"""ICE configuration: host candidates limited to chosen addresses, bound to a port range and
announced at a public address; servers from config only."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import aioice
import aioice.ice
import pytest
from aioice import stun
from aiortc import RTCConfiguration, RTCIceServer

from media.rtc import compat
from media.rtc.compat import announce_host_address, bind_host_ports, restrict_host_addresses
from media.rtc.ice import NoMediaPorts, rtc_configuration
from signaling.ice import (
    IceServer,
)
from tests.signaling.ports import free_port_block


@pytest.fixture(autouse=True)
def restore_host_candidates() -> Iterator[None]:
    """The adaptations are process-wide: put back whatever was there before each test."""
    before = (
        aioice.ice.get_host_addresses,
        aioice.ice.Connection.get_component_candidates,
        aioice.ice.Connection.local_candidates,
    )
    yield
    (
        aioice.ice.get_host_addresses,
        aioice.ice.Connection.get_component_candidates,
        aioice.ice.Connection.local_candidates,
    ) = before


async def gather_hosts() -> list[str]:
    conn = aioice.Connection(ice_controlling=True)
    try:
        await conn.gather_candidates()
        candidates = list(conn.local_candidates)
    finally:
        await conn.close()
    assert candidates, "no candidates gathered"
    assert {c.type for c in candidates} == {"host"}  # no STUN/TURN server configured
    return [c.host for c in candidates]


async def test_restriction_gathers_only_loopback():
    restrict_host_addresses(["127.0.0.1"])
    hosts = await gather_hosts()
    assert set(hosts) == {"127.0.0.1"}


def test_restriction_filters_by_address_family_and_drops_duplicates():
    restrict_host_addresses(["127.0.0.1", "::1", "127.0.0.1", "10.1.2.3"])
    lookup = aioice.ice.get_host_addresses
    assert lookup(use_ipv4=True, use_ipv6=True) == ["127.0.0.1", "::1", "10.1.2.3"]
    assert lookup(use_ipv4=True, use_ipv6=False) == ["127.0.0.1", "10.1.2.3"]
    assert lookup(use_ipv4=False, use_ipv6=True) == ["::1"]
    assert lookup(use_ipv4=False, use_ipv6=False) == []


def test_empty_list_restores_aioice_default():
    restrict_host_addresses(["127.0.0.1"])
    assert aioice.ice.get_host_addresses is not compat._stock_get_host_addresses
    restrict_host_addresses([])
    assert aioice.ice.get_host_addresses is compat._stock_get_host_addresses
    # aioice's own lookup never offers loopback.
    assert "127.0.0.1" not in aioice.ice.get_host_addresses(use_ipv4=True, use_ipv6=False)


@pytest.mark.parametrize("bad", ["localhost", "127.0.0.300", "", "fe80::1%eth0%", "1.2.3"])
def test_bad_address_raises_and_changes_nothing(bad: str):
    restrict_host_addresses(["127.0.0.1"])
    current = aioice.ice.get_host_addresses
    with pytest.raises(ValueError):
        restrict_host_addresses(["127.0.0.1", bad])
    assert aioice.ice.get_host_addresses is current


def test_parse_stun():
    server = IceServer.parse("stun:stun.example.net:3478")
    assert server == IceServer("stun:stun.example.net:3478")
    assert server.username is None and server.credential is None
    assert server.link_header() == '<stun:stun.example.net:3478>; rel="ice-server"'
    rtc = rtc_configuration([server]).iceServers[0]
    assert isinstance(rtc, RTCIceServer)
    assert rtc.urls == "stun:stun.example.net:3478"
    assert rtc.username is None and rtc.credential is None


def test_parse_stun_without_port_and_stuns():
    assert IceServer.parse("stun:stun.example.net").url == "stun:stun.example.net"
    assert IceServer.parse("stuns:stun.example.net:5349").url == "stuns:stun.example.net:5349"


def test_parse_turn_with_credentials():
    server = IceServer.parse("turn:alice:secret@turn.example.net:3478")
    assert server == IceServer("turn:turn.example.net:3478", "alice", "secret")
    assert server.link_header() == (
        '<turn:turn.example.net:3478>; rel="ice-server"; username="alice"; '
        'credential="secret"; credential-type="password"'
    )
    rtc = rtc_configuration([server]).iceServers[0]
    assert (rtc.urls, rtc.username, rtc.credential) == (
        "turn:turn.example.net:3478",
        "alice",
        "secret",
    )


def test_parse_turn_with_encoded_credentials_and_transport():
    server = IceServer.parse("turns:al%40ice:p%3As%40ss@turn.example.net:5349?transport=tcp")
    assert server.url == "turns:turn.example.net:5349?transport=tcp"
    assert server.username == "al@ice"
    assert server.credential == "p:s@ss"


def test_parse_turn_without_credentials():
    server = IceServer.parse("turn:turn.example.net:3478")
    assert server.username is None and server.credential is None


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "stun",
        "stun:",
        "turn:",
        "stun.example.net:3478",
        "http://stun.example.net",
        "udp:stun.example.net:3478",
        "garbage",
    ],
)
def test_parse_rejects_garbage(garbage: str):
    with pytest.raises(ValueError, match="ICE server URL"):
        IceServer.parse(garbage)


def test_rtc_configuration_never_falls_back_to_a_public_server():
    config = rtc_configuration([])
    assert isinstance(config, RTCConfiguration)
    assert config.iceServers == []
    # aiortc's own default, for contrast: None means "use a public STUN server".
    assert RTCConfiguration().iceServers is None


def test_rtc_configuration_carries_configured_servers():
    servers = [
        IceServer.parse("stun:stun.example.net:3478"),
        IceServer.parse("turn:alice:secret@turn.example.net:3478"),
    ]
    config = rtc_configuration(servers)
    assert [(s.urls, s.username, s.credential) for s in config.iceServers] == [
        ("stun:stun.example.net:3478", None, None),
        ("turn:turn.example.net:3478", "alice", "secret"),
    ]


async def gathered(stun_server: tuple[str, int] | None = None) -> aioice.Connection:
    conn = aioice.Connection(ice_controlling=True, stun_server=stun_server)
    await conn.gather_candidates()
    return conn


def bound_port(conn: aioice.Connection) -> int:
    """The port the connection's one host socket is really bound to."""
    (protocol,) = conn._protocols
    return protocol.transport.get_extra_info("sockname")[1]


async def test_port_range_binds_every_host_candidate_inside_it_until_full():
    restrict_host_addresses(["127.0.0.1"])
    low, high = free_port_block(4)
    bind_host_ports((low, high))
    conns = [await gathered() for _ in range(4)]
    try:
        ports = [c.local_candidates[0].port for c in conns]
        assert sorted(ports) == list(range(low, high + 1))  # each port once, none outside
        assert [bound_port(c) for c in conns] == ports
        with pytest.raises(NoMediaPorts) as refused:
            await gathered()
        assert refused.value.retry_after_s > 0
        assert f"{low}-{high}" in str(refused.value)

        await conns.pop(1).close()  # a call ends: its port serves the next one
        again = await gathered()
        conns.append(again)
        assert again.local_candidates[0].port == ports[1]
    finally:
        for conn in conns:
            await conn.close()


async def test_port_range_skips_ports_other_programs_hold():
    restrict_host_addresses(["127.0.0.1"])
    low, high = free_port_block(3)
    holder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    holder.bind(("127.0.0.1", low + 1))
    bind_host_ports((low, high))
    try:
        conns = [await gathered() for _ in range(2)]
        assert {c.local_candidates[0].port for c in conns} == {low, high}
        for conn in conns:
            await conn.close()
    finally:
        holder.close()


async def test_a_full_range_leaves_no_socket_behind():
    """A refused gathering must not keep the sockets it bound on earlier addresses."""
    restrict_host_addresses(["127.0.0.1", "127.0.0.2"])
    low, high = free_port_block(1)
    holder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    holder.bind(("127.0.0.2", low))
    bind_host_ports((low, high))
    try:
        with pytest.raises(NoMediaPorts, match=r"on 127\.0\.0\.2"):
            await gathered()
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        probe.bind(("127.0.0.1", low))  # would raise EADDRINUSE had the first socket leaked
        probe.close()
    finally:
        holder.close()


async def test_port_range_keeps_stun_discovery_through_the_same_socket():
    """Server-reflexive discovery runs through the in-range host socket, as aioice's does."""
    restrict_host_addresses(["127.0.0.1"])
    low, high = free_port_block(2)
    bind_host_ports((low, high))
    loop = asyncio.get_running_loop()
    stun, _ = await loop.create_datagram_endpoint(StunEcho, local_addr=("127.0.0.1", 0))
    try:
        conn = await gathered(stun_server=stun.get_extra_info("sockname"))
        try:
            kinds = {c.type: c for c in conn.local_candidates}
            assert set(kinds) == {"host", "srflx"}
            assert kinds["srflx"].port == kinds["host"].port
            assert low <= kinds["host"].port <= high
            assert kinds["srflx"].related_port == kinds["host"].port
        finally:
            await conn.close()
    finally:
        stun.close()


class StunEcho(asyncio.DatagramProtocol):
    """A one-method STUN server: answers a binding request with the sender's address."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        request = stun.parse_message(data)
        response = stun.Message(
            message_method=stun.Method.BINDING,
            message_class=stun.Class.RESPONSE,
            transaction_id=request.transaction_id,
        )
        response.attributes["XOR-MAPPED-ADDRESS"] = addr
        self.transport.sendto(bytes(response), addr)


def test_no_port_range_restores_aioice_binding():
    bind_host_ports((40000, 40010))
    assert (
        aioice.ice.Connection.get_component_candidates is not compat._stock_get_component_candidates
    )
    bind_host_ports(None)
    assert aioice.ice.Connection.get_component_candidates is compat._stock_get_component_candidates


@pytest.mark.parametrize("bad", [(0, 10), (20, 10), (60000, 70000)])
def test_bad_port_range_raises(bad: tuple[int, int]):
    with pytest.raises(ValueError, match="port range"):
        bind_host_ports(bad)


async def test_announced_address_replaces_host_addresses_but_not_the_sockets():
    restrict_host_addresses(["127.0.0.1"])
    announce_host_address("203.0.113.7")
    conn = await gathered()
    try:
        (signalled,) = conn.local_candidates
        (protocol,) = conn._protocols
        real = protocol.local_candidate
        assert signalled.host == "203.0.113.7"
        assert (real.host, real.port) == protocol.transport.get_extra_info("sockname")
        assert real.host == "127.0.0.1"
        assert (signalled.port, signalled.foundation, signalled.priority) == (
            real.port,
            real.foundation,
            real.priority,
        )
    finally:
        await conn.close()


async def test_announced_address_leaves_other_families_alone():
    restrict_host_addresses(["127.0.0.1"])
    announce_host_address("2001:db8::7")
    conn = await gathered()
    try:
        assert [c.host for c in conn.local_candidates] == ["127.0.0.1"]
    finally:
        await conn.close()


async def test_reflexive_candidate_equal_to_the_announced_one_is_dropped():
    """Behind a 1:1 NAT, STUN reports the announced address and port: one candidate, not two."""
    restrict_host_addresses(["127.0.0.1"])
    announce_host_address("127.0.0.1")  # what the loopback STUN echo reports, too
    loop = asyncio.get_running_loop()
    stun, _ = await loop.create_datagram_endpoint(StunEcho, local_addr=("127.0.0.1", 0))
    try:
        conn = await gathered(stun_server=stun.get_extra_info("sockname"))
        try:
            assert [c.type for c in conn.local_candidates] == ["host"]
        finally:
            await conn.close()
    finally:
        stun.close()


def test_no_announced_address_restores_aioice_candidates():
    announce_host_address("203.0.113.7")
    assert aioice.ice.Connection.local_candidates is not compat._stock_local_candidates
    announce_host_address(None)
    assert aioice.ice.Connection.local_candidates is compat._stock_local_candidates


def test_bad_announced_address_raises():
    with pytest.raises(ValueError):
        announce_host_address("public.example.net")
