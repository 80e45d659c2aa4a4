"""ICE configuration: servers from config only, and host candidates limited to chosen addresses.

aiortc falls back to a public STUN server when given no configuration, so the server always
passes an explicit (possibly empty) list. aioice gathers a host candidate on every local
address except 127.0.0.1 and has no option to choose; ``restrict_host_addresses`` replaces
its address lookup, process-wide, with a fixed list (e.g. ``127.0.0.1`` for loopback calls).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import unquote

import aioice.ice
from aiortc import RTCConfiguration, RTCIceServer

_SCHEMES = ("stun", "stuns", "turn", "turns")
_original_get_host_addresses: Callable[[bool, bool], list[str]] = aioice.ice.get_host_addresses


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
