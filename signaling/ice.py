"""ICE servers as configured and advertised: ``stun:``/``turn:`` URLs and WHIP ``Link`` headers.

aiortc falls back to a public STUN server when given no configuration, so the server always
passes an explicit (possibly empty) list (``media.rtc.ice.rtc_configuration``).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

_SCHEMES = ("stun", "stuns", "turn", "turns")


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

    def link_header(self) -> str:
        """The RFC 9725 ``Link`` header value advertising this server to WHIP clients."""
        value = f'<{self.url}>; rel="ice-server"'
        if self.username is not None:
            value += f'; username="{self.username}"; credential="{self.credential or ""}"'
            value += '; credential-type="password"'
        return value
