"""HTTP signaling: the JSON offer/answer route and WHIP (RFC 9725).

Both routes validate the request, then hand an :class:`OfferRequest` to a
:class:`SessionHost`, which owns sessions and models; signaling itself never touches audio
or engines, it only passes the engine's name through.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from aiohttp import web
from aiohttp.typedefs import Handler

from media.rtc.candidates import without_unreachable_candidates
from server.http.auth import is_authorized
from server.http.bodies import read_body
from server.http.clients import client_of
from server.http.cors import ALLOWED_HEADERS, PREFLIGHT_MAX_AGE_SECONDS
from signaling.errors import ApiError
from signaling.ice import IceServer
from signaling.offers import (
    JSON_TYPE,
    SDP_TYPE,
    WHIP_SESSION_PATH,
    CodecRequest,
    OfferAnswer,
    OfferRequest,
    parse_offer_json,
    whip_etag,
)
from signaling.sdp import inspect_offer
from signaling.trickle import (
    TRICKLE_TYPE,
    IceSession,
    TrickleFragment,
    check_if_match,
    parse_sdpfrag,
)


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

    def handlers(self) -> dict[str, Handler]:
        """This class's handlers by their names in ``server.http.routes``."""
        return {
            "engines": self.engines,
            "offer": self.offer,
            "whip_publish": self.whip_publish,
            "whip_options": self.whip_options,
            "delete_session": self.delete_session,
            "whip_trickle": self.whip_trickle,
        }

    async def engines(self, request: web.Request) -> web.Response:
        return web.json_response(self._host.engines_document())

    async def offer(self, request: web.Request) -> web.Response:
        _require_content_type(request, JSON_TYPE)
        text = await _read_text(request, self._max_body)
        sdp, engine, options, codec, resume = parse_offer_json(text)
        offer = OfferRequest(
            sdp=without_unreachable_candidates(sdp),
            summary=inspect_offer(sdp),
            engine=engine,
            options=options,
            codec=codec,
            resume=resume,
            client=client_of(request),
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
            client=client_of(request),
        )
        answer = await self._host.open_session(offer)
        location = WHIP_SESSION_PATH.format(session_id=answer.session_id)
        headers = {"Location": location, "ETag": whip_etag(answer.sdp)}
        response = web.Response(status=201, text=answer.sdp, content_type=SDP_TYPE, headers=headers)
        for server in self._ice_servers:
            response.headers.add("Link", server.link_header())
        return response

    async def whip_options(self, request: web.Request) -> web.Response:
        """CORS preflight, plus the ICE servers a client may use before it offers.

        The origin headers are added by the CORS policy (server/http/cors.py). A preflight
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
        check_if_match(request.headers.get("If-Match"), whip_etag(ice.answer_sdp))
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
