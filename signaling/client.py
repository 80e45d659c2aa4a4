"""The client side of signaling: send an offer (JSON or WHIP), get the answer, end the session.

Used by the headless peer and by tests. It also talks to servers written the aiortc
examples' way, whose ``/offer`` answers without a session id and has no DELETE route.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin

import aiohttp

from signaling.offers import SDP_TYPE


class SignalingError(Exception):
    """The server refused the offer; carries its status and JSON error code when it sent one."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Answer:
    sdp: str
    session_id: str | None
    resource_url: str | None  # where DELETE ends the session, when the server has one
    resume_token: str | None = None  # presented with the session id to resume the session

    @property
    def resume(self) -> dict[str, str] | None:
        """The ``resume`` field of an offer that continues this session on a new connection."""
        if self.session_id is None or self.resume_token is None:
            return None
        return {"session_id": self.session_id, "token": self.resume_token}


async def _raise_for_error(response: aiohttp.ClientResponse) -> None:
    if response.status < 400:
        return
    try:
        body = await response.json(content_type=None)
        code, message = body.get("error", "http_error"), body.get("message", "")
    except (ValueError, aiohttp.ContentTypeError, AttributeError):
        code, message = "http_error", (await response.text())[:200]
    raise SignalingError(response.status, code, message)


async def post_offer(
    http: aiohttp.ClientSession,
    base_url: str,
    sdp: str,
    engine: str | None = None,
    options: dict[str, Any] | None = None,
    codec: dict[str, Any] | None = None,
    resume: dict[str, str] | None = None,
) -> Answer:
    """``POST {base}/offer`` with the JSON shape (``resume``: continue a detached session)."""
    payload: dict[str, Any] = {"sdp": sdp, "type": "offer"}
    if engine is not None:
        payload["engine"] = engine
    if options:
        payload["options"] = options
    if codec:
        payload["codec"] = codec
    if resume:
        payload["resume"] = resume
    async with http.post(urljoin(base_url, "offer"), json=payload) as response:
        await _raise_for_error(response)
        body = await response.json(content_type=None)
    session_id = body.get("session_id")
    resource = urljoin(base_url, f"sessions/{session_id}") if session_id else None
    return Answer(body["sdp"], session_id, resource, body.get("resume_token"))


async def post_whip(
    http: aiohttp.ClientSession, base_url: str, sdp: str, engine: str | None = None
) -> Answer:
    """``POST {base}/whip[/{engine}]`` with ``application/sdp`` (RFC 9725)."""
    path = f"whip/{engine}" if engine else "whip"
    headers = {"Content-Type": SDP_TYPE}
    async with http.post(urljoin(base_url, path), data=sdp, headers=headers) as response:
        await _raise_for_error(response)
        if response.status != 201:
            raise SignalingError(response.status, "unexpected_status", "WHIP answers 201 Created")
        answer_sdp = await response.text()
        location = response.headers.get("Location")
    resource = urljoin(base_url, location) if location else None
    session_id = location.rstrip("/").rsplit("/", 1)[-1] if location else None
    return Answer(answer_sdp, session_id, resource)


async def delete_session(http: aiohttp.ClientSession, answer: Answer) -> int | None:
    """End the session on the server; return the HTTP status (None when it has no route)."""
    if answer.resource_url is None:
        return None
    async with http.delete(answer.resource_url) as response:
        return response.status
