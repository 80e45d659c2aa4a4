"""Remote ICE candidates this server can never reach, dropped before ICE pairs them.

libnice (GStreamer's webrtcbin) offers a host candidate on every address of the machine,
IPv6 link-local ones (``fe80::/10``) included. A link-local address means something only
with the interface it belongs to, and SDP has no way to say which (RFC 8839 section 5.1
carries no zone): the server, which never gathers link-local addresses itself, would pair
one with its global IPv6 address and send checks it cannot route. Such a candidate also
often has the highest priority of the offer, so a pair that works on one machine by
accident (both ends local) could be nominated and then fail across a real network. RFC
8445 section 5.1.1.1 lets an agent leave out candidates it cannot use; these are left out
of the offer and of trickled fragments alike, and the rest of the offer is untouched.
"""

from __future__ import annotations

import ipaddress

CANDIDATE_PREFIX = "a=candidate:"
_ADDRESS_FIELD = 4  # foundation, component, transport, priority, address, port, "typ", type


def reachable_address(address: str) -> bool:
    """False for addresses that need a zone to mean anything: IPv6 link-local.

    Names (mDNS ``.local`` candidates, which aioice resolves) and anything unparsable are
    left for the ICE agent to judge.
    """
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return True
    return not (parsed.version == 6 and parsed.is_link_local)


def reachable_candidate(candidate: str) -> bool:
    """Whether a candidate value (``candidate:...``, with or without ``a=``) may be kept."""
    fields = candidate.split()
    return len(fields) <= _ADDRESS_FIELD or reachable_address(fields[_ADDRESS_FIELD])


def without_unreachable_candidates(sdp: str) -> str:
    """``sdp`` without its ``a=candidate`` lines for unreachable addresses."""
    lines = sdp.split("\n")
    kept = [
        line
        for line in lines
        if not line.startswith(CANDIDATE_PREFIX) or reachable_candidate(line.rstrip("\r"))
    ]
    return "\n".join(kept)
