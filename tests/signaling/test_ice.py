"""ICE configuration: host candidates limited to chosen addresses, servers from config only."""

from __future__ import annotations

from collections.abc import Iterator

import aioice
import aioice.ice
import pytest
from aiortc import RTCConfiguration, RTCIceServer

from signaling import ice
from signaling.ice import IceServer, restrict_host_addresses, rtc_configuration


@pytest.fixture(autouse=True)
def restore_host_addresses() -> Iterator[None]:
    """The restriction is process-wide: put back whatever was there before each test."""
    before = aioice.ice.get_host_addresses
    yield
    aioice.ice.get_host_addresses = before


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
    assert aioice.ice.get_host_addresses is not ice._original_get_host_addresses
    restrict_host_addresses([])
    assert aioice.ice.get_host_addresses is ice._original_get_host_addresses
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
    rtc = server.rtc()
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
    rtc = server.rtc()
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
