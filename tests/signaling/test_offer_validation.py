"""Every way an offer can be refused, on ``POST /offer`` and on WHIP, with status and code.

Each bad request is checked for its HTTP status and the JSON ``error`` code; at the end the
same server has to be healthy and still answer a good offer.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin

import aiohttp
import pytest

from media.engines.base import Engine, EngineKind
from media.engines.plugin import EnginePlugin
from media.engines.registry import EngineRegistry
from server.config import Settings
from signaling.sdp import inspect_offer
from tests.conftest import RunningServer, running_server
from tests.signaling.offers import (
    LivePeer,
    new_offer,
    without_opus,
    without_prefix,
)

JSON = "application/json"
SDP = "application/sdp"


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def expect_error(response: aiohttp.ClientResponse, status: int, code: str) -> dict[str, Any]:
    """Check the status and the ``{"error": code, "message": sentence}`` body."""
    text = await response.text()
    assert response.status == status, f"{response.status} {text}"
    assert response.content_type == JSON, text
    body = json.loads(text)
    assert set(body) == {"error", "message"}, body
    assert body["error"] == code, body
    assert isinstance(body["message"], str) and body["message"].strip(), body
    return body


async def post(
    http: aiohttp.ClientSession,
    url: str,
    body: bytes | str | Any,
    content_type: str | None,
    **kwargs: Any,
) -> aiohttp.ClientResponse:
    headers = {"Content-Type": content_type} if content_type else {}
    return await http.post(url, data=body, headers=headers, **kwargs)


# ---------------------------------------------------------------------------------------------
# SDP problems: the same edit is refused with the same code on both routes.


def replace_audio_mline(sdp: str, new_mline: str) -> str:
    return "\r\n".join(
        new_mline if line.startswith("m=audio ") else line for line in sdp.splitlines()
    )


def identity(sdp: str) -> str:
    return sdp


def candidate_port(port: str) -> Callable[[str], str]:
    """An edit giving every a=candidate line the connection port ``port``."""

    def edit(sdp: str) -> str:
        lines = sdp.split("\r\n")
        for index, line in enumerate(lines):
            if line.startswith("a=candidate:"):
                fields = line.split()
                lines[index] = " ".join([*fields[:5], port, *fields[6:]])
        return "\r\n".join(lines)

    return edit


@dataclass(frozen=True)
class SdpCase:
    id: str
    edit: Callable[[str], str]
    status: int
    code: str
    offer: dict[str, Any] = field(default_factory=dict)


SDP_CASES = [
    SdpCase("empty", lambda sdp: "", 400, "malformed_sdp"),
    SdpCase("blank", lambda sdp: " \r\n\r\n ", 400, "malformed_sdp"),
    SdpCase("no-version-line", lambda sdp: without_prefix(sdp, "v="), 400, "malformed_sdp"),
    SdpCase("version-1", lambda sdp: sdp.replace("v=0", "v=1", 1), 400, "malformed_sdp"),
    SdpCase("not-sdp", lambda sdp: "hello, I would like some audio", 400, "malformed_sdp"),
    SdpCase(
        "garbage-m-line",
        lambda sdp: replace_audio_mline(sdp, "m=audio nine UDP"),
        400,
        "malformed_sdp",
    ),
    SdpCase(
        "non-numeric-payload-type",
        lambda sdp: replace_audio_mline(sdp, "m=audio 9 UDP/TLS/RTP/SAVPF opus"),
        400,
        "malformed_sdp",
    ),
    SdpCase(
        "broken-fingerprint-line",
        lambda sdp: sdp.replace("a=fingerprint:sha-256 ", "a=fingerprint:sha-256", 1),
        400,
        "malformed_sdp",
    ),
    SdpCase("no-ice-ufrag", lambda sdp: without_prefix(sdp, "a=ice-ufrag:"), 400, "malformed_sdp"),
    SdpCase("no-ice-pwd", lambda sdp: without_prefix(sdp, "a=ice-pwd:"), 400, "malformed_sdp"),
    # Found by fuzzing: a BUNDLE tag naming no m-line made aiortc fail building the answer
    # and again closing the connection, so the client got a 500.
    SdpCase(
        "bundle-tag-without-m-line",
        lambda sdp: without_prefix(sdp, "a=mid:0"),
        400,
        "malformed_sdp",
        {"data_channel": True},
    ),
    # Found by fuzzing: aioice sent its checks to port 70000 as given, sendto() raised and
    # asyncio closed the session's ICE socket as a fatal error.
    SdpCase("candidate-port-past-65535", candidate_port("70000"), 400, "malformed_sdp"),
    SdpCase("candidate-port-negative", candidate_port("-1"), 400, "malformed_sdp"),
    SdpCase(
        "bundle-names-unknown-mid",
        lambda sdp: sdp.replace("a=group:BUNDLE 0 1", "a=group:BUNDLE 5 1"),
        400,
        "malformed_sdp",
        {"data_channel": True},
    ),
    SdpCase(
        "no-fingerprint", lambda sdp: without_prefix(sdp, "a=fingerprint:"), 400, "malformed_sdp"
    ),
    SdpCase(
        "no-media",
        lambda sdp: sdp.split("\r\nm=", 1)[0] + "\r\n",
        400,
        "no_audio",
    ),
    SdpCase("video-only", identity, 400, "no_audio", {"audio": None, "video": True}),
    SdpCase("data-channel-only", identity, 400, "no_audio", {"audio": None, "data_channel": True}),
    SdpCase("audio-without-opus", without_opus, 400, "unsupported_codec"),
    SdpCase("recvonly-audio", identity, 400, "no_audio_input", {"audio": "recvonly"}),
    SdpCase("inactive-audio", identity, 400, "no_audio_input", {"audio": "inactive"}),
    # Passes the checks in signaling.sdp, then aiortc itself refuses it.
    SdpCase("no-rtcp-mux", lambda sdp: without_prefix(sdp, "a=rtcp-mux"), 400, "sdp_rejected"),
]


async def bad_sdp(case: SdpCase) -> str:
    return case.edit(await new_offer(**case.offer))


@pytest.mark.parametrize("case", SDP_CASES, ids=lambda case: case.id)
async def test_offer_refuses_bad_sdp(
    server: RunningServer, http: aiohttp.ClientSession, case: SdpCase
):
    payload = {"sdp": await bad_sdp(case), "type": "offer"}
    async with await post(http, server.url + "offer", json.dumps(payload), JSON) as response:
        await expect_error(response, case.status, case.code)
    assert len(server.server.sessions) == 0


@pytest.mark.parametrize("case", SDP_CASES, ids=lambda case: case.id)
@pytest.mark.parametrize("path", ["whip", "whip/echo"])
async def test_whip_refuses_bad_sdp(
    server: RunningServer, http: aiohttp.ClientSession, case: SdpCase, path: str
):
    async with await post(http, server.url + path, await bad_sdp(case), SDP) as response:
        await expect_error(response, case.status, case.code)
    assert len(server.server.sessions) == 0


# ---------------------------------------------------------------------------------------------
# Request problems on the JSON route: content type, body, JSON shape, engine and options.


@dataclass(frozen=True)
class RequestCase:
    id: str
    body: Callable[[str], bytes | str]  # from a valid offer's SDP
    status: int
    code: str
    content_type: str | None = JSON


def as_json(**fields: Any) -> Callable[[str], str]:
    """A JSON body; the value ``...`` stands for the valid SDP."""

    def build(sdp: str) -> str:
        return json.dumps({k: sdp if v is ... else v for k, v in fields.items()})

    return build


def offer_json(**extra: Any) -> Callable[[str], str]:
    return as_json(sdp=..., type="offer", **extra)


OFFER_CASES = [
    RequestCase("content-type-text", offer_json(), 415, "unsupported_media_type", "text/plain"),
    RequestCase("content-type-sdp", offer_json(), 415, "unsupported_media_type", SDP),
    RequestCase("content-type-form", offer_json(), 415, "unsupported_media_type", "multipart/x"),
    RequestCase("no-content-type", offer_json(), 415, "unsupported_media_type", None),
    RequestCase("json-garbage", lambda sdp: "{not json", 400, "invalid_json"),
    RequestCase("json-truncated", lambda sdp: offer_json()(sdp)[:-5], 400, "invalid_json"),
    RequestCase("json-empty-body", lambda sdp: "", 400, "invalid_json"),
    RequestCase("raw-sdp-as-json", lambda sdp: sdp, 400, "invalid_json"),
    RequestCase("not-utf8", lambda sdp: b'{"sdp": "\xff\xfe"}', 400, "invalid_encoding"),
    RequestCase("json-array", lambda sdp: json.dumps([sdp, "offer"]), 400, "invalid_request"),
    RequestCase("json-string", lambda sdp: json.dumps(sdp), 400, "invalid_request"),
    RequestCase("json-null", lambda sdp: "null", 400, "invalid_request"),
    RequestCase("json-number", lambda sdp: "42", 400, "invalid_request"),
    RequestCase("sdp-missing", as_json(type="offer"), 400, "invalid_request"),
    RequestCase("sdp-null", as_json(sdp=None, type="offer"), 400, "invalid_request"),
    RequestCase("sdp-number", as_json(sdp=5, type="offer"), 400, "invalid_request"),
    RequestCase("sdp-object", as_json(sdp={"v": 0}, type="offer"), 400, "invalid_request"),
    RequestCase("type-missing", as_json(sdp=...), 400, "invalid_request"),
    RequestCase("type-answer", as_json(sdp=..., type="answer"), 400, "invalid_request"),
    RequestCase("type-upper-case", as_json(sdp=..., type="OFFER"), 400, "invalid_request"),
    RequestCase("engine-number", offer_json(engine=3), 400, "invalid_request"),
    RequestCase("engine-list", offer_json(engine=["echo"]), 400, "invalid_request"),
    RequestCase("engine-unknown", offer_json(engine="nosuch"), 400, "unknown_engine"),
    RequestCase("options-string", offer_json(options="loud"), 400, "invalid_options"),
    RequestCase("options-list", offer_json(options=[1]), 400, "invalid_options"),
    RequestCase("options-empty-list", offer_json(options=[]), 400, "invalid_options"),
    RequestCase("options-false", offer_json(options=False), 400, "invalid_options"),
    RequestCase("options-zero", offer_json(options=0), 400, "invalid_options"),
    RequestCase("options-empty-string", offer_json(options=""), 400, "invalid_options"),
    RequestCase(
        "option-unknown-for-echo",
        offer_json(engine="echo", options={"gain": 2}),
        400,
        "invalid_options",
    ),
    RequestCase(
        "option-unknown-for-denoise",
        offer_json(engine="denoise", options={"atten_lim": 10}),
        400,
        "invalid_options",
    ),
    RequestCase(
        "option-string-for-number",
        offer_json(engine="denoise", options={"atten_lim_db": "loud"}),
        400,
        "invalid_options",
    ),
    RequestCase(
        "option-bool-for-number",
        offer_json(engine="denoise", options={"atten_lim_db": True}),
        400,
        "invalid_options",
    ),
    RequestCase(
        "option-null",
        offer_json(engine="denoise", options={"atten_lim_db": None}),
        400,
        "invalid_options",
    ),
    RequestCase(
        "option-below-range",
        offer_json(engine="denoise", options={"atten_lim_db": -1}),
        400,
        "invalid_options",
    ),
    RequestCase(
        "option-above-range",
        offer_json(engine="denoise", options={"atten_lim_db": 100.5}),
        400,
        "invalid_options",
    ),
    RequestCase(
        "option-nan",  # Python's JSON parser accepts the NaN literal
        lambda sdp: offer_json(engine="denoise")(sdp)[:-1] + ', "options": {"atten_lim_db": NaN}}',
        400,
        "invalid_options",
    ),
    # Found by fuzzing, each a 500 before: np.isfinite refuses an int past 64 bits, json
    # raises ValueError (not JSONDecodeError) past 4300 digits and RecursionError when nested
    # too deep, and int() refuses the digit '²' that str.isdigit() accepts.
    RequestCase(
        "option-past-64-bits",
        offer_json(engine="denoise", options={"atten_lim_db": 10**20}),
        400,
        "invalid_options",
    ),
    RequestCase(
        "json-number-past-digit-limit",
        lambda sdp: offer_json()(sdp)[:-1] + ', "x": ' + "9" * 5000 + "}",
        400,
        "invalid_json",
    ),
    RequestCase("json-nested-too-deep", lambda sdp: "[" * 5000 + "]" * 5000, 400, "invalid_json"),
    RequestCase(
        "codec-bitrate-superscript-digit",
        offer_json(codec={"bitrate": "\u00b2"}),
        400,
        "invalid_codec",
    ),
    RequestCase(
        "option-infinity",
        lambda sdp: (
            offer_json(engine="denoise")(sdp)[:-1] + ', "options": {"atten_lim_db": Infinity}}'
        ),
        400,
        "invalid_options",
    ),
]


@pytest.mark.parametrize("case", OFFER_CASES, ids=lambda case: case.id)
async def test_offer_refuses_bad_request(
    server: RunningServer, http: aiohttp.ClientSession, case: RequestCase
):
    body = case.body(await new_offer())
    async with await post(http, server.url + "offer", body, case.content_type) as response:
        await expect_error(response, case.status, case.code)
    assert len(server.server.sessions) == 0


WHIP_CASES = [
    RequestCase("content-type-json", identity, 415, "unsupported_media_type", JSON),
    RequestCase("content-type-text", identity, 415, "unsupported_media_type", "text/plain"),
    RequestCase("no-content-type", identity, 415, "unsupported_media_type", None),
    RequestCase("json-offer-as-sdp", offer_json(), 400, "malformed_sdp", SDP),
    RequestCase(
        "not-utf8", lambda sdp: sdp.encode() + b"a=x:\xff\r\n", 400, "invalid_encoding", SDP
    ),
]


@pytest.mark.parametrize("case", WHIP_CASES, ids=lambda case: case.id)
@pytest.mark.parametrize("path", ["whip", "whip/echo"])
async def test_whip_refuses_bad_request(
    server: RunningServer, http: aiohttp.ClientSession, case: RequestCase, path: str
):
    body = case.body(await new_offer())
    async with await post(http, server.url + path, body, case.content_type) as response:
        await expect_error(response, case.status, case.code)
    assert len(server.server.sessions) == 0


@pytest.mark.parametrize("engine", ["nosuch", "ECHO", "sessions"])
async def test_whip_unknown_engine_is_not_found(
    server: RunningServer, http: aiohttp.ClientSession, engine: str
):
    async with await post(http, server.url + f"whip/{engine}", await new_offer(), SDP) as response:
        await expect_error(response, 404, "unknown_engine")


@pytest.mark.parametrize("bitrate", ["\u00b2", "4" * 4400], ids=["superscript", "4400-digits"])
async def test_whip_bitrate_that_int_cannot_read_is_refused(
    server: RunningServer, http: aiohttp.ClientSession, bitrate: str
):
    """Found by fuzzing: ``?bitrate=²`` passed str.isdigit(), then int() raised: a 500."""
    params = {"bitrate": bitrate}
    async with await post(http, server.url + "whip", await new_offer(), SDP, params=params) as r:
        await expect_error(r, 400, "invalid_codec")
    assert len(server.server.sessions) == 0


@pytest.mark.parametrize("value", ["-5", "0", "999999999999"])
async def test_maxaveragebitrate_outside_its_range_is_ignored(
    server: RunningServer, http: aiohttp.ClientSession, value: str
):
    """Found by fuzzing: ``maxaveragebitrate=-5`` reached libopus as the bitrate cap, which
    refused to make the encoder: a 500. Outside RFC 7587's 6000-510000 it is ignored now."""
    sdp = await new_offer()
    opus = re.search(r"^a=rtpmap:(\d+) opus/.*$", sdp, re.MULTILINE | re.IGNORECASE)
    assert opus
    fmtp = f"{opus.group(0)}\r\na=fmtp:{opus.group(1)} maxaveragebitrate={value}"
    payload = {"sdp": sdp.replace(opus.group(0), fmtp, 1), "type": "offer"}
    async with http.post(server.url + "offer", json=payload) as response:
        assert response.status == 200, await response.text()
        session_id = (await response.json())["session_id"]
    async with http.delete(server.url + f"sessions/{session_id}") as response:
        assert response.status == 200


async def test_checking_an_offer_holds_the_event_loop_well_under_a_millisecond(
    server: RunningServer,  # keeps ICE gathering on loopback
):
    """It runs on the event loop for every offer. An offer without maxaveragebitrate (most
    of them) once took 12 ms: ``None in range(6000, 510001)`` walked the whole range."""
    sdp = await new_offer()
    assert "maxaveragebitrate" not in sdp
    assert inspect_offer(sdp).opus.max_average_bitrate is None
    best = float("inf")
    for _ in range(20):
        began = time.perf_counter()
        inspect_offer(sdp)
        best = min(best, time.perf_counter() - began)
    assert best < 0.001, f"{best * 1000:.2f} ms"


async def test_denoise_options_at_the_range_limits_are_accepted(
    server: RunningServer, http: aiohttp.ClientSession
):
    """The refusals above are about the values, not about options as such."""
    for value in (0, 100):
        payload = {
            "sdp": await new_offer(),
            "type": "offer",
            "engine": "denoise",
            "options": {"atten_lim_db": value},
        }
        async with http.post(server.url + "offer", json=payload) as response:
            assert response.status == 200, await response.text()
            session_id = (await response.json())["session_id"]
        async with http.delete(server.url + f"sessions/{session_id}") as response:
            assert response.status == 200
    assert len(server.server.sessions) == 0


# ---------------------------------------------------------------------------------------------
# Body size: refused from the Content-Length, and while reading a chunked body.

SMALL_LIMIT = 2048
DEFAULT_LIMIT = Settings().max_body_bytes


def oversized_offer_json(sdp: str) -> bytes:
    padded = sdp + "a=x-padding:" + "p" * (2 * SMALL_LIMIT) + "\r\n"
    return json.dumps({"sdp": padded, "type": "offer"}).encode()


def oversized_sdp(sdp: str) -> bytes:
    return (sdp + "a=x-padding:" + "p" * (2 * SMALL_LIMIT) + "\r\n").encode()


async def in_chunks(data: bytes, size: int = 512) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]
        await asyncio.sleep(0)


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize(
    ("path", "content_type", "make_body"),
    [
        ("offer", JSON, oversized_offer_json),
        ("whip", SDP, oversized_sdp),
        ("whip/echo", SDP, oversized_sdp),
    ],
    ids=["offer", "whip", "whip-engine"],
)
async def test_body_over_the_limit_is_refused(
    registry: EngineRegistry,
    http: aiohttp.ClientSession,
    chunked: bool,
    path: str,
    content_type: str,
    make_body: Callable[[str], bytes],
):
    async with running_server(registry, max_body_bytes=SMALL_LIMIT) as running:
        body = make_body(await new_offer())
        assert len(body) > SMALL_LIMIT
        data: Any = in_chunks(body) if chunked else body
        async with await post(http, running.url + path, data, content_type) as response:
            if chunked:
                assert response.request_info.headers.get("Transfer-Encoding") == "chunked"
            else:
                assert response.request_info.headers.get("Content-Length") == str(len(body))
            await expect_error(response, 413, "payload_too_large")
        assert len(running.server.sessions) == 0

        # A real offer fits under the same limit and still gets through.
        sdp = await new_offer()
        small: Any = json.dumps({"sdp": sdp, "type": "offer"}) if content_type == JSON else sdp
        assert len(small.encode()) < SMALL_LIMIT
        async with await post(http, running.url + path, small, content_type) as response:
            assert response.status in (200, 201), await response.text()


# ---------------------------------------------------------------------------------------------
# Capacity: with one slot taken by a real, connected session, the next offer is turned away.


async def test_at_capacity_is_503_with_retry_after(
    registry: EngineRegistry, http: aiohttp.ClientSession
):
    async with running_server(registry, max_sessions=1) as running:
        peer = LivePeer()
        try:
            payload = {"sdp": await peer.offer(), "type": "offer"}
            async with http.post(running.url + "offer", json=payload) as response:
                assert response.status == 200, await response.text()
                answer = await response.json()
            await peer.accept(answer["sdp"])
            session = running.server.sessions.get(answer["session_id"])
            async with asyncio.timeout(10):
                await session.connected.wait()

            for path, body, content_type in (
                ("offer", json.dumps({"sdp": await new_offer(), "type": "offer"}), JSON),
                ("whip", await new_offer(), SDP),
                ("whip/echo", await new_offer(), SDP),
            ):
                async with await post(http, running.url + path, body, content_type) as response:
                    await expect_error(response, 503, "at_capacity")
                    retry_after = response.headers.get("Retry-After")
                    assert retry_after is not None and int(retry_after) > 0
            assert len(running.server.sessions) == 1

            # The slot frees up when the session ends.
            async with http.delete(running.url + f"sessions/{answer['session_id']}") as response:
                assert response.status == 200
            assert len(running.server.sessions) == 0
            payload = {"sdp": await new_offer(), "type": "offer"}
            async with http.post(running.url + "offer", json=payload) as response:
                assert response.status == 200, await response.text()
        finally:
            await peer.close()


# ---------------------------------------------------------------------------------------------
# Engines that exist but cannot take a call: not loadable here, or not a transform.


@dataclass
class BareEngine(Engine[None]):
    """Neither a transform nor a speak engine: nothing a call could drive."""

    def new_state(self, options: Any) -> None:
        return None


def load_bare() -> BareEngine:
    return BareEngine(
        name="bare",
        kind=EngineKind.SPEAK,
        sample_rate=24_000,
        hop_size=480,
        delay_ms=0.0,
        description="speaks text",
    )


def load_broken(settings: Any) -> Engine[Any]:
    import tests.signaling.no_such_module  # type: ignore[import-not-found]  # noqa: F401

    raise AssertionError("unreachable")


@pytest.fixture
def odd_registry() -> EngineRegistry:
    extra = [
        EnginePlugin("broken", load_broken),
        EnginePlugin("bare", lambda settings: load_bare()),
    ]
    loaded = EngineRegistry.load(["echo", "broken", "bare"], extra=extra)
    assert loaded.names == ["echo", "bare"]
    assert "broken" in loaded.unavailable
    return loaded


@pytest.mark.parametrize(
    ("engine", "status", "code"),
    [("broken", 503, "engine_unavailable"), ("bare", 400, "unsupported_engine")],
)
async def test_engines_that_cannot_take_a_call(
    odd_registry: EngineRegistry,
    http: aiohttp.ClientSession,
    engine: str,
    status: int,
    code: str,
):
    async with running_server(odd_registry) as running:
        payload = {"sdp": await new_offer(), "type": "offer", "engine": engine}
        async with http.post(running.url + "offer", json=payload) as response:
            await expect_error(response, status, code)
        async with await post(
            http, running.url + f"whip/{engine}", await new_offer(), SDP
        ) as response:
            await expect_error(response, status, code)
        assert len(running.server.sessions) == 0


# ---------------------------------------------------------------------------------------------
# Routes: unknown session ids, unknown paths, wrong methods.


@pytest.mark.parametrize("prefix", ["sessions", "whip/sessions"])
@pytest.mark.parametrize("session_id", ["nosuch", "x" * 32])
async def test_delete_unknown_session_is_404(
    server: RunningServer, http: aiohttp.ClientSession, prefix: str, session_id: str
):
    async with http.delete(server.url + f"{prefix}/{session_id}") as response:
        await expect_error(response, 404, "session_not_found")


async def test_delete_twice_is_404_the_second_time(
    server: RunningServer, http: aiohttp.ClientSession
):
    payload = {"sdp": await new_offer(), "type": "offer"}
    async with http.post(server.url + "offer", json=payload) as response:
        assert response.status == 200, await response.text()
        session_id = (await response.json())["session_id"]
    async with http.delete(server.url + f"sessions/{session_id}") as response:
        assert response.status == 200
    for prefix in ("sessions", "whip/sessions"):
        async with http.delete(server.url + f"{prefix}/{session_id}") as response:
            await expect_error(response, 404, "session_not_found")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "nosuch"),
        ("GET", "sessions/abc/extra"),
        ("POST", "offer/extra"),
        ("POST", "whip/echo/extra"),
        ("DELETE", "sessions/abc/events/extra"),
        ("GET", "web/../../etc/passwd"),
    ],
)
async def test_unknown_route_is_404_json(
    server: RunningServer, http: aiohttp.ClientSession, method: str, path: str
):
    async with http.request(method, server.url + path) as response:
        await expect_error(response, 404, "not_found")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "offer"),
        ("PUT", "whip"),
        ("GET", "whip"),
        ("POST", "healthz"),
        ("POST", ""),
        ("DELETE", "sessions"),
    ],
)
async def test_wrong_method_is_405_json(
    server: RunningServer, http: aiohttp.ClientSession, method: str, path: str
):
    async with http.request(method, server.url + path) as response:
        await expect_error(response, 405, "method_not_allowed")
        assert response.headers.get("Allow")


@pytest.mark.parametrize(
    ("path", "content_type"),
    [("", "text/html"), ("index.html", "text/html"), ("app.js", None), ("style.css", "text/css")],
)
async def test_page_files_are_still_served(
    server: RunningServer, http: aiohttp.ClientSession, path: str, content_type: str | None
):
    async with http.get(server.url + path) as response:
        assert response.status == 200
        assert len(await response.read()) > 0
        if content_type is not None:
            assert response.content_type == content_type


# ---------------------------------------------------------------------------------------------
# After all of the above, on one server: still healthy, still answering.


async def send_every_bad_request(http: aiohttp.ClientSession, url: str) -> int:
    sent = 0
    for sdp_case in SDP_CASES:
        sdp = await bad_sdp(sdp_case)
        payload = json.dumps({"sdp": sdp, "type": "offer"})
        async with await post(http, url + "offer", payload, JSON) as response:
            await expect_error(response, sdp_case.status, sdp_case.code)
        async with await post(http, url + "whip", sdp, SDP) as response:
            await expect_error(response, sdp_case.status, sdp_case.code)
        sent += 2
    for offer_case in OFFER_CASES:
        body = offer_case.body(await new_offer())
        async with await post(http, url + "offer", body, offer_case.content_type) as response:
            await expect_error(response, offer_case.status, offer_case.code)
        sent += 1
    for whip_case in WHIP_CASES:
        body = whip_case.body(await new_offer())
        async with await post(http, url + "whip", body, whip_case.content_type) as response:
            await expect_error(response, whip_case.status, whip_case.code)
        sent += 1
    too_big = b"v=0\r\na=x-padding:" + b"p" * (DEFAULT_LIMIT + 1) + b"\r\n"
    for data in (too_big, in_chunks(too_big, 8192)):
        async with await post(http, url + "whip", data, SDP) as response:
            await expect_error(response, 413, "payload_too_large")
        sent += 1
    async with await post(http, url + "whip/nosuch", await new_offer(), SDP) as response:
        await expect_error(response, 404, "unknown_engine")
    for path in ("sessions/nosuch", "whip/sessions/nosuch"):
        async with http.delete(url + path) as response:
            await expect_error(response, 404, "session_not_found")
    async with http.get(url + "nosuch") as response:
        await expect_error(response, 404, "not_found")
    return sent


async def test_server_stays_healthy_after_every_bad_request(
    server: RunningServer, http: aiohttp.ClientSession
):
    sent = await send_every_bad_request(http, server.url)
    assert sent > 60
    assert len(server.server.sessions) == 0

    async with http.get(server.url + "healthz") as response:
        assert response.status == 200
        assert await response.json() == {"status": "ok"}

    payload = {"sdp": await new_offer(), "type": "offer", "engine": "echo"}
    # A charset parameter on the content type is still JSON.
    headers = {"Content-Type": "application/json; charset=utf-8"}
    async with http.post(server.url + "offer", data=json.dumps(payload), headers=headers) as r:
        assert r.status == 200, await r.text()
        answer = await r.json()
    assert answer["type"] == "answer"
    assert answer["sdp"].startswith("v=0")
    assert isinstance(answer["session_id"], str) and len(answer["session_id"]) >= 32
    assert len(server.server.sessions) == 1

    async with await post(http, server.url + "whip", await new_offer(), SDP) as response:
        assert response.status == 201, await response.text()
        location = response.headers["Location"]
    assert len(server.server.sessions) == 2
    for path in (f"sessions/{answer['session_id']}", location):
        async with http.delete(urljoin(server.url, path)) as response:
            assert response.status == 200
    assert len(server.server.sessions) == 0


def test_cases_cover_every_code():
    """Guards the tables above against losing a code when they are edited."""
    codes = {case.code for case in SDP_CASES} | {case.code for case in OFFER_CASES}
    codes |= {case.code for case in WHIP_CASES}
    assert codes >= {
        "unsupported_media_type",
        "invalid_json",
        "invalid_encoding",
        "invalid_request",
        "malformed_sdp",
        "no_audio",
        "unsupported_codec",
        "unknown_engine",
        "invalid_options",
        "no_audio_input",
        "sdp_rejected",
    }
    assert len({case.id for case in SDP_CASES}) == len(SDP_CASES)
