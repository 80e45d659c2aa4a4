"""One WebRTC connection of a session: aiortc's peer connection, answered and attached.

The server's session code sees a connection through this class only: it answers an offer
with a pipeline's audio attached (the RTP receive path feeding the pipeline, the paced
track sending its output), reports its state by name, takes trickled candidates and closes.
The offer is read line by line for the few ICE attributes trickle needs: aiortc's full SDP
parser takes ~1 ms, too long for the event loop on every PATCH.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiortc import RTCPeerConnection, RTCRtpReceiver, RTCRtpSender, RTCSessionDescription
from aiortc.rtcrtpparameters import RTCRtpReceiveParameters, RTCRtpSendParameters
from aiortc.sdp import candidate_from_sdp

from media.pipeline.base import Pipeline
from media.rtc.candidates import reachable_candidate
from media.rtc.compat import (
    divert_rtp,
    forget_sent_packets,
    install_receive_path,
    protected_rtp_send,
    received_report,
    sender_ssrc,
    sent_report,
    when_receiver_starts,
    when_sender_starts,
)
from media.rtc.ice import IceServerConfig, NoMediaPorts, rtc_configuration
from media.rtc.loss_feedback import LossAdaptiveFec
from media.rtc.media_tick import MediaTick, TickStream
from media.rtc.receive import AudioReceivePath
from media.rtc.rtp_intake import RtpIntake
from media.rtc.rtp_stream import RtpAudioStream
from media.rtc.tracks import ParkedAudioTrack


class OfferRejected(Exception):
    """aiortc could not answer the offer; the message says why."""


class UnknownMid(Exception):
    """A trickled candidate names an m= section the offer does not have."""

    def __init__(self, mid: str, known: Sequence[str]) -> None:
        super().__init__(f"The offer has no m= section with mid {mid!r}")
        self.mid = mid
        self.known = list(known)


@dataclass
class _Section:
    mid: str | None = None
    ufrag: str | None = None
    pwd: str | None = None


@dataclass
class _Offer:
    """The offer's mids, its BUNDLE group and ICE credentials (media level over session)."""

    session: _Section = field(default_factory=_Section)
    media: list[_Section] = field(default_factory=list)
    bundle: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, sdp: str) -> _Offer:
        offer = cls()
        current = offer.session
        for line in sdp.splitlines():
            if line.startswith("m="):
                current = _Section()
                offer.media.append(current)
            elif line.startswith("a=mid:"):
                current.mid = line[len("a=mid:") :]
            elif line.startswith("a=ice-ufrag:"):
                current.ufrag = line[len("a=ice-ufrag:") :]
            elif line.startswith("a=ice-pwd:"):
                current.pwd = line[len("a=ice-pwd:") :]
            elif line.startswith("a=group:BUNDLE ") and not offer.bundle:
                offer.bundle = line.split()[1:]
        return offer

    def transport_mids(self) -> dict[str, str]:
        """For each mid, the mid whose transport carries it (its bundle tag's, if bundled)."""
        mids = {m.mid: m.mid for m in self.media if m.mid is not None}
        if self.bundle:
            mids.update((mid, self.bundle[0]) for mid in self.bundle if mid in mids)
        return mids

    def credentials(self) -> tuple[str, str]:
        """The ICE username fragment and password of the first transport.

        WHIP offers use BUNDLE (RFC 9725 section 4.4.1): every m= section then shares the
        bundle tag's transport, whose credentials are the ICE session's.
        """
        first = next(iter(self.transport_mids().values()), None)
        media = next((m for m in self.media if m.mid == first), _Section())
        return media.ufrag or self.session.ufrag or "", media.pwd or self.session.pwd or ""


def _prefer_opus(pc: RTCPeerConnection) -> None:
    """Answer with Opus only: the receive path decodes Opus and nothing else."""
    capabilities = RTCRtpSender.getCapabilities("audio")
    opus = [c for c in capabilities.codecs if c.mimeType.lower() == "audio/opus"]
    for transceiver in pc.getTransceivers():
        if transceiver.kind == "audio":
            transceiver.setCodecPreferences(opus)


def _start_receiving(
    receiver: RTCRtpReceiver, parameters: RTCRtpReceiveParameters, path: AudioReceivePath
) -> None:
    """DTLS is up: the Opus packets go from the socket's callback to the receive path.

    The few that aiortc queued before this still reach the path through its receiver
    (``install_receive_path``), as would any other payload type.
    """
    opus = [c.payloadType for c in parameters.codecs if c.mimeType.lower() == "audio/opus"]
    intake = RtpIntake(path, received_report(receiver))
    divert_rtp(receiver, [pt for pt in opus if pt is not None], intake.take)


class RtcConnection:
    """aiortc's peer connection for one attachment of one session."""

    def __init__(
        self,
        ice_servers: Sequence[IceServerConfig],
        on_state: Callable[[RtcConnection, str], None],
        on_channel: Callable[[Any], None],
    ) -> None:
        self._pc = RTCPeerConnection(rtc_configuration(ice_servers))
        self._pc.on("datachannel", on_channel)
        self._pc.on("connectionstatechange", lambda: on_state(self, self._pc.connectionState))
        self._fec: LossAdaptiveFec | None = None
        self._sending: TickStream | None = None

    @property
    def state(self) -> str:
        """``new``, ``connecting``, ``connected``, ``failed`` or ``closed``."""
        return str(self._pc.connectionState)

    async def answer(self, offer_sdp: str, pipeline: Pipeline, send_audio: bool) -> str:
        """Answer ``offer_sdp`` with ``pipeline`` taking its audio (and sending if asked).

        Raises :class:`NoMediaPorts` when no media port is free, :class:`OfferRejected`
        when aiortc cannot answer; the connection is closed either way.
        """
        pc = self._pc
        try:
            await pc.setRemoteDescription(RTCSessionDescription(offer_sdp, "offer"))
            _prefer_opus(pc)
            audio = next(t for t in pc.getTransceivers() if t.kind == "audio")
            receive = AudioReceivePath(
                pipeline.feed,
                on_error=pipeline.input_failed,
                relay_stalls=pipeline.relays_input_stalls,
                on_stall=pipeline.input_stalled,
            )
            install_receive_path(audio.receiver, receive)
            when_receiver_starts(
                audio.receiver, lambda p: _start_receiving(audio.receiver, p, receive)
            )
            pipeline.attach(receive)
            if send_audio:
                sender = pc.addTrack(ParkedAudioTrack())
                when_sender_starts(sender, lambda p: self._start_sending(sender, p, pipeline))
                self._fec = LossAdaptiveFec(sender, pipeline.output.encoder, receive)
            await pc.setLocalDescription(await pc.createAnswer())
        except NoMediaPorts:
            await pc.close()
            raise
        except Exception as exc:
            await pc.close()
            raise OfferRejected(str(exc)) from exc
        if self._fec is not None:
            self._fec.start()
        return str(pc.localDescription.sdp)

    def _start_sending(
        self, sender: RTCRtpSender, parameters: RTCRtpSendParameters, pipeline: Pipeline
    ) -> None:
        """DTLS is up and the sender negotiated: the worker's media tick sends from now."""
        rtp = RtpAudioStream(
            parameters,
            sender_ssrc(sender),
            protected_rtp_send(sender.transport),
            on_sent=sent_report(sender),
        )
        self._sending = MediaTick.of_running_loop().add(pipeline.output, rtp)

    @property
    def answer_sdp(self) -> str:
        return str(self._pc.localDescription.sdp)

    @property
    def offer_sdp(self) -> str:
        """The client's offer as aiortc took it (unreachable candidates left out)."""
        return str(self._pc.remoteDescription.sdp)

    def remote_credentials(self) -> tuple[str, str]:
        """The ICE username fragment and password the client's offer carried."""
        return _Offer.read(self._pc.remoteDescription.sdp).credentials()

    async def add_remote_candidates(
        self, candidates: Sequence[tuple[str, str]], end_of_candidates: bool
    ) -> None:
        """Add trickled ``(mid, candidate)`` pairs, then end-of-candidates if asked.

        aiortc ignores a candidate named by a bundled mid, so each goes to its bundle tag's
        transport, whatever bundled mid the client named. A mid the offer does not have is
        refused (:class:`UnknownMid`) before any candidate is added: the client would
        otherwise wait for candidates that went nowhere. Candidates no server socket can
        reach (IPv6 link-local) are left out here, and aioice drops others it cannot use
        (TCP, names it cannot resolve), which RFC 9725 section 4.3.2 asks for.
        """
        mids = _Offer.read(self._pc.remoteDescription.sdp).transport_mids()
        unknown = sorted({mid for mid, _ in candidates} - mids.keys())
        if unknown:
            raise UnknownMid(unknown[0], sorted(mids))
        for mid, line in candidates:
            if not reachable_candidate(line):
                continue  # IPv6 link-local: see media.rtc.candidates
            candidate = candidate_from_sdp(line)
            candidate.sdpMid = mids[mid]
            await self._pc.addIceCandidate(candidate)
        if end_of_candidates:
            await self._pc.addIceCandidate(None)

    async def close(self) -> None:
        if self._sending is not None:
            MediaTick.of_running_loop().remove(self._sending)
            self._sending = None
        if self._fec is not None:
            await self._fec.stop()
        await self._pc.close()
        forget_sent_packets(self._pc)
