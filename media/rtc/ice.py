"""ICE for the server's calls: explicit configuration, and the host candidates a deployment needs.

aiortc falls back to a public STUN server when given no configuration, so every connection
gets an explicit (possibly empty) list. aioice has no options for its host candidates; the
replacements for its functions are built here and put in place by ``media.rtc.compat``:

- ``address_lookup``: aioice gathers on every local address except 127.0.0.1; this answers
  with a fixed list instead (e.g. ``127.0.0.1`` for loopback calls).
- ``gatherer_in_range``: aioice binds host candidates to port 0 (any ephemeral port); this
  binds them within a range a firewall can open.
- ``announced_local_candidates``: behind a 1:1 NAT the bound address is private; this
  signals the public one instead. Only what aioice hands out for signaling changes: its
  sockets, pairs and checks keep the real address, so the NAT's forwarding is all it takes.
"""

from __future__ import annotations

import asyncio
import copy
import errno
import ipaddress
import logging
import random
import socket
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Protocol

import aioice.ice
import aioice.turn
from aioice import Candidate
from aioice.candidate import candidate_foundation, candidate_priority
from aiortc import RTCConfiguration, RTCIceServer

log = logging.getLogger(__name__)

# Failed binds cost ~20 us each: give the event loop a turn this often while scanning a range.
_BINDS_PER_YIELD = 32
RETRY_AFTER_SECONDS = 2

ComponentGatherer = Callable[
    [aioice.ice.Connection, int, list[str], int], Awaitable[list[Candidate]]
]


class IceServerConfig(Protocol):
    """A STUN or TURN server, as ``signaling.ice.IceServer`` holds one."""

    @property
    def url(self) -> str: ...
    @property
    def username(self) -> str | None: ...
    @property
    def credential(self) -> str | None: ...


def rtc_configuration(servers: Sequence[IceServerConfig]) -> RTCConfiguration:
    """An explicit configuration: an empty list means no STUN/TURN, never aiortc's default."""
    return RTCConfiguration(
        iceServers=[
            RTCIceServer(urls=s.url, username=s.username, credential=s.credential) for s in servers
        ]
    )


def address_lookup(addresses: Sequence[str]) -> Callable[[bool, bool], list[str]]:
    """aioice's ``get_host_addresses``, answering with ``addresses`` only."""
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

    return chosen_addresses


class NoMediaPorts(Exception):
    """Every port of ``--rtp-port-range`` is taken on an address: no new call fits for now."""

    def __init__(self, address: str, low: int, high: int) -> None:
        super().__init__(
            f"No free UDP port in {low}-{high} on {address} for a new call; retry shortly."
        )
        self.retry_after_s = RETRY_AFTER_SECONDS


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


def gatherer_in_range(low: int, high: int, stock: ComponentGatherer) -> ComponentGatherer:
    """aioice's ``Connection.get_component_candidates``, binding host sockets in a range.

    aioice binds each host candidate to port 0 inside ``get_component_candidates``, which
    also queries STUN through those sockets and allocates TURN. This one binds the host
    sockets itself, queries STUN through them the same way, and leaves TURN (whose socket
    only talks to the TURN server) to ``stock`` by handing it no addresses to bind.
    """
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
            stock(self, component, [], timeout),
        )
        return [host.local_candidate for host in hosts] + reflexive + relayed

    return get_component_candidates


def announced_local_candidates(address: str, stock: property) -> property:
    """aioice's ``Connection.local_candidates``, with ``address`` in host candidates.

    For a server behind a 1:1 NAT: the NAT forwards the public address's ports to the same
    ports of the private one, so only the address changes; the port, foundation and priority
    stay as gathered. aioice's ``local_candidates`` is what aiortc puts in the SDP (and in
    its stats), so that is what is rewritten; the candidates aioice pairs and checks are
    untouched. A server-reflexive candidate that a STUN server reports at the announced
    address and port would then repeat a host candidate, and is dropped (RFC 8445 section
    5.1.3).
    """
    announced = str(ipaddress.ip_address(address))  # raises ValueError naming the bad address
    version = ipaddress.ip_address(announced).version

    def announce(candidate: Candidate) -> Candidate:
        if candidate.type != "host" or ipaddress.ip_address(candidate.host).version != version:
            return candidate
        candidate = copy.copy(candidate)
        candidate.host = announced
        return candidate

    def local_candidates(self: aioice.ice.Connection) -> list[Candidate]:
        signalled = [announce(c) for c in stock.__get__(self)]
        hosts = {(c.host, c.port) for c in signalled if c.type == "host"}
        return [c for c in signalled if c.type != "srflx" or (c.host, c.port) not in hosts]

    return property(local_candidates, doc=stock.__doc__)
