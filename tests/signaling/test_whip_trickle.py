"""WHIP trickle ICE (RFC 9725 section 4.3): the sdpfrag parser, the PATCH route, real calls."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from urllib.parse import urljoin

import aiohttp
import numpy as np
import pytest
from aiortc import RTCSessionDescription

from media.audio.frames import RTC_RATE
from media.engines.registry import EngineRegistry
from peer.call import PeerCall
from peer.speech import SpeechFixture
from signaling.errors import ApiError
from signaling.trickle import (
    IceCredentials,
    TrickleCandidate,
    check_if_match,
    parse_sdpfrag,
)
from tests.conftest import RunningServer, running_server
from tests.netfaults.relay import UdpRelay
from tests.signaling.offers import new_offer, without_prefix

SDP = "application/sdp"
TRICKLE = "application/trickle-ice-sdpfrag"
HOST = "a=candidate:1 1 udp 2130706431 127.0.0.1 9 typ host"

# The trickle example of RFC 9725 section 4.3.2, as sent.
RFC_EXAMPLE = (
    "a=group:BUNDLE 0 1\r\n"
    "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\n"
    "a=mid:0\r\n"
    "a=ice-ufrag:EsAw\r\n"
    "a=ice-pwd:P2uYro0UCOQ4zxjKXaWCBui1\r\n"
    "a=candidate:1387637174 1 udp 2122260223 192.0.2.1 61764 typ host generation 0 ufrag EsAw"
    " network-id 1\r\n"
    "a=candidate:3471623853 1 udp 2122194687 198.51.100.2 61765 typ host generation 0"
    " ufrag EsAw network-id 2\r\n"
    "a=candidate:473322822 1 tcp 1518280447 192.0.2.1 9 typ host tcptype active generation 0"
    " ufrag EsAw network-id 1\r\n"
    "a=end-of-candidates\r\n"
)


# --- the fragment -------------------------------------------------------------------


def test_rfc_example_parses_into_candidates_of_the_bundle_tag():
    fragment = parse_sdpfrag(RFC_EXAMPLE)
    assert (fragment.ufrag, fragment.pwd) == ("EsAw", "P2uYro0UCOQ4zxjKXaWCBui1")
    assert [c.mid for c in fragment.candidates] == ["0", "0", "0"]
    assert fragment.candidates[2] == TrickleCandidate(
        "0",
        "473322822 1 tcp 1518280447 192.0.2.1 9 typ host tcptype active generation 0 "
        "ufrag EsAw network-id 1",
    )
    assert fragment.end_of_candidates


def test_new_credentials_ask_for_an_ice_restart_and_missing_ones_do_not():
    current = IceCredentials("EsAw", "P2uYro0UCOQ4zxjKXaWCBui1")
    assert not parse_sdpfrag(RFC_EXAMPLE).restarts_ice(current)
    assert parse_sdpfrag(RFC_EXAMPLE.replace("EsAw", "ysXw")).restarts_ice(current)
    new_pwd = RFC_EXAMPLE.replace("P2uYro0UCOQ4zxjKXaWCBui1", "vw5LmwG4y/e6dPP/zAP9Gp5k")
    assert parse_sdpfrag(new_pwd).restarts_ice(current)
    bare = parse_sdpfrag(f"m=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=mid:0\r\n{HOST}\r\n")
    assert (bare.ufrag, bare.pwd, bare.end_of_candidates) == (None, None, False)
    assert not bare.restarts_ice(current)


def test_lone_end_of_candidates_and_bare_newlines_are_fine():
    fragment = parse_sdpfrag("a=end-of-candidates\n")
    assert fragment.candidates == () and fragment.end_of_candidates


def in_section(candidate: str) -> str:
    return f"m=audio 9 RTP/AVP 0\r\na=mid:0\r\na=candidate:{candidate}\r\n"


@pytest.mark.parametrize(
    ("body", "code", "says"),
    [
        ("", "malformed_sdpfrag", "empty"),
        ("hello there\r\n", "malformed_sdpfrag", "Line 1"),
        (f"{HOST}\r\n", "malformed_sdpfrag", "before any m= line"),
        (f"m=audio 9 UDP/TLS/RTP/SAVPF 111\r\n{HOST}\r\n", "malformed_sdpfrag", "without a=mid"),
        ("a=mid:0\r\n", "malformed_sdpfrag", "a=mid"),
        ("m=audio 9 RTP/AVP 0\r\na=mid:0\r\na=mid:1\r\n", "malformed_sdpfrag", "a=mid"),
        ("a=ice-ufrag:ab\r\n", "malformed_sdpfrag", "ice-ufrag"),
        ("a=ice-pwd:short\r\n", "malformed_sdpfrag", "ice-pwd"),
        ("a=ice-ufrag:abcd\r\na=ice-ufrag:efgh\r\n", "malformed_sdpfrag", "second"),
        (in_section("1 1 udp"), "invalid_candidate", "Line 3"),
        (in_section("1 1 udp 1 127.0.0.1 99999 typ host"), "invalid_candidate", "port"),
        (in_section("1 1 udp 1 127.0.0.1 9 typ host rport"), "invalid_candidate", "pairs"),
        (in_section("1 0 udp 1 127.0.0.1 9 typ host"), "invalid_candidate", "component"),
        (in_section("1 1 udp 1 127.0.0.1 9 host host"), "invalid_candidate", "typ"),
        (in_section("fo:o 1 udp 1 127.0.0.1 9 typ host"), "invalid_candidate", "foundation"),
        (in_section("1 1 udp 4294967296 127.0.0.1 9 typ host"), "invalid_candidate", "priority"),
        (in_section("1 1 udp " + "9" * 5000 + " ::1 9 typ host"), "invalid_candidate", "priority"),
        (in_section("1 1 udp 1 ::1 9 typ host raddr ::1 rport x"), "invalid_candidate", "rport"),
    ],
)
def test_malformed_fragments_are_refused_with_the_line_at_fault(body: str, code: str, says: str):
    with pytest.raises(ApiError) as refused:
        parse_sdpfrag(body)
    assert (refused.value.status, refused.value.code) == (400, code)
    assert says in refused.value.message


@pytest.mark.parametrize(
    ("header", "status"),
    [
        (None, 428),
        ('"other"', 412),
        ('W/"abc"', 412),  # If-Match compares strongly: a weak tag never matches
        ("abc", 412),
        ('"abc"', None),
        ('"other", "abc"', None),
        (" * ", None),
    ],
)
def test_if_match_follows_rfc_9110(header: str | None, status: int | None):
    if status is None:
        check_if_match(header, '"abc"')
        return
    with pytest.raises(ApiError) as refused:
        check_if_match(header, '"abc"')
    assert refused.value.status == status


# --- the PATCH route ----------------------------------------------------------------


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def whip(server: RunningServer, http: aiohttp.ClientSession) -> tuple[str, str, str]:
    """A WHIP session (whose client never connects): its URL, ETag and offer."""
    offer = await new_offer()
    headers = {"Content-Type": SDP}
    async with http.post(urljoin(server.url, "whip"), data=offer, headers=headers) as response:
        assert response.status == 201, await response.text()
        return urljoin(server.url, response.headers["Location"]), response.headers["ETag"], offer


def media_section(offer: str, mid: str = "0") -> str:
    """The first m= line of ``offer`` with ``mid`` and its ICE credentials, as a fragment."""
    lines = offer.splitlines()
    m_line = next(line for line in lines if line.startswith("m="))
    ice = [line for line in lines if line.startswith(("a=ice-ufrag:", "a=ice-pwd:"))][:2]
    return "\r\n".join([m_line, f"a=mid:{mid}", *ice]) + "\r\n"


async def patch(
    http: aiohttp.ClientSession,
    url: str,
    body: str,
    if_match: str | None,
    content_type: str = TRICKLE,
) -> tuple[int, dict[str, str], str]:
    headers = {"Content-Type": content_type}
    if if_match is not None:
        headers["If-Match"] = if_match
    async with http.patch(url, data=body, headers=headers) as response:
        return response.status, dict(response.headers), await response.text()


async def test_candidates_with_the_current_etag_are_accepted_with_204_and_no_etag(
    server: RunningServer, http: aiohttp.ClientSession, whip: tuple[str, str, str]
):
    url, etag, offer = whip
    status, headers, body = await patch(http, url, media_section(offer) + HOST + "\r\n", etag)
    assert (status, body) == (204, "")
    assert "ETag" not in headers  # RFC 9725 section 4.3.2
    session_id = url.rsplit("/", 1)[1]
    remote = server.server.sessions.get(session_id).connection.offer_sdp
    assert HOST in remote.splitlines()

    status, _, _ = await patch(http, url, "a=end-of-candidates\r\n", "*")
    assert status == 204


async def test_wrong_content_type_is_415_and_names_the_trickle_type(
    http: aiohttp.ClientSession, whip: tuple[str, str, str]
):
    url, etag, offer = whip
    status, headers, body = await patch(http, url, media_section(offer), etag, content_type=SDP)
    assert status == 415
    assert headers["Accept-Patch"] == TRICKLE
    assert '"unsupported_media_type"' in body


@pytest.mark.parametrize(
    ("if_match", "status", "code"),
    [(None, 428, "precondition_required"), ('"0123456789abcdef"', 412, "precondition_failed")],
)
async def test_missing_or_stale_etag_is_refused(
    http: aiohttp.ClientSession,
    whip: tuple[str, str, str],
    if_match: str | None,
    status: int,
    code: str,
):
    url, _, offer = whip
    got, _, body = await patch(http, url, media_section(offer) + HOST + "\r\n", if_match)
    assert got == status
    assert f'"{code}"' in body


async def test_malformed_fragment_is_400(http: aiohttp.ClientSession, whip: tuple[str, str, str]):
    url, etag, _ = whip
    status, _, body = await patch(http, url, "not sdp at all\r\n", etag)
    assert status == 400
    assert '"malformed_sdpfrag"' in body


async def test_candidates_for_a_mid_the_offer_lacks_are_400(
    server: RunningServer, http: aiohttp.ClientSession, whip: tuple[str, str, str]
):
    url, etag, offer = whip
    status, _, body = await patch(http, url, media_section(offer, "7") + HOST + "\r\n", etag)
    assert status == 400
    assert '"unknown_mid"' in body
    session_id = url.rsplit("/", 1)[1]
    assert HOST not in server.server.sessions.get(session_id).connection.offer_sdp


async def test_ice_restart_is_422_and_the_session_goes_on(
    server: RunningServer, http: aiohttp.ClientSession, whip: tuple[str, str, str]
):
    """RFC 9725 section 4.3.1: a session with trickle ICE but no ICE restarts answers 422;
    section 4.3.3: a restart that cannot be done leaves the session and its ICE session."""
    url, etag, _ = whip
    restart = (
        "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=mid:0\r\n"
        "a=ice-ufrag:ysXw\r\na=ice-pwd:vw5LmwG4y/e6dPP/zAP9Gp5k\r\n" + HOST + "\r\n"
    )
    status, _, body = await patch(http, url, restart, "*")
    assert status == 422
    assert '"ice_restart_unsupported"' in body
    assert len(server.server.sessions) == 1
    status, _, _ = await patch(http, url, "a=end-of-candidates\r\n", etag)
    assert status == 204  # the entity tag still names the ICE session


async def test_unknown_session_is_404(server: RunningServer, http: aiohttp.ClientSession):
    url = urljoin(server.url, "whip/sessions/" + "x" * 32)
    status, _, body = await patch(http, url, "a=end-of-candidates\r\n", "*")
    assert status == 404
    assert '"session_not_found"' in body


async def test_preflight_on_a_session_offers_patch(
    http: aiohttp.ClientSession, whip: tuple[str, str, str]
):
    url, _, _ = whip
    async with http.options(url) as response:
        assert response.status == 204
        assert "PATCH" in response.headers["Access-Control-Allow-Methods"]
        assert response.headers["Accept-Patch"] == TRICKLE


# --- real calls ---------------------------------------------------------------------


def candidate_fragment(offer: str, mid: str) -> str:
    """The candidates of the offer's first m= section (its bundle tag), as one fragment."""
    first = offer.split("\r\nm=")[1].split("\r\n")
    keep = [line for line in first if line.startswith("a=candidate:")]
    assert keep, "the offer has no candidate to trickle"
    return media_section(offer, mid) + "\r\n".join([*keep, "a=end-of-candidates"]) + "\r\n"


@pytest.mark.parametrize("mid", ["0", "1"], ids=["bundle-tag", "bundled-data-channel"])
async def test_client_that_trickles_all_its_candidates_connects_and_hears_itself(
    server: RunningServer, http: aiohttp.ClientSession, speech: SpeechFixture, mid: str
):
    """The offer carries no candidate at all; they reach the server only through PATCH.

    ``1`` names the data channel's m= section, bundled on the audio one's transport:
    aiortc alone would drop candidates named that way.
    """
    audio = speech.clean[: 2 * RTC_RATE]
    call = PeerCall(server.url, audio, engine="echo")
    connected = asyncio.Event()

    @call.pc.on("connectionstatechange")
    def on_state() -> None:
        if call.pc.connectionState == "connected":
            connected.set()

    try:
        await call.pc.setLocalDescription(await call.pc.createOffer())
        offer = call.pc.localDescription.sdp
        bare = without_prefix(offer, "a=candidate:", "a=end-of-candidates")
        headers = {"Content-Type": SDP}
        async with http.post(urljoin(server.url, "whip"), data=bare, headers=headers) as posted:
            assert posted.status == 201, await posted.text()
            answer = await posted.text()
            url = urljoin(server.url, posted.headers["Location"])
            etag = posted.headers["ETag"]
        status, _, body = await patch(http, url, candidate_fragment(offer, mid), etag)
        assert status == 204, body
        await call.pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
        async with asyncio.timeout(10):
            await connected.wait()
            await call.source.finished.wait()
        await asyncio.sleep(0.3)  # the last frames' way back
    finally:
        await call.close()
    received = call.received()
    assert np.sqrt(np.mean(received**2)) > 0.25 * np.sqrt(np.mean(audio**2))


async def test_patch_while_the_session_waits_for_a_resume_is_409(registry: EngineRegistry):
    """A detached session has no ICE session to add candidates to until it is resumed."""
    async with running_server(registry, rtp_timeout=0.5, resume_grace=10.0) as running:
        with UdpRelay(seed=5) as relay:
            call = PeerCall(
                running.url,
                np.zeros(10 * RTC_RATE, np.float32),
                engine="echo",
                whip=True,
                offer_filter=relay.rewrite_offer,
                answer_filter=relay.rewrite_answer,
            )
            async with call, aiohttp.ClientSession() as http:
                assert call.answer is not None and call.answer.resource_url is not None
                session = running.server.sessions.get(call.session_id or "")
                relay.blackout()  # the caller's network is gone: no RTP, the session detaches
                async with asyncio.timeout(5):
                    while session.connection is not None:
                        await asyncio.sleep(0.05)
                url = call.answer.resource_url
                status, _, body = await patch(http, url, "a=end-of-candidates\r\n", "*")
    assert status == 409
    assert '"session_detached"' in body
