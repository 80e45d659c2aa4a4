"""The HTTP guards on an in-process server: tokens, CORS, the session rate limit, body caps
and the page's files. One test per rule; each names the failure it would catch."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import wave
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from media.engines.base import Capabilities
from media.engines.registry import EngineRegistry
from peer.call import PeerCall
from peer.cli import PeerOptions, build_parser
from server.http.errors import json_errors
from server.http.prompt_routes import MAX_PROMPT_BYTES
from server.http.security import protect
from signaling.client import SignalingError
from signaling.ice import IceServer
from tests.conftest import LOOPBACK, RunningServer, loopback_settings, running_server
from tests.signaling.offers import new_offer

USER_TOKEN = "user-secret-0123456789"
ADMIN_TOKEN = "admin-secret-9876543210"
TURN = IceServer.parse("turn:alice:turnpass@turn.example.net:3478")
ALLOWED_ORIGIN = "https://app.example"
# Every route that reaches a session or creates one, with an id no session has.
API_ROUTES = [
    ("GET", "engines"),
    ("POST", "offer"),
    ("POST", "whip"),
    ("POST", "whip/echo"),
    ("DELETE", "whip/sessions/nope"),
    ("GET", "sessions/nope"),
    ("DELETE", "sessions/nope"),
    ("POST", "sessions/nope/speak"),
    ("POST", "sessions/nope/interrupt"),
    ("POST", "sessions/nope/prompt"),
    ("GET", "sessions/nope/events"),
]
PAGE_FILES = ["", "healthz", "app.js", "style.css", "favicon.svg", "index.html"]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def guarded(registry: EngineRegistry) -> AsyncIterator[RunningServer]:
    async with running_server(registry, auth_token=USER_TOKEN, admin_token=ADMIN_TOKEN) as s:
        yield s


async def call(
    http: aiohttp.ClientSession, method: str, url: str, **kwargs: Any
) -> tuple[int, Any, Any]:
    """Status, headers and the JSON body (None when the body is not JSON)."""
    async with http.request(method, url, **kwargs) as response:
        try:
            body = await response.json(content_type=None)
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = None
        return response.status, response.headers, body


# ---- tokens ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "authorization", [None, "Basic dXNlcjpwYXNz", "Bearer", "Bearer a b", USER_TOKEN]
)
async def test_api_routes_answer_401_without_a_well_formed_bearer_token(
    guarded: RunningServer, http: aiohttp.ClientSession, authorization: str | None
):
    """A missing or malformed header is 401 with a Bearer challenge, on every API route."""
    headers = {} if authorization is None else {"Authorization": authorization}
    for method, path in API_ROUTES:
        status, reply_headers, body = await call(http, method, guarded.url + path, headers=headers)
        assert status == 401, (method, path)
        assert reply_headers["WWW-Authenticate"].startswith("Bearer"), (method, path)
        assert body["error"] == "unauthorized"
    assert len(guarded.server.sessions) == 0


async def test_api_routes_answer_403_to_a_wrong_token(
    guarded: RunningServer, http: aiohttp.ClientSession
):
    for method, path in API_ROUTES:
        status, _, body = await call(http, method, guarded.url + path, headers=bearer("guess"))
        assert (status, body["error"]) == (403, "forbidden"), (method, path)


@pytest.mark.parametrize("token", [USER_TOKEN, ADMIN_TOKEN])
async def test_api_routes_accept_the_token_and_the_admin_token(
    guarded: RunningServer, http: aiohttp.ClientSession, token: str
):
    """Past the guard each route gives its own answer (200, 404 for no session, 415...)."""
    for method, path in API_ROUTES:
        status, _, _ = await call(http, method, guarded.url + path, headers=bearer(token))
        assert status not in (401, 403), (method, path)
    status, _, body = await call(http, "GET", guarded.url + "engines", headers=bearer(token))
    assert status == 200 and body["default"] == "echo"


@asynccontextmanager
async def admin_app(**tokens: str | None) -> AsyncIterator[str]:
    """The guards on stand-in handlers for the admin routes (``GET /sessions``, ``/metrics``)
    and one normal route, so the rules are checked whichever module serves those routes."""

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application(middlewares=[json_errors])
    for path in ("/sessions", "/metrics", "/engines"):
        app.router.add_get(path, ok)
    protect(app, loopback_settings(**tokens), page_paths=())
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, LOOPBACK, 0)
    await site.start()
    try:
        yield f"http://{LOOPBACK}:{runner.addresses[0][1]}/"
    finally:
        await runner.cleanup()


async def statuses(http: aiohttp.ClientSession, url: str, token: str | None) -> list[int]:
    headers = bearer(token) if token else {}
    found = []
    for path in ("sessions", "metrics", "engines"):
        status, _, _ = await call(http, "GET", url + path, headers=headers)
        found.append(status)
    return found


async def test_admin_routes_need_the_admin_token_when_one_is_set(http: aiohttp.ClientSession):
    """[GET /sessions, GET /metrics, GET /engines] with each kind of token."""
    async with admin_app(auth_token=USER_TOKEN, admin_token=ADMIN_TOKEN) as url:
        assert await statuses(http, url, None) == [401, 401, 401]
        assert await statuses(http, url, USER_TOKEN) == [403, 403, 200]
        assert await statuses(http, url, ADMIN_TOKEN) == [200, 200, 200]
    async with admin_app(admin_token=ADMIN_TOKEN) as url:  # normal routes open
        assert await statuses(http, url, None) == [401, 401, 200]
        assert await statuses(http, url, "guess") == [403, 403, 200]
        assert await statuses(http, url, ADMIN_TOKEN) == [200, 200, 200]
    async with admin_app(auth_token=USER_TOKEN) as url:  # no admin token: the normal one
        assert await statuses(http, url, None) == [401, 401, 401]
        assert await statuses(http, url, USER_TOKEN) == [200, 200, 200]
    async with admin_app() as url:
        assert await statuses(http, url, None) == [200, 200, 200]


async def test_the_server_s_own_admin_routes_take_only_the_admin_token(
    guarded: RunningServer, http: aiohttp.ClientSession
):
    for path in ("sessions", "metrics"):
        for token, expected in ((None, 401), (USER_TOKEN, 403), (ADMIN_TOKEN, 200)):
            headers = bearer(token) if token else {}
            status, _, _ = await call(http, "GET", guarded.url + path, headers=headers)
            assert status == expected, (path, token)


async def test_page_and_health_stay_public_with_auth_on(
    guarded: RunningServer, http: aiohttp.ClientSession
):
    for path in PAGE_FILES:
        async with http.get(guarded.url + path) as response:
            assert response.status == 200, path
    for path in ("readyz", "openapi.json"):  # public whenever they are served
        async with http.get(guarded.url + path) as response:
            assert response.status not in (401, 403), path


@pytest.mark.parametrize(
    ("path", "method"),
    [
        ("offer", "POST"),
        ("whip", "POST"),
        ("whip/echo", "POST"),
        ("whip/sessions/nope", "DELETE"),
        ("sessions/nope", "DELETE"),
        ("sessions/nope/speak", "POST"),
        ("sessions/nope/events", "GET"),
    ],
)
async def test_preflight_needs_no_token(
    guarded: RunningServer, http: aiohttp.ClientSession, path: str, method: str
):
    """Browsers send a preflight without credentials: refusing it would block every call."""
    headers = {
        "Origin": ALLOWED_ORIGIN,
        "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    async with http.options(guarded.url + path, headers=headers) as response:
        assert response.status == 204
        assert response.headers["Access-Control-Allow-Origin"] == "*"
        methods = {m.strip() for m in response.headers["Access-Control-Allow-Methods"].split(",")}
        assert method in methods
        allowed = response.headers["Access-Control-Allow-Headers"].lower()
        assert "authorization" in allowed and "content-type" in allowed


async def test_whip_preflight_lists_turn_credentials_only_to_a_good_token(
    registry: EngineRegistry, http: aiohttp.ClientSession
):
    """The ICE servers in WHIP's OPTIONS carry TURN passwords; a preflight has no token."""
    async with running_server(registry, auth_token=USER_TOKEN, ice_servers=(TURN,)) as server:
        async with http.options(server.url + "whip") as response:
            assert response.status == 204
            assert "Link" not in response.headers
        async with http.options(server.url + "whip", headers=bearer("guess")) as response:
            assert "Link" not in response.headers
        async with http.options(server.url + "whip", headers=bearer(USER_TOKEN)) as response:
            assert response.headers.getall("Link") == [TURN.link_header()]


async def test_tokens_never_reach_the_logs(
    guarded: RunningServer, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
):
    """The access log and our own loggers, at debug level, for good and bad tokens."""
    caplog.set_level(logging.DEBUG)
    for token in (USER_TOKEN, ADMIN_TOKEN, "guess-token-abc"):
        for method, path in API_ROUTES:
            await call(http, method, guarded.url + path, headers=bearer(token))
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "/engines" in logged  # the access log was captured
    for token in (USER_TOKEN, ADMIN_TOKEN, "guess-token-abc"):
        assert token not in logged


# ---- CORS -----------------------------------------------------------------------------------


async def test_listed_origin_is_echoed_with_vary_and_others_get_no_grant(
    registry: EngineRegistry, http: aiohttp.ClientSession
):
    """On a normal answer, an error answer and a preflight alike."""
    async with running_server(registry, cors_origins=(ALLOWED_ORIGIN,)) as server:
        requests = [
            ("GET", "engines", {}),
            ("GET", "sessions/nope", {}),
            ("OPTIONS", "offer", {"Access-Control-Request-Method": "POST"}),
        ]
        for method, path, extra in requests:
            for origin, granted in ((ALLOWED_ORIGIN, True), ("https://evil.example", False)):
                headers = {"Origin": origin, **extra}
                async with http.request(method, server.url + path, headers=headers) as response:
                    assert response.status in (200, 204, 404)
                    vary = {v.strip() for v in response.headers.get("Vary", "").split(",")}
                    assert "Origin" in vary, (method, path)
                    if granted:
                        assert response.headers["Access-Control-Allow-Origin"] == origin
                        exposed = response.headers["Access-Control-Expose-Headers"].lower()
                        assert "location" in exposed and "retry-after" in exposed
                    else:
                        assert "Access-Control-Allow-Origin" not in response.headers
        async with http.get(server.url + "engines") as response:  # same-origin: no Origin
            assert "Access-Control-Allow-Origin" not in response.headers


async def test_any_origin_by_default_on_every_api_route(
    server: RunningServer, http: aiohttp.ClientSession
):
    """Not only WHIP: the page's own ``/offer`` and the session routes too, errors included."""
    for method, path in API_ROUTES:
        headers = {"Origin": "https://anywhere.example"}
        async with http.request(method, server.url + path, headers=headers) as response:
            assert response.headers["Access-Control-Allow-Origin"] == "*", (method, path)


# ---- the session rate limit -----------------------------------------------------------------


async def test_new_sessions_over_the_rate_get_429_then_recover(
    registry: EngineRegistry, http: aiohttp.ClientSession
):
    """60 a minute is a burst of 60 and one more each second after it.

    Refused offers count (each costs parsing, and a real one a peer connection), requests
    refused by the token check do not, and other routes are not limited.
    """
    async with running_server(registry, rate_limit=60, auth_token=USER_TOKEN) as server:
        for _ in range(5):
            status, _, _ = await call(http, "POST", server.url + "offer")
            assert status == 401
        offer = {"data": "{not json", "headers": {"Content-Type": "application/json"}}
        sdp = {"data": "v=0", "headers": {"Content-Type": "application/sdp"}}
        for index in range(60):
            path, body = [("offer", offer), ("whip", sdp), ("whip/echo", sdp)][index % 3]
            kwargs = {**body, "headers": {**body["headers"], **bearer(USER_TOKEN)}}
            status, _, _ = await call(http, "POST", server.url + path, **kwargs)
            assert status == 400, index
        for path, body in (("offer", offer), ("whip", sdp), ("whip/echo", sdp)):
            kwargs = {**body, "headers": {**body["headers"], **bearer(USER_TOKEN)}}
            status, headers, error = await call(http, "POST", server.url + path, **kwargs)
            assert (status, error["error"]) == (429, "rate_limited")
            assert headers["Retry-After"] == "1"
        status, _, _ = await call(http, "GET", server.url + "engines", headers=bearer(USER_TOKEN))
        assert status == 200
        await asyncio.sleep(1.05)
        kwargs = {**offer, "headers": {**offer["headers"], **bearer(USER_TOKEN)}}
        status, _, _ = await call(http, "POST", server.url + "offer", **kwargs)
        assert status == 400


# ---- body caps ------------------------------------------------------------------------------


async def chunked(data: bytes, pause: float = 0.0) -> AsyncIterator[bytes]:
    """A body without Content-Length (the cap cannot be checked before reading), sent in
    16 kB pieces ``pause`` seconds apart, as a slower link would deliver it."""
    for start in range(0, len(data), 16 * 1024):
        yield data[start : start + 16 * 1024]
        await asyncio.sleep(pause)


@pytest.fixture
def echo_takes_prompts(registry: EngineRegistry) -> Iterator[list[tuple[int, int]]]:
    """The echo engine given a voice-prompt hook, so the prompt route reads bodies without
    CosyVoice's model; yields the (samples, rate) of each clip it was handed."""
    received: list[tuple[int, int]] = []

    def set_prompt(state: Any, audio: np.ndarray, rate: int, transcript: str) -> None:
        received.append((len(audio), rate))

    engine = registry.get("echo")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine, "set_prompt", set_prompt)
        patch.setattr(engine, "capabilities", Capabilities(voice_prompt=True))
        yield received


def wav_bytes(seconds: float, rate: int = 16_000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(np.zeros(int(seconds * rate), "<i2").tobytes())
    return out.getvalue()


@pytest.mark.parametrize("announced", [True, False], ids=["content-length", "chunked"])
async def test_every_body_route_refuses_an_oversized_body_with_413(
    server: RunningServer,
    http: aiohttp.ClientSession,
    echo_takes_prompts: list[tuple[int, int]],
    announced: bool,
):
    limit = server.server.settings.max_body_bytes
    status, _, answer = await call(
        http, "POST", server.url + "offer", json={"sdp": await new_offer(), "type": "offer"}
    )
    assert status == 200
    session = answer["session_id"]
    big = b"x" * (limit + 1)
    routes = [
        ("offer", "application/json", big),
        ("whip", "application/sdp", big),
        ("whip/echo", "application/sdp", big),
        (f"sessions/{session}/speak", "application/json", big),
        (f"sessions/{session}/prompt", "audio/wav", b"x" * (MAX_PROMPT_BYTES + 1)),
    ]
    for path, content_type, body in routes:
        data: Any = body if announced else chunked(body)
        headers = {"Content-Type": content_type}
        status, _, error = await call(http, "POST", server.url + path, data=data, headers=headers)
        assert (status, error["error"]) == (413, "payload_too_large"), path
    assert echo_takes_prompts == []
    status, _, _ = await call(http, "DELETE", server.url + f"sessions/{session}")
    assert status == 200


async def test_a_prompt_clip_larger_than_other_bodies_is_read_whole(
    server: RunningServer, http: aiohttp.ClientSession, echo_takes_prompts: list[tuple[int, int]]
):
    """Guards against reading only what had arrived: ``request.content.read(n)`` returned
    the first 16 kB of a clip sent in pieces, and the engine got a truncated WAV."""
    status, _, answer = await call(
        http, "POST", server.url + "offer", json={"sdp": await new_offer(), "type": "offer"}
    )
    assert status == 200
    clip = wav_bytes(5.0)  # 160 kB, over the 64 kB of every other route
    assert len(clip) > server.server.settings.max_body_bytes
    route = server.url + f"sessions/{answer['session_id']}/prompt"
    status, _, reply = await call(
        http, "POST", route, data=chunked(clip, pause=0.01), headers={"Content-Type": "audio/wav"}
    )
    assert status == 200 and reply["seconds"] == 5.0
    assert echo_takes_prompts == [(80_000, 16_000)]
    await call(http, "DELETE", server.url + f"sessions/{answer['session_id']}")


# ---- the page's files -----------------------------------------------------------------------


async def raw_get(url: str, target: str) -> tuple[int, bytes]:
    """A GET with the request target sent exactly as written (clients normalise ``..``)."""
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        response = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


@pytest.mark.parametrize(
    "target",
    [
        "/../server/config.py",
        "/%2e%2e/pyproject.toml",
        "/..%2fpyproject.toml",
        "/web/../README.md",
        "/app.js/../../README.md",
        "/.git/config",
        "/web/index.html",
        "/server/http/app.py",
        "//etc/passwd",
        "/%2fetc%2fpasswd",
    ],
)
async def test_no_path_reaches_a_file_outside_web(server: RunningServer, target: str):
    status, body = await raw_get(server.url, target)
    assert status == 404, body[:200]
    assert json.loads(body)["error"] == "not_found"


@pytest.mark.parametrize(
    ("path", "types"),
    [
        ("", {"text/html"}),
        ("index.html", {"text/html"}),
        ("app.js", {"text/javascript", "application/javascript"}),
        ("style.css", {"text/css"}),
        ("favicon.svg", {"image/svg+xml"}),
    ],
)
async def test_page_files_have_their_content_types(
    server: RunningServer, http: aiohttp.ClientSession, path: str, types: set[str]
):
    async with http.get(server.url + path) as response:
        assert response.status == 200
        assert response.content_type in types


async def test_the_headless_peer_calls_with_its_token(guarded: RunningServer):
    audio = np.zeros(48_000, np.float32)
    async with PeerCall(guarded.url, audio, engine="echo", token=USER_TOKEN) as peer:
        assert peer.session_id is not None
    with pytest.raises(SignalingError) as refused:
        async with PeerCall(guarded.url, audio, engine="echo", token="wrong"):
            pass
    assert refused.value.status == 403


def test_peer_token_comes_from_its_flag_or_the_server_variable(monkeypatch: pytest.MonkeyPatch):
    argv = ["--url", "http://127.0.0.1:1", "--input", "a.wav", "--output", "b.wav"]
    monkeypatch.setenv("COSYRTC_AUTH_TOKEN", "from-env")
    assert PeerOptions.from_args(build_parser().parse_args(argv)).token == "from-env"
    flagged = build_parser().parse_args([*argv, "--token", "from-flag"])
    assert PeerOptions.from_args(flagged).token == "from-flag"
