"""Sessions: one peer connection, one engine state, one pipeline, and their whole lifecycle.

A session is created by an offer and ends on DELETE, when its connection fails or closes,
or when ICE has not connected within ``ice_timeout``. Ending it releases everything it
held: tasks, the engine state (returned to the engine), buffers and the peer connection.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from concurrent.futures import Executor
from typing import Any

from aiortc import RTCPeerConnection, RTCRtpSender, RTCSessionDescription

from media.engines.base import (
    Engine,
    EngineUnavailable,
    OptionsError,
    SpeakEngine,
    TransformEngine,
)
from media.engines.registry import EngineRegistry, UnknownEngine
from media.opus import Application, OpusEncoder
from media.pipeline import TransformPipeline
from media.speak import SpeakPipeline
from media.vad import SileroVad
from server.config import Settings
from server.events import EventHub
from server.session import Session
from signaling.errors import ApiError
from signaling.ice import rtc_configuration
from signaling.routes import CodecRequest, OfferAnswer, OfferRequest
from signaling.sdp import OpusParameters

log = logging.getLogger(__name__)

SESSION_ID_BYTES = 24  # 192 random bits
RETRY_AFTER_SECONDS = 2
# Mono at 96 kb/s keeps Opus in its CELT mode: full-band speech at a fraction of the CPU
# of SILK/hybrid coding (measured ~0.3 ms vs ~0.6 ms per 20 ms frame here).
DEFAULT_BITRATE = 96_000
FEC_EXPECTED_LOSS_PERCENT = 0  # LBRR costs bits only once loss is expected


def opus_encoder_for(offer: OpusParameters, codec: CodecRequest) -> OpusEncoder:
    """The session's encoder: the client's requested settings, capped by its SDP."""
    bitrate = codec.bitrate or DEFAULT_BITRATE
    if offer.max_average_bitrate:
        bitrate = min(bitrate, offer.max_average_bitrate)
    return OpusEncoder(
        channels=1,
        application=Application[codec.application.upper()],
        bitrate=bitrate,
        fec=offer.inband_fec,
        expected_loss_percent=FEC_EXPECTED_LOSS_PERCENT,
    )


def prefer_opus(pc: RTCPeerConnection) -> None:
    """Answer with Opus only: the receive path decodes Opus and nothing else."""
    capabilities = RTCRtpSender.getCapabilities("audio")
    opus = [c for c in capabilities.codecs if c.mimeType.lower() == "audio/opus"]
    for transceiver in pc.getTransceivers():
        if transceiver.kind == "audio":
            transceiver.setCodecPreferences(opus)


def new_session_id(prefix: str = "") -> str:
    """An unguessable id; in a worker process it starts with the worker's routing prefix."""
    return prefix + secrets.token_urlsafe(SESSION_ID_BYTES)


class SessionManager:
    """Owns every live session of this process; the signaling routes call into it."""

    def __init__(
        self,
        settings: Settings,
        registry: EngineRegistry,
        executor: Executor,
        vad: SileroVad | None = None,
        id_prefix: str = "",
    ) -> None:
        self._settings = settings
        self._vad = vad
        self._id_prefix = id_prefix
        self._registry = registry
        self._executor = executor
        self._sessions: dict[str, Session] = {}
        self._opening = 0
        self._closing: set[asyncio.Task[None]] = set()
        self.draining = False  # set on SIGTERM: no new sessions, live ones finish

    def __len__(self) -> int:
        return len(self._sessions)

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

    def engines_document(self) -> dict[str, Any]:
        return {
            "default": self._settings.engine,
            "engines": [self._registry.get(name).describe() for name in self._registry.names],
            "unavailable": self._registry.unavailable,
        }

    def _engine_for(self, request: OfferRequest) -> Engine[Any]:
        name = request.engine or self._settings.engine
        try:
            engine = self._registry.get(name)
        except UnknownEngine as exc:
            raise ApiError(404 if request.whip else 400, "unknown_engine", str(exc)) from exc
        except EngineUnavailable as exc:
            raise ApiError(503, "engine_unavailable", str(exc)) from exc
        if not isinstance(engine, TransformEngine | SpeakEngine):
            raise ApiError(400, "unsupported_engine", f"Engine '{name}' cannot run a call.")
        return engine

    async def open_session(self, request: OfferRequest) -> OfferAnswer:
        if self.at_capacity:
            raise ApiError(
                503,
                "at_capacity",
                "The server is at capacity; retry shortly.",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        engine = self._engine_for(request)
        try:
            options = engine.validate_options(request.options)
        except OptionsError as exc:
            raise ApiError(400, "invalid_options", str(exc)) from exc
        if isinstance(engine, TransformEngine) and not request.summary.sends_audio:
            raise ApiError(
                400,
                "no_audio_input",
                f"Engine '{engine.name}' transforms the caller's audio: "
                "offer audio as sendrecv or sendonly.",
            )
        self._opening += 1
        try:
            return await self._open(request, engine, options)
        finally:
            self._opening -= 1

    async def _open(
        self, request: OfferRequest, engine: Engine[Any], options: dict[str, Any]
    ) -> OfferAnswer:
        session_id = new_session_id(self._id_prefix)
        encoder = opus_encoder_for(request.summary.opus, request.codec)
        events = EventHub()
        pipeline: TransformPipeline | SpeakPipeline
        if isinstance(engine, SpeakEngine):
            pipeline = await SpeakPipeline.create(
                engine, options, self._executor, encoder, events.publish, session_id, self._vad
            )
        else:
            assert isinstance(engine, TransformEngine)
            pipeline = await TransformPipeline.create(
                engine, options, self._executor, encoder, session_id
            )
        pc = RTCPeerConnection(rtc_configuration(self._settings.ice_servers))
        session = Session(session_id, engine, pc, pipeline, events)
        pc.on("datachannel", session.use_channel)

        @pc.on("connectionstatechange")
        def on_state() -> None:
            log.info("session %s: connection %s", session_id, pc.connectionState)
            if pc.connectionState == "connected":
                session.connected.set()
            if pc.connectionState in ("failed", "closed"):
                self._close_soon(session_id)

        try:
            await pc.setRemoteDescription(RTCSessionDescription(request.sdp, "offer"))
            prefer_opus(pc)
            audio = next(t for t in pc.getTransceivers() if t.kind == "audio")
            track = pipeline.attach(audio.receiver)
            if request.summary.receives_audio:
                pc.addTrack(track)
            await pc.setLocalDescription(await pc.createAnswer())
        except Exception as exc:
            await pipeline.close()
            await pc.close()
            raise ApiError(400, "sdp_rejected", f"The offer was rejected: {exc}") from exc
        self._sessions[session_id] = session
        session.watchdog = asyncio.create_task(self._await_connection(session))
        session.reporter = asyncio.create_task(session.report_stats())
        log.info("session %s: opened with engine %s", session_id, engine.name)
        return OfferAnswer(pc.localDescription.sdp, session_id)

    async def _await_connection(self, session: Session) -> None:
        """Close a session whose peer never completes ICE (it would hold a slot forever)."""
        deadline = self._settings.ice_timeout
        try:
            async with asyncio.timeout(deadline):
                await session.connected.wait()
        except TimeoutError:
            log.info("session %s: not connected after %.0f s, closing", session.id, deadline)
            self._close_soon(session.id)

    def _close_soon(self, session_id: str) -> None:
        task = asyncio.create_task(self._close_if_open(session_id))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close_if_open(self, session_id: str) -> None:
        if session_id in self._sessions:
            await self.close_session(session_id)

    async def close_session(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        if session is None:
            raise ApiError(404, "session_not_found", "No live session has that id.")
        for task in (session.watchdog, session.reporter):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        await session.pipeline.close()
        session.events.close()
        await session.pc.close()
        session.closed.set()
        log.info("session %s: closed", session_id)

    async def close_all(self) -> None:
        for session_id in list(self._sessions):
            await self.close_session(session_id)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
