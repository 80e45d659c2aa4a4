"""A session's side of trickle ICE: the client's late candidates onto its peer connection.

Signaling parses and checks the PATCH (``signaling.trickle``); this reads what it is checked
against from the aiortc peer connection and hands the candidates over.
"""

from __future__ import annotations

from aiortc import RTCPeerConnection
from aiortc import sdp as aiortc_sdp

from signaling.errors import ApiError
from signaling.trickle import IceCredentials, IceSession, TrickleFragment


def _remote_description(pc: RTCPeerConnection) -> aiortc_sdp.SessionDescription:
    """The offer as aiortc holds it now (trickled candidates included)."""
    return aiortc_sdp.SessionDescription.parse(pc.remoteDescription.sdp)


def _transport_mids(description: aiortc_sdp.SessionDescription) -> dict[str, str]:
    """For each mid of the offer, the mid whose transport carries it (its bundle tag's)."""
    mids = {m.rtp.muxId: m.rtp.muxId for m in description.media if m.rtp.muxId}
    for group in description.group:
        if group.semantic == "BUNDLE" and group.items:
            mids.update((mid, group.items[0]) for mid in group.items if mid in mids)
    return mids


def ice_session_of(pc: RTCPeerConnection) -> IceSession:
    """The answer the client got and the ICE credentials of its offer's first transport.

    WHIP offers use BUNDLE (RFC 9725 section 4.4.1): every m= section then shares the
    bundle tag's transport, whose credentials are the ICE session's.
    """
    description = _remote_description(pc)
    first = next(iter(_transport_mids(description).values()), None)
    media = next((m for m in description.media if m.rtp.muxId == first), description.media[0])
    remote = IceCredentials(media.ice.usernameFragment or "", media.ice.password or "")
    return IceSession(pc.localDescription.sdp, remote)


async def add_remote_candidates(pc: RTCPeerConnection, fragment: TrickleFragment) -> None:
    """Add the fragment's candidates, then end-of-candidates if it says so.

    aiortc ignores a candidate named by a bundled mid, so each goes to its bundle tag's
    transport, whatever bundled mid the client named. A mid the offer does not have is
    refused before any candidate is added: the client would otherwise wait for candidates
    that went nowhere. aioice drops candidates it cannot use (TCP, names it cannot
    resolve), which RFC 9725 section 4.3.2 asks for.
    """
    mids = _transport_mids(_remote_description(pc))
    unknown = sorted({c.mid for c in fragment.candidates} - mids.keys())
    if unknown:
        raise ApiError(
            400,
            "unknown_mid",
            f"The offer has no m= section with mid {unknown[0]!r} "
            f"(it has {', '.join(sorted(mids)) or 'none'}).",
        )
    for trickled in fragment.candidates:
        candidate = aiortc_sdp.candidate_from_sdp(trickled.candidate)
        candidate.sdpMid = mids[trickled.mid]
        await pc.addIceCandidate(candidate)
    if fragment.end_of_candidates:
        await pc.addIceCandidate(None)
