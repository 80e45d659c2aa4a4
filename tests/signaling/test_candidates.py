"""IPv6 link-local candidates (libnice offers them) never reach the ICE agent."""

from __future__ import annotations

from media.rtc.candidates import (
    reachable_address,
    reachable_candidate,
    without_unreachable_candidates,
)

# The candidate lines GStreamer's webrtcbin (libnice 0.1.21) put in a real offer.
LIBNICE_CANDIDATES = [
    "a=candidate:1 1 UDP 2015363327 10.77.0.2 46660 typ host",
    "a=candidate:2 1 TCP 1015021823 10.77.0.2 9 typ host tcptype active",
    "a=candidate:7 1 UDP 2015363839 fe80::68c8:6ff:fef8:8bb6 45456 typ host",
    "a=candidate:8 1 TCP 1015022335 fe80::68c8:6ff:fef8:8bb6 9 typ host tcptype active",
    "a=candidate:13 1 UDP 2015364095 FEBF::1 59276 typ host",
    "a=candidate:14 1 UDP 2015364095 fd77::2 59277 typ host",
]


def test_link_local_ipv6_is_unreachable_and_everything_else_is_left_to_ice() -> None:
    assert not reachable_address("fe80::1")
    assert not reachable_address("fe80::1%eth0")
    assert not reachable_address("febf::1")  # the top of fe80::/10
    for address in ("fec0::1", "fd77::2", "2001:db8::1", "10.0.0.1", "169.254.1.1", "x.local"):
        assert reachable_address(address), address


def test_offer_keeps_every_line_but_the_link_local_candidates() -> None:
    head = "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n"
    sdp = head + "\r\n".join(LIBNICE_CANDIDATES) + "\r\na=end-of-candidates\r\n"
    kept = without_unreachable_candidates(sdp)
    assert (
        kept
        == head
        + "\r\n".join([LIBNICE_CANDIDATES[0], LIBNICE_CANDIDATES[1], LIBNICE_CANDIDATES[5]])
        + "\r\na=end-of-candidates\r\n"
    )


def test_trickled_values_are_judged_like_offer_lines() -> None:
    assert not reachable_candidate("7 1 UDP 2015363839 fe80::68c8:6ff:fef8:8bb6 45456 typ host")
    assert reachable_candidate("1 1 UDP 2015363327 10.77.0.2 46660 typ host")
    assert reachable_candidate("short")  # malformed ones are refused elsewhere, not here
