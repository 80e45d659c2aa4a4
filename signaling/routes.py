"""HTTP signaling: the JSON offer/answer route and WHIP (RFC 9725).

Both routes validate the request, then hand an :class:`OfferRequest` to a
:class:`SessionHost`, which owns sessions and models; signaling itself never touches audio
or engines, it only passes the engine's name through.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from signaling.auth import is_authorized
from signaling.bodies import read_body
from signaling.candidates import without_unreachable_candidates
from signaling.cors import ALLOWED_HEADERS, PREFLIGHT_MAX_AGE_SECONDS
from signaling.errors import ApiError
from signaling.ice import IceServer
from signaling.sdp import OfferSummary, inspect_offer
from signaling.trickle import (
    TRICKLE_TYPE,
    IceSession,
    TrickleFragment,
    check_if_match,
    parse_sdpfrag,
)

SDP_TYPE = "application/sdp"
JSON_TYPE = "application/json"
WHIP_SESSION_PATH = "/whip/sessions/{session_id}"


APPLICATIONS = ("voip", "audio", "restricted_lowdelay")
MIN_BITRATE, MAX_BITRATE = 6_000, 510_000


@dataclass(frozen=True)
class CodecRequest:
    """Per-session Opus settings a client may ask for (the offer's fmtp still caps them).

    ``restricted_lowdelay`` saves ~5 ms of codec delay per direction at the cost of SILK's
    speech coding; ``bitrate`` is in bits per second.
    """

    application: str = "voip"
    bitrate: int | None = None

    @classmethod
    def parse(cls, raw: Any) -> CodecRequest:
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise ApiError(400, "invalid_codec", "Field 'codec' must be a JSON object.")
        unknown = sorted(set(raw) - {"application", "bitrate"})
        if unknown:
            raise ApiError(400, "invalid_codec", f"Unknown codec setting '{unknown[0]}'.")
        application = raw.get("application", "voip")
        if application not in APPLICATIONS:
            raise ApiError(
                400, "invalid_codec", f"codec.application must be one of {', '.join(APPLICATIONS)}."
            )
        bitrate = raw.get("bitrate")
        if bitrate is not None:
            # ASCII digits only: str.isdigit() also accepts '²', which int() refuses, and
            # int() refuses past 4300 digits (out of range anyway).
            if isinstance(bitrate, str) and bitrate.isascii() and bitrate.isdigit():
                with contextlib.suppress(ValueError):
                    bitrate = int(bitrate)
            if (
                isinstance(bitrate, bool)
                or not isinstance(bitrate, int)
                or not MIN_BITRATE <= bitrate <= MAX_BITRATE
            ):
                raise ApiError(
                    400,
                    "invalid_codec",
                    f"codec.bitrate must be an integer from {MIN_BITRATE} to {MAX_BITRATE}.",
                )
        return cls(application, bitrate)


@dataclass(frozen=True)
class ResumeRequest:
    """An offer's claim to continue a detached session: its id and its resume token."""

    session_id: str
    token: str

    @classmethod
    def parse(cls, raw: Any) -> ResumeRequest | None:
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise ApiError(400, "invalid_resume", "Field 'resume' must be a JSON object.")
        session_id, token = raw.get("session_id"), raw.get("token")
        if not isinstance(session_id, str) or not isinstance(token, str):
            raise ApiError(
                400, "invalid_resume", "Field 'resume' needs string 'session_id' and 'token'."
            )
        return cls(session_id, token)


@dataclass(frozen=True)
class OfferRequest:
    """A validated offer, as the session host receives it."""

    sdp: str
    summary: OfferSummary
    engine: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    codec: CodecRequest = CodecRequest()
    whip: bool = False
    resume: ResumeRequest | None = None


@dataclass(frozen=True)
class OfferAnswer:
    sdp: str
    session_id: str
    resume_token: str = ""  # what a later offer presents to resume this session


class SessionHost(Protocol):
    """What signaling needs from the server: open, close, describe, and trickle ICE."""

    async def open_session(self, request: OfferRequest) -> OfferAnswer:
        """Create a session and return the answer; raise :class:`ApiError` on refusal."""

    async def close_session(self, session_id: str) -> None:
        """End a session; raise :class:`ApiError` 404 when there is none by that id."""

    def engines_document(self) -> dict[str, Any]:
        """The body of ``GET /engines``."""

    def ice_session(self, session_id: str) -> IceSession:
        """The session's answer and the client's ICE credentials; 404, 409 if detached."""

    async def add_remote_candidates(self, session_id: str, fragment: TrickleFragment) -> None:
        """Hand trickled candidates to the session's connection; 400 for an unknown mid."""


def _require_content_type(request: web.Request, expected: str) -> None:
    if request.content_type != expected:
        got = request.content_type or "none"
        raise ApiError(415, "unsupported_media_type", f"Send {expected} (got {got}).")


async def _read_text(request: web.Request, limit: int) -> str:
    body = await read_body(request, limit)
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, "invalid_encoding", "The body must be UTF-8 text.") from exc


def _parse_offer_json(
    text: str,
) -> tuple[str, str | None, dict[str, Any], CodecRequest, ResumeRequest | None]:
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ApiError(400, "invalid_json", f"The body is not valid JSON: {exc.msg}.") from exc
    except (ValueError, RecursionError) as exc:  # a number past int's digit limit, deep nesting
        raise ApiError(
            400, "invalid_json", "The body nests too deeply or has a number too long to read."
        ) from exc
    if not isinstance(payload, dict):
        raise ApiError(400, "invalid_request", "The body must be a JSON object.")
    sdp, kind = payload.get("sdp"), payload.get("type")
    if not isinstance(sdp, str):
        raise ApiError(400, "invalid_request", "Field 'sdp' must be a string.")
    if kind != "offer":
        raise ApiError(400, "invalid_request", "Field 'type' must be \"offer\".")
    engine = payload.get("engine")
    if engine is not None and not isinstance(engine, str):
        raise ApiError(400, "invalid_request", "Field 'engine' must be a string.")
    options = payload.get("options")
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise ApiError(400, "invalid_options", "Field 'options' must be a JSON object.")
    codec = CodecRequest.parse(payload.get("codec"))
    return sdp, engine, options, codec, ResumeRequest.parse(payload.get("resume"))


def _etag(answer_sdp: str) -> str:
    """An entity tag for the ICE session: it changes exactly when the ICE credentials do."""
    ufrag = next(
        (
            line[len("a=ice-ufrag:") :]
            for line in answer_sdp.splitlines()
            if line.startswith("a=ice-ufrag:")
        ),
        answer_sdp,
    )
    return '"' + hashlib.sha256(ufrag.encode()).hexdigest()[:16] + '"'


class SignalingRoutes:
    """The offer, WHIP, session-delete and engine-listing routes."""

    def __init__(
        self,
        host: SessionHost,
        ice_servers: Sequence[IceServer] = (),
        max_body_bytes: int = 64 * 1024,
    ) -> None:
        self._host = host
        self._ice_servers = list(ice_servers)
        self._max_body = max_body_bytes

    def register(self, app: web.Application) -> None:
        app.router.add_get("/engines", self.engines)
        app.router.add_post("/offer", self.offer)
        app.router.add_delete("/sessions/{session_id}", self.delete_session)
        for path in ("/whip", "/whip/{engine}"):
            app.router.add_post(path, self.whip_publish)
            app.router.add_route("OPTIONS", path, self.whip_options)
        app.router.add_delete(WHIP_SESSION_PATH, self.delete_session)
        app.router.add_patch(WHIP_SESSION_PATH, self.whip_trickle)
        app.router.add_route("OPTIONS", WHIP_SESSION_PATH, self.whip_options)

    async def engines(self, request: web.Request) -> web.Response:
        return web.json_response(self._host.engines_document())

    async def offer(self, request: web.Request) -> web.Response:
        _require_content_type(request, JSON_TYPE)
        text = await _read_text(request, self._max_body)
        sdp, engine, options, codec, resume = _parse_offer_json(text)
        offer = OfferRequest(
            sdp=without_unreachable_candidates(sdp),
            summary=inspect_offer(sdp),
            engine=engine,
            options=options,
            codec=codec,
            resume=resume,
        )
        answer = await self._host.open_session(offer)
        return web.json_response(
            {
                "sdp": answer.sdp,
                "type": "answer",
                "session_id": answer.session_id,
                "resume_token": answer.resume_token,
            }
        )

    async def whip_publish(self, request: web.Request) -> web.Response:
        _require_content_type(request, SDP_TYPE)
        sdp = await _read_text(request, self._max_body)
        offer = OfferRequest(
            sdp=without_unreachable_candidates(sdp),
            summary=inspect_offer(sdp),
            engine=request.match_info.get("engine"),
            codec=CodecRequest.parse(dict(request.query) or None),
            whip=True,
        )
        answer = await self._host.open_session(offer)
        location = WHIP_SESSION_PATH.format(session_id=answer.session_id)
        headers = {"Location": location, "ETag": _etag(answer.sdp)}
        response = web.Response(status=201, text=answer.sdp, content_type=SDP_TYPE, headers=headers)
        for server in self._ice_servers:
            response.headers.add("Link", server.link_header())
        return response

    async def whip_options(self, request: web.Request) -> web.Response:
        """CORS preflight, plus the ICE servers a client may use before it offers.

        The origin headers are added by the CORS policy (signaling/cors.py). A preflight
        carries no credentials, so the ICE servers (TURN passwords) are only listed for a
        request whose token is good, or when the server asks for none.
        """
        headers = {
            "Access-Control-Allow-Methods": "POST, PATCH, DELETE, OPTIONS",
            "Access-Control-Allow-Headers": ALLOWED_HEADERS,
            "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_SECONDS),
            "Accept-Post": SDP_TYPE,
        }
        if "session_id" in request.match_info:
            headers["Accept-Patch"] = TRICKLE_TYPE  # RFC 5789 section 3.1
        response = web.Response(status=204, headers=headers)
        if is_authorized(request):
            for server in self._ice_servers:
                response.headers.add("Link", server.link_header())
        return response

    async def delete_session(self, request: web.Request) -> web.Response:
        await self._host.close_session(request.match_info["session_id"])
        return web.Response(status=200)

    async def whip_trickle(self, request: web.Request) -> web.Response:
        """Trickle ICE (RFC 9725 section 4.3.2): the client's later candidates; 204.

        Checked in RFC 9110 section 13.2.2's order: the session (404), its entity tag
        (428 without ``If-Match``, 412 when stale), then the fragment (400). New ICE
        credentials ask for an ICE restart, which aiortc cannot do: RFC 9725 section 4.3.1
        prescribes 422 for a session that supports trickle ICE but not restarts, and
        section 4.3.3 keeps the session and its ICE session going.
        """
        if request.content_type != TRICKLE_TYPE:
            raise ApiError(
                415,
                "unsupported_media_type",
                f"Send {TRICKLE_TYPE} (got {request.content_type or 'none'}).",
                headers={"Accept-Patch": TRICKLE_TYPE},  # RFC 5789 section 2.2
            )
        text = await _read_text(request, self._max_body)
        session_id = request.match_info["session_id"]
        ice = self._host.ice_session(session_id)
        check_if_match(request.headers.get("If-Match"), _etag(ice.answer_sdp))
        fragment = parse_sdpfrag(text)
        if fragment.restarts_ice(ice.remote):
            raise ApiError(
                422,
                "ice_restart_unsupported",
                "This server cannot restart ICE; the current ICE session goes on. "
                "Offer again (POST) for a new session.",
            )
        await self._host.add_remote_candidates(session_id, fragment)
        return web.Response(status=204)
