"""WHIP (RFC 9725) on the success path: status, headers, answer SDP, DELETE and preflight."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urljoin

import aiohttp
import pytest

from media.engines.registry import EngineRegistry
from media.rtc import connection as connection_module
from media.rtc.ice import rtc_configuration
from signaling.ice import IceServer
from tests.conftest import RunningServer, running_server
from tests.signaling.offers import LivePeer, audio_direction, new_offer

SDP = "application/sdp"
LOCATION = re.compile(r"^/whip/sessions/([A-Za-z0-9_-]{32,})$")
ICE_SERVERS = (
    IceServer.parse("stun:stun.example.net:3478"),
    IceServer.parse("turn:alice:secret@turn.example.net:3478"),
)
EXPECTED_LINKS = [
    '<stun:stun.example.net:3478>; rel="ice-server"',
    '<turn:turn.example.net:3478>; rel="ice-server"; username="alice"; credential="secret"; '
    'credential-type="password"',
]


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def publish(
    http: aiohttp.ClientSession, url: str, sdp: str, path: str = "whip"
) -> tuple[aiohttp.ClientResponse, str]:
    async with http.post(url + path, data=sdp, headers={"Content-Type": SDP}) as response:
        return response, await response.text()


def session_id_of(response: aiohttp.ClientResponse) -> str:
    match = LOCATION.match(response.headers.get("Location", ""))
    assert match, f"Location: {response.headers.get('Location')!r}"
    return match.group(1)


async def test_publish_answers_201_with_location_etag_and_sdp(
    server: RunningServer, http: aiohttp.ClientSession
):
    response, answer = await publish(http, server.url, await new_offer())
    assert response.status == 201, answer
    assert response.content_type == SDP
    session_id = session_id_of(response)
    assert server.server.sessions.get(session_id).describe()["engine"] == "echo"  # default

    etag = response.headers.get("ETag", "")
    assert re.fullmatch(r'"[^"]+"', etag), f"ETag: {etag!r}"

    assert answer.startswith("v=0")
    assert "\r\nm=audio " in answer
    assert "a=ice-ufrag:" in answer and "a=ice-pwd:" in answer
    assert "a=fingerprint:" in answer
    assert re.search(r"^a=rtpmap:\d+ opus/48000/2", answer, re.MULTILINE | re.IGNORECASE)

    assert response.headers.get("Access-Control-Allow-Origin") == "*"
    exposed = {
        h.strip().lower() for h in response.headers["Access-Control-Expose-Headers"].split(",")
    }
    assert {"location", "etag", "link"} <= exposed
    assert "Link" not in response.headers  # no ICE servers configured

    async with http.delete(urljoin(server.url, response.headers["Location"])) as deleted:
        assert deleted.status == 200
        assert deleted.headers.get("Access-Control-Allow-Origin") == "*"
    assert len(server.server.sessions) == 0
    async with http.delete(urljoin(server.url, response.headers["Location"])) as again:
        assert again.status == 404
        assert (await again.json())["error"] == "session_not_found"


async def test_each_session_has_its_own_location_and_etag(
    server: RunningServer, http: aiohttp.ClientSession
):
    first, _ = await publish(http, server.url, await new_offer())
    second, _ = await publish(http, server.url, await new_offer())
    assert first.status == second.status == 201
    assert session_id_of(first) != session_id_of(second)
    assert first.headers["ETag"] != second.headers["ETag"]
    assert len(server.server.sessions) == 2
    for response in (first, second):
        async with http.delete(urljoin(server.url, response.headers["Location"])) as deleted:
            assert deleted.status == 200
    assert len(server.server.sessions) == 0


@pytest.mark.parametrize("engine", ["echo", "denoise"])
async def test_engine_in_the_path_is_used(
    server: RunningServer, http: aiohttp.ClientSession, engine: str
):
    response, answer = await publish(http, server.url, await new_offer(), f"whip/{engine}")
    assert response.status == 201, answer
    session_id = session_id_of(response)
    assert server.server.sessions.get(session_id).describe()["engine"] == engine
    async with http.delete(urljoin(server.url, response.headers["Location"])) as deleted:
        assert deleted.status == 200
    assert len(server.server.sessions) == 0


@pytest.mark.parametrize(
    ("offered", "answered"), [("sendonly", "recvonly"), ("sendrecv", "sendrecv")]
)
async def test_answer_direction_mirrors_the_offer(
    server: RunningServer, http: aiohttp.ClientSession, offered: str, answered: str
):
    offer = await new_offer(audio=offered)
    assert audio_direction(offer) == offered
    response, answer = await publish(http, server.url, offer)
    assert response.status == 201, answer
    assert audio_direction(answer) == answered
    async with http.delete(urljoin(server.url, response.headers["Location"])) as deleted:
        assert deleted.status == 200


async def test_published_session_connects_over_loopback(
    server: RunningServer, http: aiohttp.ClientSession
):
    peer = LivePeer()
    try:
        response, answer = await publish(http, server.url, await peer.offer())
        assert response.status == 201, answer
        await peer.accept(answer)
        session = server.server.sessions.get(session_id_of(response))
        async with asyncio.timeout(10):
            await session.connected.wait()
        assert peer.pc.connectionState == "connected"
        async with http.delete(urljoin(server.url, response.headers["Location"])) as deleted:
            assert deleted.status == 200
        assert session.closed.is_set()
        assert len(server.server.sessions) == 0
    finally:
        await peer.close()


def assert_preflight(response: aiohttp.ClientResponse) -> None:
    assert response.status == 204
    assert response.headers.get("Access-Control-Allow-Origin") == "*"
    methods = {m.strip() for m in response.headers["Access-Control-Allow-Methods"].split(",")}
    assert {"POST", "DELETE", "OPTIONS"} <= methods
    allowed = {
        h.strip().lower() for h in response.headers["Access-Control-Allow-Headers"].split(",")
    }
    assert "content-type" in allowed
    assert response.headers.get("Accept-Post") == SDP


@pytest.mark.parametrize("path", ["whip", "whip/echo", "whip/sessions/anything"])
async def test_options_is_a_cors_preflight(
    server: RunningServer, http: aiohttp.ClientSession, path: str
):
    headers = {
        "Origin": "https://example.org",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type",
    }
    async with http.options(server.url + path, headers=headers) as response:
        assert_preflight(response)
        assert await response.read() == b""
        assert "Link" not in response.headers
    assert len(server.server.sessions) == 0


async def test_ice_servers_are_advertised_as_link_headers(
    registry: EngineRegistry, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
):
    """The configured servers are only advertised here; nothing may contact them.

    The server's own peer connections would gather candidates through its STUN/TURN servers,
    so for this test they get an empty configuration: every packet stays on 127.0.0.1.
    """
    asked: list[Any] = []

    def local_only(servers: Any) -> Any:
        asked.append(tuple(servers))
        return rtc_configuration([])

    monkeypatch.setattr(connection_module, "rtc_configuration", local_only)
    async with running_server(registry, ice_servers=ICE_SERVERS) as running:
        async with http.options(running.url + "whip") as response:
            assert_preflight(response)
            assert response.headers.getall("Link") == EXPECTED_LINKS

        response, answer = await publish(http, running.url, await new_offer())
        assert response.status == 201, answer
        assert response.headers.getall("Link") == EXPECTED_LINKS
        assert asked == [ICE_SERVERS]  # the session would have used them
        async with http.delete(urljoin(running.url, response.headers["Location"])) as deleted:
            assert deleted.status == 200
        assert len(running.server.sessions) == 0
