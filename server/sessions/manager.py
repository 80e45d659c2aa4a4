"""Sessions and their whole lifecycle, across peer connections.

A session is created by an offer; it owns one engine state, one pipeline and, while
attached, one peer connection. When the caller's media stops (no RTP for ``rtp_timeout``
seconds; aioice alone would notice only after ~30 s) or the connection fails, the session
detaches: the connection goes, the engine state, queues and speech position stay, for
``resume_grace`` seconds. An offer carrying the session id and its resume token attaches
a new connection and the stream carries on. A session ends on DELETE, when its first
connection never completes ICE within ``ice_timeout``, when its grace period passes, at
``max_session_seconds``, or when the server drains. Ending it releases everything it held:
tasks, the engine state (returned to the engine), buffers and the peer connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import math
import secrets
from collections import Counter
from collections.abc import Coroutine, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from media.audio.languages import foreign_scripts
from media.audio.opus import Application, OpusEncoder
from media.engines.base import (
    Engine,
    EngineKind,
    EngineUnavailable,
    OptionsError,
    SpeakEngine,
    TransformEngine,
)
from media.engines.registry import EngineRegistry, UnknownEngine
from media.pipeline.events import ENGINE_FAILURES, Event, EventSink
from media.pipeline.factory import create_pipeline
from media.pipeline.shared_vad import SharedVad
from media.rtc.connection import OfferRejected, RtcConnection, UnknownMid
from media.rtc.ice import NoMediaPorts
from media.transports.codecs import codec_for
from media.transports.socket_connection import ClosableLink, SocketConnection
from media.transports.socket_input import SocketInput
from media.transports.socket_output import OutputWire, SocketOutput
from server.config import Settings
from server.sessions import refusals
from server.sessions.breaker import Breakers
from server.sessions.channel_limits import ChannelLimits
from server.sessions.events import EventHub
from server.sessions.session import Session
from signaling.errors import ApiError
from signaling.offers import CodecRequest, OfferAnswer, OfferRequest, ResumeRequest
from signaling.sdp import OpusParameters
from signaling.trickle import IceCredentials, IceSession, TrickleFragment
from signaling.websocket import DEFAULT_CODEC, SocketCodecChoice, SocketHello
from signaling.websocket import SocketResume as SocketResumeRequest

log = logging.getLogger(__name__)

SESSION_ID_BYTES = 24  # 192 random bits
RESUME_TOKEN_BYTES = 24
# Mono at 96 kb/s keeps Opus in its CELT mode: full-band speech at a fraction of the CPU
# of SILK/hybrid coding (measured ~0.3 ms vs ~0.6 ms per 20 ms frame here).
DEFAULT_BITRATE = 96_000
FEC_EXPECTED_LOSS_PERCENT = 0  # LBRR costs bits only once loss is expected
MEDIA_CHECKS_PER_TIMEOUT = 5  # how finely the RTP-inactivity watch samples


def opus_encoder_for(
    offer: OpusParameters, codec: CodecRequest, complexity: int = 4
) -> OpusEncoder:
    """The session's encoder: the client's requested settings, capped by its SDP."""
    bitrate = codec.bitrate or DEFAULT_BITRATE
    if offer.max_average_bitrate:
        bitrate = min(bitrate, offer.max_average_bitrate)
    encoder = OpusEncoder(
        channels=1,
        application=Application[codec.application.upper()],
        bitrate=bitrate,
        fec=offer.inband_fec,
        expected_loss_percent=FEC_EXPECTED_LOSS_PERCENT,
    )
    encoder.set_complexity(complexity)
    return encoder


@dataclass(frozen=True)
class SocketAttachment:
    """A socket attached to a session: what the socket's handler reads and writes."""

    session: Session
    connection: SocketConnection
    codec: SocketCodecChoice
    next_seq: int  # the first frame the socket gets
    resumed: bool


def new_session_id(prefix: str = "") -> str:
    """An unguessable id; in a worker process it starts with the worker's routing prefix."""
    return prefix + secrets.token_urlsafe(SESSION_ID_BYTES)


def _token_matches(expected: str, presented: str) -> bool:
    return hmac.compare_digest(expected.encode(), presented.encode())


class SessionManager:
    """Owns every live session of this process; the signaling routes call into it."""

    def __init__(
        self,
        settings: Settings,
        registry: EngineRegistry,
        executor: Executor,
        vad: SharedVad | None = None,
        id_prefix: str = "",
    ) -> None:
        self._settings = settings
        self._vad = vad
        self._id_prefix = id_prefix
        self._registry = registry
        self._executor = executor
        self._sessions: dict[str, Session] = {}
        self._opening = 0
        self._opening_by_client: Counter[str] = Counter()
        self._background: set[asyncio.Task[None]] = set()
        self._empty = asyncio.Event()
        self._empty.set()
        self.breakers = Breakers(settings.breaker_failures, settings.breaker_cooldown)
        self.draining = False  # set on SIGTERM: no new sessions, live ones finish

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def opening(self) -> int:
        """Offers being answered now: sessions about to exist."""
        return self._opening

    @property
    def at_capacity(self) -> bool:
        return len(self._sessions) + self._opening >= self._settings.max_sessions

    def live_sessions(self) -> list[Session]:
        return list(self._sessions.values())

    def get(self, session_id: str) -> Session:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise ApiError(404, "session_not_found", "No live session has that id.") from None

    def _speakers_for(self, text: str) -> list[str]:
        """The loaded speak engines whose languages can read ``text``."""
        return [
            engine.name
            for engine in self._registry.engines
            if engine.kind is EngineKind.SPEAK
            and not foreign_scripts(text, engine.capabilities.languages)
        ]

    def engines_document(self) -> dict[str, Any]:
        loaded = [self._registry.get(name) for name in self._registry.names]
        # A loaded engine whose server is away is listed, and said unavailable for now.
        away = {e.name: e.unavailable_reason for e in loaded if e.unavailable_reason}
        return {
            "default": self._settings.engine,
            "engines": [engine.describe() for engine in loaded],
            "unavailable": {**self._registry.unavailable, **away},
        }

    # --- admission -------------------------------------------------------------------

    def _engine_for(self, request: OfferRequest) -> Engine[Any]:
        return self._engine_named(request.engine, unknown_status=404 if request.whip else 400)

    def _engine_named(self, name: str | None, unknown_status: int = 400) -> Engine[Any]:
        name = name or self._settings.engine
        try:
            engine = self._registry.get(name)
        except UnknownEngine as exc:
            raise ApiError(unknown_status, "unknown_engine", str(exc)) from exc
        except EngineUnavailable as exc:
            raise ApiError(503, "engine_unavailable", str(exc)) from exc
        reason = engine.unavailable_reason
        if reason is not None:
            raise refusals.unavailable(
                "engine_unavailable", f"Engine '{name}' is not available: {reason}"
            )
        if not isinstance(engine, TransformEngine | SpeakEngine):
            raise ApiError(400, "unsupported_engine", f"Engine '{name}' cannot run a call.")
        breaker = self.breakers[engine.name]
        if breaker.is_open:
            wait = math.ceil(breaker.retry_after)
            raise refusals.unavailable(
                "engine_circuit_open",
                f"Engine '{name}' failed repeatedly and takes no new sessions for {wait} s.",
                retry_after=wait,
            )
        return engine

    def _options_for(self, engine: Engine[Any], options: dict[str, Any]) -> dict[str, Any]:
        try:
            return engine.validate_options(options)
        except OptionsError as exc:
            raise ApiError(400, "invalid_options", str(exc)) from exc

    def _admit(self, client: str) -> None:
        if self.draining:
            raise refusals.draining()
        if self.at_capacity:
            raise refusals.at_capacity()
        limit = self._settings.max_client_sessions
        if limit and client and self.client_sessions(client) >= limit:
            raise refusals.client_limit(limit)

    def client_sessions(self, client: str) -> int:
        """Sessions ``client`` holds: live, detached or still connecting."""
        live = sum(1 for session in self._sessions.values() if session.client == client)
        return live + self._opening_by_client[client]

    def sessions_by_client(self) -> dict[str, int]:
        """Every client's session count, for the front's placement across workers."""
        counts = Counter(session.client for session in self._sessions.values())
        counts.update(self._opening_by_client)
        return {client: n for client, n in counts.items() if client and n}

    @staticmethod
    def _require_input(engine: Engine[Any], request: OfferRequest) -> None:
        if isinstance(engine, TransformEngine) and not request.summary.sends_audio:
            raise ApiError(
                400,
                "no_audio_input",
                f"Engine '{engine.name}' transforms the caller's audio: "
                "offer audio as sendrecv or sendonly.",
            )

    async def open_session(self, request: OfferRequest) -> OfferAnswer:
        """A new session for ``request``, or an old one resumed if it says so."""
        if request.resume is not None:
            return await self._resume(request, request.resume)
        self._admit(request.client)
        engine = self._engine_for(request)
        options = self._options_for(engine, request.options)
        self._require_input(engine, request)
        with self._opening_for(request.client):
            return await self._open(request, engine, options)

    @contextlib.contextmanager
    def _opening_for(self, client: str) -> Iterator[None]:
        """Count a session being opened against capacity and its client's limit."""
        self._opening += 1
        self._opening_by_client[client] += 1
        try:
            yield
        finally:
            self._opening -= 1
            self._opening_by_client[client] -= 1
            if not self._opening_by_client[client]:
                del self._opening_by_client[client]

    # --- opening, attaching, resuming ------------------------------------------------

    async def _open(
        self, request: OfferRequest, engine: Engine[Any], options: dict[str, Any]
    ) -> OfferAnswer:
        encoder = opus_encoder_for(
            request.summary.opus, request.codec, self._settings.opus_complexity
        )
        session = await self._new_session(
            engine, options, encoder, request.client, request.summary.sends_audio
        )
        try:
            answer = await self._connect(session, request)
        except ApiError:
            await session.pipeline.close()
            raise
        self._register(session, awaits_connection=True)
        return OfferAnswer(answer, session.id, session.resume_token)

    async def _new_session(
        self,
        engine: Engine[Any],
        options: dict[str, Any],
        encoder: OpusEncoder,
        client: str,
        receives_caller_audio: bool,
    ) -> Session:
        """A session with its pipeline, not yet attached to any connection nor listed."""
        session_id = new_session_id(self._id_prefix)
        events = EventHub()
        emit = self._event_sink(engine.name, events)
        pipeline = await create_pipeline(
            engine, options, self._executor, encoder, emit, session_id, self._vad
        )
        limits = ChannelLimits(self._settings.dc_max_message_bytes, self._settings.dc_max_messages)
        return Session(
            session_id,
            engine,
            pipeline,
            events,
            secrets.token_urlsafe(RESUME_TOKEN_BYTES),
            receives_caller_audio=receives_caller_audio,
            limits=limits,
            speakers_for=self._speakers_for,
            client=client,
        )

    def _register(self, session: Session, awaits_connection: bool) -> None:
        """List an attached session and start its lifecycle tasks.

        ``awaits_connection``: its transport still has to connect (ICE), within the ICE
        timeout; a socket is connected already. Only RTP is watched for silence: a socket
        that dies is noticed by the socket itself (its heartbeat).
        """
        self._sessions[session.id] = session
        self._empty.clear()
        if awaits_connection:
            self._start(session, self._await_connection(session))
        self._start(session, session.report_stats())
        rtp = isinstance(session.connection, RtcConnection)
        if rtp and session.receives_caller_audio and self._settings.rtp_timeout > 0:
            self._start(session, self._watch_media(session))
        if self._settings.max_session_seconds > 0:
            self._start(session, self._expire(session))
        log.info("session %s: opened with engine %s", session.id, session.engine.name)

    def _event_sink(self, engine: str, events: EventHub) -> EventSink:
        """Publish a session's events; engine failures also count towards its breaker."""
        breaker = self.breakers[engine]

        def publish(event: Event) -> None:
            if event.get("type") == "error" and event.get("error") in ENGINE_FAILURES:
                breaker.record_failure()
            events.publish(event)

        return publish

    async def _connect(self, session: Session, request: OfferRequest) -> str:
        """Give ``session`` a new connection for ``request``'s offer; return the answer."""

        def on_state(connection: RtcConnection, state: str) -> None:
            if session.connection is not connection:
                return  # a connection the session has already left
            log.info("session %s: connection %s", session.id, state)
            if state == "connected":
                self._connected(session)
            elif state == "failed":
                self._spawn(self._lose_connection(session, "the connection failed"))
            elif state == "closed":
                self._close_soon(session.id, "connection_closed")

        connection = RtcConnection(self._settings.ice_servers, on_state, session.use_channel)
        try:
            answer = await connection.answer(
                request.sdp, session.pipeline, send_audio=request.summary.receives_audio
            )
        except NoMediaPorts as exc:
            raise refusals.unavailable(
                "no_media_ports", str(exc), retry_after=exc.retry_after_s
            ) from exc
        except OfferRejected as exc:
            raise ApiError(400, "sdp_rejected", f"The offer was rejected: {exc}") from exc
        session.connection = connection
        return answer

    def _connected(self, session: Session) -> None:
        session.connected.set()
        session.ever_connected = True
        if session.detached_at is None:
            return
        session.detached_at = None
        if session.grace is not None:
            session.grace.cancel()
            session.grace = None
        session.events.publish({"type": "resumed", "resumes": session.resumes})
        log.info("session %s: resumed", session.id)

    async def _resume(self, request: OfferRequest, resume: ResumeRequest) -> OfferAnswer:
        """Attach a new connection to a live or detached session that the token unlocks."""
        session = self._resumable(resume.session_id, resume.token, request.engine)
        self._require_input(session.engine, request)
        if session.connection is not None:
            await self._detach(session, "a new connection resumes it")
        answer = await self._connect(session, request)
        session.resume_token = secrets.token_urlsafe(RESUME_TOKEN_BYTES)  # one use each
        session.resumes += 1
        return OfferAnswer(answer, session.id, session.resume_token)

    # --- sockets (the WebSocket transport) ------------------------------------------------

    async def open_socket(
        self,
        hello: SocketHello,
        link: ClosableLink,
        client: str,
        wire: OutputWire | None = None,
    ) -> SocketAttachment:
        """A new session for a socket's ``hello``, or a detached one resumed if it says so.

        ``wire``: how the socket's protocol spells the output (default: ``/ws``'s own).
        """
        if hello.resume is not None:
            return await self._resume_socket(hello, hello.resume, link)
        self._admit(client)
        engine = self._engine_named(hello.engine)
        options = self._options_for(engine, hello.options or {})
        choice = hello.codec or DEFAULT_CODEC
        encoder = opus_encoder_for(OpusParameters(), CodecRequest(), self._settings.opus_complexity)
        with self._opening_for(client):
            session = await self._new_session(
                engine, options, encoder, client, isinstance(engine, TransformEngine)
            )
        session.socket_output = SocketOutput(
            session.pipeline.output, codec_for(choice.name, choice.rate), hello.credit_ms, wire
        )
        connection, next_seq = self._attach_socket(session, link, None)
        self._register(session, awaits_connection=False)
        self._connected(session)
        return SocketAttachment(session, connection, choice, next_seq, resumed=False)

    async def _resume_socket(
        self, hello: SocketHello, resume: SocketResumeRequest, link: ClosableLink
    ) -> SocketAttachment:
        session = self._resumable(resume.session_id, resume.token, hello.engine)
        output = session.socket_output
        if output is None:  # a WebRTC session continues over a socket
            choice = hello.codec or DEFAULT_CODEC
            output = SocketOutput(
                session.pipeline.output, codec_for(choice.name, choice.rate), hello.credit_ms
            )
            session.socket_output = output
        choice = SocketCodecChoice(output.codec.name, output.codec.rate)
        if hello.codec not in (None, choice):
            raise ApiError(
                400,
                "resume_codec_mismatch",
                f"The session carries {choice.name} at {choice.rate} Hz; resume with that.",
            )
        output.grant(hello.credit_ms)
        if session.connection is not None:
            await self._detach(session, "a new connection resumes it")
        connection, next_seq = self._attach_socket(session, link, resume.played_seq)
        session.resume_token = secrets.token_urlsafe(RESUME_TOKEN_BYTES)  # one use each
        session.resumes += 1
        self._connected(session)
        return SocketAttachment(session, connection, choice, next_seq, resumed=True)

    def _attach_socket(
        self, session: Session, link: ClosableLink, played_seq: int | None
    ) -> tuple[SocketConnection, int]:
        output = session.socket_output
        assert output is not None
        pipeline = session.pipeline

        def engine_load() -> tuple[int, int]:
            counters = pipeline.counters()
            return counters.input_queued or 0, counters.input_dropped

        audio_in = SocketInput(
            output.codec, pipeline.feed, output.tell, engine_load, on_error=pipeline.input_failed
        )
        connection = SocketConnection(link, output, audio_in)
        pipeline.attach(audio_in)
        next_seq = output.attach(link, played_seq)
        session.connection = connection
        session.use_channel(connection)
        return connection, next_seq

    async def socket_closed(
        self, session: Session, connection: SocketConnection, hung_up: bool
    ) -> None:
        """A session's socket closed from the client's side: a hang-up ends the session;
        a lost socket detaches it, resumable within the grace period."""
        connection.closed_by_client()
        if session.connection is not connection or self._sessions.get(session.id) is not session:
            return  # replaced already by a resumed connection, or the session is ending
        if hung_up:
            await self._close_if_open(session.id, "connection_closed")
        else:
            await self._lose_connection(session, "the socket closed")

    def _resumable(self, session_id: str, token: str, engine: str | None) -> Session:
        """The session a resume names, if the token unlocks it and the engine matches."""
        session = self._sessions.get(session_id)
        if session is None:
            raise ApiError(
                404,
                "session_not_found",
                "No session to resume by that id: it ended or its grace period passed.",
            )
        if not _token_matches(session.resume_token, token):
            raise ApiError(403, "invalid_resume_token", "The resume token does not match.")
        if engine not in (None, session.engine.name):
            raise ApiError(
                400,
                "resume_engine_mismatch",
                f"Session runs engine '{session.engine.name}', not '{engine}'.",
            )
        return session

    # --- detaching ---------------------------------------------------------------------

    async def _lose_connection(self, session: Session, why: str) -> None:
        """The peer is gone: keep the session for a resume, or end it if none is allowed.

        A session that never connected has nothing to resume: it ends as soon as ICE gives
        up, and stops counting against its client's limit.
        """
        if not session.ever_connected:
            log.info("session %s: %s before it ever connected, closing", session.id, why)
            await self._close_if_open(session.id, "ice_failed")
        elif self._settings.resume_grace > 0:
            await self._detach(session, why)
        else:
            log.info("session %s: %s, closing", session.id, why)
            await self._close_if_open(session.id, "connection_lost")

    async def _detach(self, session: Session, why: str) -> None:
        connection = session.connection
        if connection is None:
            return
        session.connection = None
        session.pipeline.detach()
        session.connected.clear()
        session.drop_channel()
        if session.detached_at is None:
            session.detached_at = asyncio.get_running_loop().time()
            grace = self._settings.resume_grace
            session.grace = asyncio.create_task(self._reclaim_after_grace(session))
            session.events.publish({"type": "detached", "reason": why, "resume_within_s": grace})
            log.info("session %s: detached (%s), resumable for %.0f s", session.id, why, grace)
        await connection.close()

    async def _reclaim_after_grace(self, session: Session) -> None:
        await asyncio.sleep(self._settings.resume_grace)
        session.grace = None
        log.info("session %s: not resumed within its grace period", session.id)
        await self._close_if_open(session.id, "not_resumed")

    # --- lifecycle tasks ---------------------------------------------------------------

    def _start(self, session: Session, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        session.tasks.add(task)
        task.add_done_callback(session.tasks.discard)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` detached from any session task (it may close that session)."""
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _await_connection(self, session: Session) -> None:
        """Close a session whose peer never completes ICE (it would hold a slot forever)."""
        deadline = self._settings.ice_timeout
        try:
            async with asyncio.timeout(deadline):
                await session.connected.wait()
        except TimeoutError:
            log.info("session %s: not connected after %.0f s, closing", session.id, deadline)
            self._close_soon(session.id, "ice_timeout")

    async def _watch_media(self, session: Session) -> None:
        """Detach a connected session whose caller has sent no RTP for ``rtp_timeout``."""
        timeout = self._settings.rtp_timeout
        loop = asyncio.get_running_loop()
        seen: tuple[object, int] | None = None
        quiet_since = loop.time()
        while True:
            await asyncio.sleep(timeout / MEDIA_CHECKS_PER_TIMEOUT)
            if session.connection is None or not session.connected.is_set():
                seen = None
                continue
            now = (session.connection, session.pipeline.receive_stats.packets)
            if now != seen:
                seen, quiet_since = now, loop.time()
            elif loop.time() - quiet_since >= timeout:
                seen = None
                why = f"no media for {timeout:g} s"
                self._spawn(self._lose_connection(session, why))

    async def _expire(self, session: Session) -> None:
        limit = self._settings.max_session_seconds
        await asyncio.sleep(limit)
        log.info("session %s: reached the %.0f s limit, closing", session.id, limit)
        self._close_soon(session.id, "max_duration")

    # --- closing -----------------------------------------------------------------------

    def _close_soon(self, session_id: str, reason: str) -> None:
        self._spawn(self._close_if_open(session_id, reason))

    async def _close_if_open(self, session_id: str, reason: str) -> None:
        if session_id in self._sessions:
            await self.close_session(session_id, reason)

    async def close_session(self, session_id: str, reason: str = "deleted") -> None:
        """End a session; ``reason`` is what metrics count it under and what its listeners
        hear (a ``session_ended`` event: a caller that gets it knows not to resume)."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            raise ApiError(404, "session_not_found", "No live session has that id.")
        session.close_reason = reason
        session.events.publish({"type": "session_ended", "reason": reason})
        if not self._sessions:
            self._empty.set()
        current = asyncio.current_task()
        for task in (*session.tasks, session.grace):
            if task is not None and task is not current:
                task.cancel()
        await session.pipeline.close()
        if session.socket_output is not None:
            session.socket_output.close()
        session.events.close()
        if session.connection is not None:
            connection, session.connection = session.connection, None
            await connection.close()
        session.closed.set()
        log.info("session %s: closed", session_id)

    async def drain(self, timeout: float) -> None:
        """Stop admitting; let live sessions end by themselves for up to ``timeout`` s.

        Clients hear about it (a ``server_draining`` event) so they can finish and hang
        up; whatever is still live at the deadline is closed cleanly.
        """
        self.draining = True
        for session in self._sessions.values():
            session.events.publish({"type": "server_draining", "deadline_s": timeout})
        if self._sessions:
            log.info("draining %d sessions for up to %.0f s", len(self._sessions), timeout)
        try:
            async with asyncio.timeout(timeout):
                await self._empty.wait()
        except TimeoutError:
            log.info("drain timeout: closing %d sessions", len(self._sessions))
        await self.close_all()

    async def close_all(self) -> None:
        for session_id in list(self._sessions):
            await self.close_session(session_id, "shutdown")
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    # --- trickle ICE -------------------------------------------------------------------

    def _attached(self, session_id: str) -> RtcConnection:
        connection = self.get(session_id).connection
        if connection is None:
            raise ApiError(
                409,
                "session_detached",
                "The session has no connection now; resume it with a new offer.",
            )
        if not isinstance(connection, RtcConnection):
            raise ApiError(
                409, "not_webrtc", "The session is attached over a socket: it has no ICE."
            )
        return connection

    def ice_session(self, session_id: str) -> IceSession:
        """What a trickle PATCH is checked against: the answer and the client's credentials."""
        connection = self._attached(session_id)
        return IceSession(connection.answer_sdp, IceCredentials(*connection.remote_credentials()))

    async def add_remote_candidates(self, session_id: str, fragment: TrickleFragment) -> None:
        """Give the session's connection the candidates its client trickled."""
        candidates = [(c.mid, c.candidate) for c in fragment.candidates]
        try:
            await self._attached(session_id).add_remote_candidates(
                candidates, fragment.end_of_candidates
            )
        except UnknownMid as exc:
            raise ApiError(
                400,
                "unknown_mid",
                f"The offer has no m= section with mid {exc.mid!r} "
                f"(it has {', '.join(exc.known) or 'none'}).",
            ) from exc
