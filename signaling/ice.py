"""ICE configuration: servers from config only, and the host candidates a deployment needs.

aiortc falls back to a public STUN server when given no configuration, so the server always
passes an explicit (possibly empty) list. aioice has no options for its host candidates, so
three process-wide adaptations of aioice live here, each undone by passing ``[]`` or None:

- ``restrict_host_addresses``: aioice gathers on every local address except 127.0.0.1; this
  replaces its address lookup with a fixed list (e.g. ``127.0.0.1`` for loopback calls).
- ``bind_host_ports``: aioice binds host candidates to port 0 (any ephemeral port); this
  binds them within a range a firewall can open.
- ``announce_host_address``: behind a 1:1 NAT the bound address is private; this signals
  the public one instead. Only what aioice hands out for signaling changes: its sockets,
  pairs and checks keep the real address, so the NAT's forwarding is all it takes.
"""

from __future__ import annotations

import asyncio
import copy
import errno
import ipaddress
import logging
import random
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from urllib.parse import unquote

import aioice.ice
import aioice.turn
from aioice import Candidate
from aioice.candidate import candidate_foundation, candidate_priority
from aiortc import RTCConfiguration, RTCIceServer

from signaling.errors import ApiError

log = logging.getLogger(__name__)

_SCHEMES = ("stun", "stuns", "turn", "turns")
# Failed binds cost ~20 us each: give the event loop a turn this often while scanning a range.
_BINDS_PER_YIELD = 32
_RETRY_AFTER_SECONDS = 2
_original_get_host_addresses: Callable[[bool, bool], list[str]] = aioice.ice.get_host_addresses
_original_get_component_candidates = aioice.ice.Connection.get_component_candidates
_original_local_candidates: property = aioice.ice.Connection.local_candidates


@dataclass(frozen=True)
class IceServer:
    """One STUN/TURN server; credentials may be written in the URL as ``turn:user:pass@host``."""

    url: str
    username: str | None = None
    credential: str | None = None

    @classmethod
    def parse(cls, text: str) -> IceServer:
        scheme, sep, rest = text.partition(":")
        if not sep or scheme.lower() not in _SCHEMES or not rest:
            raise ValueError(
                f"ICE server URL must look like stun:HOST[:PORT] or turn:...: {text!r}"
            )
        if "@" in rest:
            userinfo, _, hostpart = rest.rpartition("@")
            user, _, password = userinfo.partition(":")
            return cls(f"{scheme}:{hostpart}", unquote(user), unquote(password))
        return cls(text)

    def rtc(self) -> RTCIceServer:
        return RTCIceServer(urls=self.url, username=self.username, credential=self.credential)

    def link_header(self) -> str:
        """The RFC 9725 ``Link`` header value advertising this server to WHIP clients."""
        value = f'<{self.url}>; rel="ice-server"'
        if self.username is not None:
            value += f'; username="{self.username}"; credential="{self.credential or ""}"'
            value += '; credential-type="password"'
        return value


def rtc_configuration(servers: Sequence[IceServer]) -> RTCConfiguration:
    """An explicit configuration: an empty list means no STUN/TURN, never aiortc's default."""
    return RTCConfiguration(iceServers=[server.rtc() for server in servers])


def restrict_host_addresses(addresses: Sequence[str]) -> None:
    """Gather host candidates only on ``addresses`` (empty: aioice's default behaviour)."""
    if not addresses:
        aioice.ice.get_host_addresses = _original_get_host_addresses
        return
    for address in addresses:
        ipaddress.ip_address(address)  # raises ValueError naming the bad address
    chosen = list(dict.fromkeys(addresses))

    def chosen_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return [
            a
            for a in chosen
            if (use_ipv4 and ipaddress.ip_address(a).version == 4)
            or (use_ipv6 and ipaddress.ip_address(a).version == 6)
        ]

    aioice.ice.get_host_addresses = chosen_addresses


class NoMediaPorts(ApiError):
    """Every port of ``--rtp-port-range`` is taken on an address: no new call fits for now."""

    def __init__(self, address: str, low: int, high: int) -> None:
        super().__init__(
            503,
            "no_media_ports",
            f"No free UDP port in {low}-{high} on {address} for a new call; retry shortly.",
            headers={"Retry-After": str(_RETRY_AFTER_SECONDS)},
        )


class _PortRange:
    """The ports host candidates may bind, tried round-robin after the last one taken.

    Ports are handed back to the OS when a call ends, usually oldest first, so the port
    after the last one taken is most likely free: a scan rarely tries more than one. The
    first port is random, so worker processes sharing the range do not all start on the
    same one.
    """

    def __init__(self, low: int, high: int) -> None:
        self.low, self.high = low, high
        self._next = random.randint(low, high)

    def ports(self) -> Iterator[int]:
        """Each port of the range once, starting where the last scan left off."""
        size = self.high - self.low + 1
        first = self._next - self.low
        return (self.low + (first + i) % size for i in range(size))

    def taken(self, port: int) -> None:
        self._next = port + 1 if port < self.high else self.low


async def _bind_host(
    connection: aioice.ice.Connection, component: int, address: str, ports: _PortRange
) -> aioice.ice.StunProtocol | None:
    """A host candidate's socket on ``address`` at a free port of the range.

    None when the address itself cannot be bound (logged and skipped, as aioice does);
    :class:`NoMediaPorts` when it can but every port is in use.
    """
    family = socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
    for attempt, port in enumerate(ports.ports(), start=1):
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            sock.bind((address, port))
        except OSError as exc:
            sock.close()
            if exc.errno != errno.EADDRINUSE:
                log.info("cannot bind a host candidate on %s: %s", address, exc)
                return None
            if attempt % _BINDS_PER_YIELD == 0:
                await asyncio.sleep(0)
            continue
        ports.taken(port)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, aioice.turn.UDP_SOCKET_BUFFER_SIZE)
            loop = asyncio.get_running_loop()
            _, protocol = await loop.create_datagram_endpoint(
                lambda: aioice.ice.StunProtocol(connection), sock=sock
            )
        except BaseException:
            sock.close()
            raise
        host, port = sock.getsockname()[:2]
        protocol.local_candidate = Candidate(
            foundation=candidate_foundation("host", "udp", host),
            component=component,
            transport="udp",
            priority=candidate_priority(component, "host"),
            host=host,
            port=port,
            type="host",
        )
        return protocol
    raise NoMediaPorts(address, ports.low, ports.high)


async def _reflexive_candidates(
    connection: aioice.ice.Connection, hosts: Sequence[aioice.ice.StunProtocol], timeout: float
) -> list[Candidate]:
    """Server-reflexive candidates through the host sockets, as aioice queries them."""
    if connection.stun_server is None:
        return []
    tasks = [
        asyncio.create_task(aioice.ice.server_reflexive_candidate(host, connection.stun_server))
        for host in hosts
        if ipaddress.ip_address(host.local_candidate.host).version == 4
    ]
    if not tasks:
        return []
    done, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:
        task.cancel()
    return [task.result()[0] for task in done if task.exception() is None]


def bind_host_ports(port_range: tuple[int, int] | None) -> None:
    """Bind every host candidate to a UDP port in ``port_range`` (None: any port, aioice's way).

    aioice binds each host candidate to port 0 inside ``get_component_candidates``, which
    also queries STUN through those sockets and allocates TURN. The replacement binds the
    host sockets itself, queries STUN through them the same way, and leaves TURN (whose
    socket only talks to the TURN server) to aioice by handing it no addresses to bind.
    """
    if port_range is None:
        aioice.ice.Connection.get_component_candidates = _original_get_component_candidates
        return
    low, high = port_range
    if not 0 < low <= high < 65536:
        raise ValueError(f"a port range is LO-HI within 1-65535, got {low}-{high}")
    ports = _PortRange(low, high)

    async def get_component_candidates(
        self: aioice.ice.Connection, component: int, addresses: list[str], timeout: int = 5
    ) -> list[Candidate]:
        hosts: list[aioice.ice.StunProtocol] = []
        try:
            for address in addresses:
                host = await _bind_host(self, component, address, ports)
                if host is not None:
                    hosts.append(host)
        except NoMediaPorts:
            for host in hosts:
                await host.close()
            raise
        self._protocols += hosts  # aioice pairs, reads from and closes these sockets
        reflexive, relayed = await asyncio.gather(
            _reflexive_candidates(self, hosts, timeout),
            _original_get_component_candidates(self, component, [], timeout),
        )
        return [host.local_candidate for host in hosts] + reflexive + relayed

    aioice.ice.Connection.get_component_candidates = get_component_candidates


def announce_host_address(address: str | None) -> None:
    """Signal ``address`` instead of the bound one in host candidates of its family.

    For a server behind a 1:1 NAT: the NAT forwards the public address's ports to the same
    ports of the private one, so only the address changes; the port, foundation and priority
    stay as gathered. aioice's ``local_candidates`` is what aiortc puts in the SDP (and in
    its stats), so that is what is rewritten; the candidates aioice pairs and checks are
    untouched. A server-reflexive candidate that a STUN server reports at the announced
    address and port would then repeat a host candidate, and is dropped (RFC 8445 section
    5.1.3). None: signal the bound address, aioice's way.
    """
    if address is None:
        aioice.ice.Connection.local_candidates = _original_local_candidates
        return
    announced = str(ipaddress.ip_address(address))  # raises ValueError naming the bad address
    version = ipaddress.ip_address(announced).version

    def announce(candidate: Candidate) -> Candidate:
        if candidate.type != "host" or ipaddress.ip_address(candidate.host).version != version:
            return candidate
        candidate = copy.copy(candidate)
        candidate.host = announced
        return candidate

    def local_candidates(self: aioice.ice.Connection) -> list[Candidate]:
        signalled = [announce(c) for c in _original_local_candidates.__get__(self)]
        hosts = {(c.host, c.port) for c in signalled if c.type == "host"}
        return [c for c in signalled if c.type != "srflx" or (c.host, c.port) not in hosts]

    aioice.ice.Connection.local_candidates = property(
        local_candidates, doc=_original_local_candidates.__doc__
    )
