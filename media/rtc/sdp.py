"""An SDP offer as the checks before aiortc need to see it, read with aiortc's own parser.

Reading it with the parser that will later take the offer means the checks judge exactly
what aiortc would make of it. The view holds plain values, so what reads it (the checks in
``signaling.sdp``) never touches aiortc's objects.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiortc import sdp as aiortc_sdp


class UnreadableSdp(ValueError):
    """aiortc's parser failed; the message names the exception it raised."""


@dataclass(frozen=True)
class CodecView:
    mime_type: str
    parameters: dict[str, object]


@dataclass(frozen=True)
class MediaView:
    kind: str
    direction: str | None
    mid: str | None
    codecs: tuple[CodecView, ...]
    has_ice_credentials: bool
    has_fingerprint: bool
    candidate_ports: tuple[int, ...]


@dataclass(frozen=True)
class SdpView:
    media: tuple[MediaView, ...]
    groups: tuple[tuple[str, tuple[str, ...]], ...]  # (semantic, mids) of each a=group


def read_sdp(text: str) -> SdpView:
    try:
        description = aiortc_sdp.SessionDescription.parse(text)
    except Exception as exc:  # the parser raises many types on garbage
        raise UnreadableSdp(type(exc).__name__) from exc
    media = tuple(
        MediaView(
            kind=m.kind,
            direction=m.direction,
            mid=str(m.rtp.muxId) if m.rtp.muxId else None,
            codecs=tuple(CodecView(c.mimeType, dict(c.parameters)) for c in m.rtp.codecs),
            has_ice_credentials=bool(m.ice and m.ice.usernameFragment and m.ice.password),
            has_fingerprint=bool(m.dtls and m.dtls.fingerprints),
            candidate_ports=tuple(c.port for c in m.ice_candidates),
        )
        for m in description.media
    )
    groups = tuple((g.semantic, tuple(str(mid) for mid in g.items)) for g in description.group)
    return SdpView(media, groups)
