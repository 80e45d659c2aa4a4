"""Phone calls through Twilio: the voice webhook and the Media Stream it opens.

``POST /twilio/voice`` is the webhook a Twilio number calls when a call comes in: the
request is checked against ``X-Twilio-Signature`` (over the public URL), and the answer is
TwiML that connects the call's bidirectional stream to ``/twilio/media``, carrying the
engine, its options and an optional greeting (query parameters ``engine``, ``options`` as
JSON, ``say``) plus a token only this server can make for that call.

``GET /twilio/media`` is that stream: Twilio's JSON messages (``connected``, ``start``,
``media``, ``mark``, ``dtmf``, ``stop``) over a WebSocket. The stream must present the
call's token in ``start``; a signed handshake is checked as well. The call is an ordinary
session (``SessionManager.open_socket``, codec mu-law at 8 kHz), so limits, metrics, events
and HTTP control (``POST /sessions/{id}/speak``) work as for any other; keypresses are
published as ``dtmf`` events. A phone stream cannot be resumed: when it ends the session
ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.parse
from typing import Any

from aiohttp import WSMsgType, web
from aiohttp.typedefs import Handler

from server.config import Settings
from server.http.bodies import read_body
from server.http.socket_routes import HEARTBEAT_S, HELLO_TIMEOUT_S, WebSocketLink
from server.sessions.control import ControlError
from server.sessions.manager import SessionManager, SocketAttachment
from signaling.errors import ApiError
from signaling.twilio import (
    MAX_MESSAGE_BYTES,
    Dtmf,
    Mark,
    Media,
    Start,
    Stop,
    TwilioProtocolError,
    connect_stream_twiml,
    parse_message,
    signature_valid,
    stream_token,
    stream_token_valid,
)
from signaling.twilio_wire import TwilioWire
from signaling.websocket import SocketCodecChoice, SocketHello

log = logging.getLogger(__name__)

MEDIA_PATH = "/twilio/media"
MULAW = SocketCodecChoice("mulaw", 8_000)
FORM_TYPE = "application/x-www-form-urlencoded"
TWIML_TYPE = "text/xml"
SIGNATURE_HEADER = "X-Twilio-Signature"
CLOSE_POLICY = 1008  # a stream that cannot show it belongs to a call this server answered
LOG_INTERVAL_S = 10.0


class TwilioRoutes:
    def __init__(self, sessions: SessionManager, settings: Settings) -> None:
        self._sessions = sessions
        self._token = settings.twilio_auth_token
        self._public = (settings.public_url or "").rstrip("/")

    def handlers(self) -> dict[str, Handler]:
        """This class's handlers by their names in ``server.http.routes``."""
        return {"twilio_voice": self.voice, "twilio_media": self.media}

    def _auth_token(self) -> str:
        if self._token is None:
            raise ApiError(
                404,
                "twilio_not_configured",
                "Phone calls are off: start the server with --twilio-auth-token and --public-url.",
            )
        return self._token

    def _public_url(self, request: web.Request, scheme: str | None = None) -> str:
        """The URL Twilio requested (``scheme``: as the WebSocket scheme for the stream)."""
        url = self._public + request.path_qs
        if scheme is not None:
            url = ("wss" if url.startswith("https") else "ws") + url[url.index(":") :]
        return url

    # --- the webhook -------------------------------------------------------------------

    async def voice(self, request: web.Request) -> web.StreamResponse:
        token = self._auth_token()
        if request.content_type != FORM_TYPE:
            raise ApiError(415, "unsupported_media_type", f"Send {FORM_TYPE} (Twilio does).")
        body = await read_body(request, MAX_MESSAGE_BYTES)
        try:
            form = dict(urllib.parse.parse_qsl(body.decode("utf-8"), keep_blank_values=True))
        except (UnicodeDecodeError, ValueError) as exc:
            raise ApiError(400, "invalid_form", "The body is not a UTF-8 form.") from exc
        url = self._public_url(request)
        if not signature_valid(token, url, form, request.headers.get(SIGNATURE_HEADER)):
            raise ApiError(403, "invalid_signature", "X-Twilio-Signature does not match.")
        call_sid = form.get("CallSid")
        if not call_sid:
            raise ApiError(400, "missing_call_sid", "A voice webhook names its call: CallSid.")
        parameters = {"token": stream_token(token, call_sid)}
        for name in ("engine", "options", "say"):
            value = request.query.get(name)
            if value:
                parameters[name] = value
        stream_url = self._public_url(request, scheme="ws").split("/twilio/")[0] + MEDIA_PATH
        try:
            twiml = connect_stream_twiml(stream_url, parameters)
        except ValueError as exc:
            raise ApiError(400, "invalid_parameters", str(exc)) from exc
        return web.Response(text=twiml, content_type=TWIML_TYPE)

    # --- the stream --------------------------------------------------------------------

    async def media(self, request: web.Request) -> web.StreamResponse:
        token = self._auth_token()
        presented = request.headers.get(SIGNATURE_HEADER)
        if presented is not None and not signature_valid(
            token, self._public_url(request, scheme="ws"), {}, presented
        ):
            raise ApiError(403, "invalid_signature", "X-Twilio-Signature does not match.")
        ws = web.WebSocketResponse(heartbeat=HEARTBEAT_S, max_msg_size=MAX_MESSAGE_BYTES)
        if not ws.can_prepare(request).ok:
            raise ApiError(426, "websocket_required", "Twilio opens this route as a WebSocket.")
        await ws.prepare(request)
        start = await _start_of(ws)
        if start is None or not stream_token_valid(
            token, start.call_sid, start.custom_parameters.get("token")
        ):
            log.warning("twilio stream refused: no start with this call's token")
            await ws.close(code=CLOSE_POLICY, message=b"not a stream this server answered")
            return ws
        link = WebSocketLink(ws)
        try:
            # Every call comes from Twilio's addresses: the per-address limits do not apply.
            attached = await self._sessions.open_socket(
                _hello(start), link, client="", wire=TwilioWire(start.stream_sid)
            )
        except ApiError as exc:
            log.warning("twilio call %s refused: %s (%s)", start.call_sid, exc.code, exc.message)
            await ws.close(code=4000 + exc.status, message=exc.code.encode())
            return ws
        log.info("twilio call %s: session %s", start.call_sid, attached.session.id)
        attached.connection.start()
        greeting = start.custom_parameters.get("say")
        if greeting:
            _say(attached, greeting)
        try:
            await _serve(ws, attached)
        finally:
            await self._sessions.socket_closed(attached.session, attached.connection, True)
            await ws.close()
        return ws


def _hello(start: Start) -> SocketHello:
    """The session a stream's ``start`` asks for: engine and options from its parameters."""
    if start.encoding != "audio/x-mulaw" or start.sample_rate != MULAW.rate:
        raise ApiError(400, "unsupported_codec", "Media Streams carry mu-law at 8000 Hz.")
    options: Any = None
    raw = start.custom_parameters.get("options")
    if raw:
        try:
            options = json.loads(raw)
        except ValueError as exc:
            raise ApiError(400, "invalid_options", "'options' must be a JSON object.") from exc
        if not isinstance(options, dict):
            raise ApiError(400, "invalid_options", "'options' must be a JSON object.")
    return SocketHello(engine=start.custom_parameters.get("engine"), options=options, codec=MULAW)


async def _start_of(ws: web.WebSocketResponse) -> Start | None:
    """Read up to the ``start`` message (``connected`` comes first); None if none comes."""
    try:
        async with asyncio.timeout(HELLO_TIMEOUT_S):
            async for message in ws:
                if message.type is not WSMsgType.TEXT:
                    return None
                try:
                    parsed = parse_message(message.data)
                except TwilioProtocolError:
                    return None
                if isinstance(parsed, Start):
                    return parsed
    except TimeoutError:
        return None
    return None


def _say(attached: SocketAttachment, text: str) -> None:
    try:
        attached.session.speaker.speak(text)
    except ControlError as exc:
        log.info("twilio greeting not spoken: %s", exc.message)


async def _serve(ws: web.WebSocketResponse, attached: SocketAttachment) -> None:
    """Carry the stream's messages to the session until ``stop`` or the socket closes."""
    session, connection = attached.session, attached.connection
    output = session.socket_output
    assert output is not None
    wire = output.wire
    assert isinstance(wire, TwilioWire)
    unreadable, logged_at = 0, 0.0
    async for message in ws:
        if message.type is not WSMsgType.TEXT:
            break
        try:
            parsed = parse_message(message.data)
        except TwilioProtocolError as exc:
            unreadable += 1
            if time.monotonic() - logged_at >= LOG_INTERVAL_S:
                logged_at = time.monotonic()
                log.warning("twilio stream: %d unreadable message(s): %s", unreadable, exc)
            continue
        if isinstance(parsed, Media):
            connection.input.receive_payload(parsed.chunk, parsed.payload)
        elif isinstance(parsed, Mark) and parsed.name.isdigit():
            seq = int(parsed.name)
            output.ack(seq, played=wire.mark_played(seq))
        elif isinstance(parsed, Dtmf):
            session.events.publish({"type": "dtmf", "digit": parsed.digit})
        elif isinstance(parsed, Stop):
            break
