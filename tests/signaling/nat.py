"""A loopback stand-in for a 1:1 NAT, to show a server reached only at its announced address."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass
class Traffic:
    inbound: int = 0  # datagrams forwarded from the public side to the server
    outbound: int = 0  # and back


class _Inside(asyncio.DatagramProtocol):
    """The NAT's socket towards the server for one port: replies go back out publicly."""

    def __init__(self, outside: _Outside) -> None:
        self.outside = outside

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.DatagramTransport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if addr == self.outside.target and self.outside.caller is not None:
            self.outside.transport.sendto(data, self.outside.caller)
            self.outside.traffic.outbound += 1


class _Outside(asyncio.DatagramProtocol):
    """The public socket for one port: what arrives goes to the same port on the inside."""

    def __init__(self, target: tuple[str, int], traffic: Traffic) -> None:
        self.target = target
        self.traffic = traffic
        self.caller: tuple[str, int] | None = None
        self.inside: _Inside | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.DatagramTransport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if self.inside is not None:
            self.caller = addr
            self.inside.transport.sendto(data, self.target)
            self.traffic.inbound += 1


class OneToOneNat:
    """Forwards ``public``:P to ``private``:P for every port P given, and the replies back.

    A real 1:1 NAT keeps the caller's source address; on one machine the forwarded packets
    leave from the NAT's own ``inside`` address instead, which the server learns as a
    peer-reflexive candidate. For the single caller of a test that changes nothing, and
    every packet of the call visibly crosses the NAT.
    """

    def __init__(
        self, public: str, private: str, ports: Iterable[int], inside: str = "127.0.0.3"
    ) -> None:
        self.public, self.private, self.inside = public, private, inside
        self.ports = list(ports)
        self.traffic = Traffic()
        self._transports: list[asyncio.BaseTransport] = []

    async def __aenter__(self) -> OneToOneNat:
        loop = asyncio.get_running_loop()
        try:
            for port in self.ports:
                outside = _Outside((self.private, port), self.traffic)
                transport, _ = await loop.create_datagram_endpoint(
                    lambda outside=outside: outside, local_addr=(self.public, port)
                )
                self._transports.append(transport)
                inside = _Inside(outside)
                transport, _ = await loop.create_datagram_endpoint(
                    lambda inside=inside: inside, local_addr=(self.inside, 0)
                )
                self._transports.append(transport)
                outside.inside = inside
        except BaseException:
            self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for transport in self._transports:
            transport.close()
        self._transports.clear()
