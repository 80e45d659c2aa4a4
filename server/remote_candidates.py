"""A session's side of trickle ICE: the client's late candidates onto its peer connection.

Signaling parses and checks the PATCH (``signaling.trickle``); this reads what it is checked
against from the aiortc peer connection and hands the candidates over. The offer is read
line by line for the few attributes needed: aiortc's full SDP parser takes ~1 ms, too long
for the event loop on every PATCH.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiortc import RTCPeerConnection
from aiortc.sdp import candidate_from_sdp

from signaling.candidates import reachable_candidate
from signaling.errors import ApiError
from signaling.trickle import IceCredentials, IceSession, TrickleFragment


@dataclass
class _Section:
    mid: str | None = None
    ufrag: str | None = None
    pwd: str | None = None


@dataclass
class _Offer:
    """The offer's mids, its BUNDLE group and ICE credentials (media level over session)."""

    session: _Section = field(default_factory=_Section)
    media: list[_Section] = field(default_factory=list)
    bundle: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, sdp: str) -> _Offer:
        offer = cls()
        current = offer.session
        for line in sdp.splitlines():
            if line.startswith("m="):
                current = _Section()
                offer.media.append(current)
            elif line.startswith("a=mid:"):
                current.mid = line[len("a=mid:") :]
            elif line.startswith("a=ice-ufrag:"):
                current.ufrag = line[len("a=ice-ufrag:") :]
            elif line.startswith("a=ice-pwd:"):
                current.pwd = line[len("a=ice-pwd:") :]
            elif line.startswith("a=group:BUNDLE ") and not offer.bundle:
                offer.bundle = line.split()[1:]
        return offer

    def transport_mids(self) -> dict[str, str]:
        """For each mid, the mid whose transport carries it (its bundle tag's, if bundled)."""
        mids = {m.mid: m.mid for m in self.media if m.mid is not None}
        if self.bundle:
            mids.update((mid, self.bundle[0]) for mid in self.bundle if mid in mids)
        return mids

    def credentials(self) -> IceCredentials:
        """The ICE credentials of the first transport.

        WHIP offers use BUNDLE (RFC 9725 section 4.4.1): every m= section then shares the
        bundle tag's transport, whose credentials are the ICE session's.
        """
        first = next(iter(self.transport_mids().values()), None)
        media = next((m for m in self.media if m.mid == first), _Section())
        return IceCredentials(
            media.ufrag or self.session.ufrag or "", media.pwd or self.session.pwd or ""
        )


def ice_session_of(pc: RTCPeerConnection) -> IceSession:
    """The answer the client got and the ICE credentials its offer carried."""
    credentials = _Offer.read(pc.remoteDescription.sdp).credentials()
    return IceSession(pc.localDescription.sdp, credentials)


async def add_remote_candidates(pc: RTCPeerConnection, fragment: TrickleFragment) -> None:
    """Add the fragment's candidates, then end-of-candidates if it says so.

    aiortc ignores a candidate named by a bundled mid, so each goes to its bundle tag's
    transport, whatever bundled mid the client named. A mid the offer does not have is
    refused before any candidate is added: the client would otherwise wait for candidates
    that went nowhere. Candidates no server socket can reach (IPv6 link-local) are left
    out here, and aioice drops others it cannot use (TCP, names it cannot resolve), which
    RFC 9725 section 4.3.2 asks for.
    """
    mids = _Offer.read(pc.remoteDescription.sdp).transport_mids()
    unknown = sorted({c.mid for c in fragment.candidates} - mids.keys())
    if unknown:
        raise ApiError(
            400,
            "unknown_mid",
            f"The offer has no m= section with mid {unknown[0]!r} "
            f"(it has {', '.join(sorted(mids)) or 'none'}).",
        )
    for trickled in fragment.candidates:
        if not reachable_candidate(trickled.candidate):
            continue  # IPv6 link-local: see signaling.candidates
        candidate = candidate_from_sdp(trickled.candidate)
        candidate.sdpMid = mids[trickled.mid]
        await pc.addIceCandidate(candidate)
    if fragment.end_of_candidates:
        await pc.addIceCandidate(None)
