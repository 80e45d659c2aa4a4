"""server/openapi.json against the routes both ways, and against real responses."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from media.engines.registry import EngineRegistry
from peer.call import PeerCall
from server.deploy.front import create_front_app
from server.http.app import create_app
from server.http.page import WEB_DIR
from tests.conftest import loopback_settings, running_server
from tests.server.schema_check import (
    ANNOTATIONS,
    CHECKED,
    errors,
    load_openapi,
    resolve,
    response_schema,
)

DOCUMENT = load_openapi()
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
PAGE_PATHS = frozenset({"/", *(f"/{p.name}" for p in WEB_DIR.iterdir() if p.is_file())})


def described_operations() -> set[tuple[str, str]]:
    return {
        (method.upper(), path)
        for path, item in DOCUMENT["paths"].items()
        for method in item
        if method in METHODS
    }


def registered_operations(app: web.Application) -> set[tuple[str, str]]:
    """(method, path) of every route, without HEAD (aiohttp adds it to GET) and page files."""
    found = set()
    for route in app.router.routes():
        path = route.resource.canonical if route.resource is not None else None
        if path is None or path in PAGE_PATHS or route.method == "HEAD":
            continue
        found.add((route.method, path))
    return found


def schema_nodes(node: Any) -> Iterator[dict[str, Any]]:
    """Every schema object in the description (under "schema" keys and components)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "schema" and isinstance(value, dict):
                yield from _subschemas(value)
            else:
                yield from schema_nodes(value)
    elif isinstance(node, list):
        for value in node:
            yield from schema_nodes(value)


def _subschemas(schema: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield schema
    for value in schema.get("properties", {}).values():
        yield from _subschemas(value)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from _subschemas(schema[key])
    for value in schema.get("anyOf", []):
        yield from _subschemas(value)


@pytest.fixture(scope="module")
def echo_registry() -> Iterator[EngineRegistry]:
    loaded = EngineRegistry.load(["echo"])
    yield loaded
    loaded.close()


async def test_every_route_is_described_and_every_description_is_a_route(
    echo_registry: EngineRegistry,
):
    """A route added without a description (or a description left after its route went)
    shows up here by method and path."""
    app = create_app(loopback_settings(), echo_registry)
    registered = registered_operations(app)
    described = described_operations()
    assert registered - described == set(), "routes the description lacks"
    assert described - registered == set(), "described operations the server lacks"


async def test_the_front_serves_only_described_paths(echo_registry: EngineRegistry):
    """The front forwards whole paths to workers (any method): each must be described."""
    app = create_front_app(loopback_settings(workers=2), [])
    described_paths = set(DOCUMENT["paths"])
    for method, path in registered_operations(app):
        if method == "*":
            pattern = re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", path) + "$")
            assert any(pattern.match(p) for p in described_paths), path
        else:
            assert (method, path) in described_operations(), (method, path)


def test_the_description_uses_only_keywords_the_validator_checks():
    for schema in schema_nodes(DOCUMENT):
        assert set(schema) <= CHECKED | ANNOTATIONS, sorted(set(schema) - CHECKED - ANNOTATIONS)


def test_every_reference_resolves():
    text = str(DOCUMENT)
    for reference in set(re.findall(r"'\$ref': '([^']+)'", text)):
        assert resolve(DOCUMENT, {"$ref": reference}) is not None


class Checker:
    """Fetches real responses and checks each against the description."""

    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http = http
        self.url = url.rstrip("/")
        self.checked: list[tuple[str, str, int]] = []

    async def check(self, method: str, path: str, template: str, status: int, **kwargs: Any) -> Any:
        async with self.http.request(method, self.url + path, **kwargs) as response:
            assert response.status == status, await response.text()
            body = await response.json() if response.content_type.endswith("json") else None
            schema = response_schema(DOCUMENT, template, method, status, response.content_type)
        assert body is not None
        problems = errors(DOCUMENT, schema, body)
        assert not problems, f"{method} {path} -> {status}: {problems}"
        self.checked.append((method, template, status))
        return body


async def test_real_responses_match_their_schemas(echo_registry: EngineRegistry):
    """Answers from a running server, successes and errors, as a client would see them."""
    async with (
        running_server(echo_registry, max_sessions=1) as server,
        aiohttp.ClientSession() as http,
    ):
        check = Checker(http, server.url)
        await check.check("GET", "/healthz", "/healthz", 200)
        await check.check("GET", "/engines", "/engines", 200)
        ready = await check.check("GET", "/readyz", "/readyz", 200)
        assert ready["ready"] is True
        await check.check("GET", "/openapi.json", "/openapi.json", 200)
        await check.check(
            "POST", "/offer", "/offer", 400, data="{", headers={"Content-Type": "application/json"}
        )
        await check.check(
            "POST", "/offer", "/offer", 415, data="x", headers={"Content-Type": "text/plain"}
        )
        await check.check("GET", "/sessions/nope", "/sessions/{session_id}", 404)

        audio = np.zeros(48_000 * 5, np.float32)
        call = PeerCall(server.url, audio, engine="echo")
        try:
            await call.pc.setLocalDescription(await call.pc.createOffer())
            offer = {"sdp": call.pc.localDescription.sdp, "type": "offer", "engine": "echo"}
            answer = await check.check("POST", "/offer", "/offer", 200, json=offer)
            session = f"/sessions/{answer['session_id']}"
            await asyncio.sleep(0.5)
            described = await check.check("GET", session, "/sessions/{session_id}", 200)
            assert described["session_id"] == answer["session_id"]
            listed = await check.check("GET", "/sessions", "/sessions", 200)
            assert [s["session_id"] for s in listed["sessions"]] == [answer["session_id"]]
            full = await check.check("GET", "/readyz", "/readyz", 503)
            assert full["reasons"] == ["at_capacity"]
            refused = await check.check("POST", "/offer", "/offer", 503, json=offer)
            assert refused["error"] == "at_capacity"
        finally:
            await call.close()
    statuses = {status for _, _, status in check.checked}
    assert {200, 400, 404, 415, 503} <= statuses
