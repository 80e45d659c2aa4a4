"""Checks on an SDP offer before it reaches aiortc, each failing with its own error code.

aiortc's own failures on bad SDP range from a ValueError to an AttributeError deep inside
the parser; checking the few things a usable audio offer needs first lets the client learn
exactly what was wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

from media.rtc.sdp import SdpView, UnreadableSdp, read_sdp
from signaling.errors import ApiError

# RFC 7587 section 6.1. A value outside (negative, zero, a typo) is ignored like an unreadable
# one: passed on, a negative cap made libopus refuse the encoder and the offer got a 500.
MAX_AVERAGE_BITRATES = range(6_000, 510_001)
MAX_PORT = 65535
# Directions from the offerer's point of view.
SENDS_AUDIO = ("sendrecv", "sendonly")
RECEIVES_AUDIO = ("sendrecv", "recvonly")


@dataclass(frozen=True)
class OpusParameters:
    """The offerer's Opus receive preferences (RFC 7587 fmtp), which our encoder honours."""

    max_average_bitrate: int | None = None
    stereo: bool = False
    inband_fec: bool = False


@dataclass(frozen=True)
class OfferSummary:
    """What the server needs to know about an offer before answering it."""

    audio_direction: str
    has_data_channel: bool
    opus: OpusParameters = OpusParameters()

    @property
    def sends_audio(self) -> bool:
        return self.audio_direction in SENDS_AUDIO

    @property
    def receives_audio(self) -> bool:
        return self.audio_direction in RECEIVES_AUDIO


def malformed(message: str) -> ApiError:
    return ApiError(400, "malformed_sdp", message)


def inspect_offer(text: str) -> OfferSummary:
    """Parse and check an offer; raise :class:`ApiError` naming the first problem."""
    if not text.strip():
        raise malformed("The SDP offer is empty.")
    if not text.lstrip().startswith("v=0"):
        raise malformed("An SDP offer must start with the line 'v=0'.")
    try:
        description = read_sdp(text)
    except UnreadableSdp as exc:
        raise malformed(f"The SDP offer could not be parsed ({exc}).") from exc
    audio = [m for m in description.media if m.kind == "audio"]
    if not audio:
        raise ApiError(400, "no_audio", "The offer has no audio m-line; add an audio track.")
    first = audio[0]
    opus = next((c for c in first.codecs if c.mime_type.lower() == "audio/opus"), None)
    if opus is None:
        raise ApiError(400, "unsupported_codec", "The offer's audio must include Opus.")
    for media in description.media:
        if not media.has_ice_credentials:
            raise malformed("Every m-line needs ICE credentials (a=ice-ufrag and a=ice-pwd).")
        if not media.has_fingerprint:
            raise malformed("Every m-line needs a DTLS fingerprint (a=fingerprint).")
        for port in media.candidate_ports:
            # aioice sends its checks to the port as given: past 65535 sendto() raises, which
            # asyncio treats as fatal, closing the session's only ICE socket.
            if not 0 <= port <= MAX_PORT:
                raise malformed(f"An a=candidate port must be 0-{MAX_PORT}, not {port}.")
    _check_groups(description)
    return OfferSummary(
        audio_direction=first.direction or "sendrecv",
        has_data_channel=any(m.kind == "application" for m in description.media),
        opus=_opus_parameters(opus.parameters),
    )


def _check_groups(description: SdpView) -> None:
    """Every mid an ``a=group`` line names must be an m-line's ``a=mid`` (RFC 5888 section 5).

    aiortc answers a BUNDLE group whose tag names no m-line by failing half-way through
    building the answer, and then cannot close the half-built connection either.
    """
    mids = {media.mid for media in description.media if media.mid}
    for semantic, items in description.groups:
        missing = next((mid for mid in items if mid not in mids), None)
        if missing is not None:
            raise malformed(f"a=group:{semantic} names mid '{missing}', which no m-line has.")


def _opus_parameters(fmtp: dict[str, object]) -> OpusParameters:
    def flag(name: str) -> bool:
        return str(fmtp.get(name, "0")) == "1"

    bitrate = fmtp.get("maxaveragebitrate")
    try:
        max_bitrate = int(str(bitrate)) if bitrate is not None else None
    except ValueError:
        max_bitrate = None
    # Only an int is looked up: ``None in range(...)`` compares None with every member, a
    # 12 ms walk on the event loop for each offer without the parameter (most of them).
    if max_bitrate is not None and max_bitrate not in MAX_AVERAGE_BITRATES:
        max_bitrate = None
    return OpusParameters(max_bitrate, stereo=flag("stereo"), inband_fec=flag("useinbandfec"))
