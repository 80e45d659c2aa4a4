"""The offer/answer wire formats: the JSON offer body, WHIP's, and what an offer asks for.

``parse_offer_json`` and the request dataclasses turn a body into a validated
:class:`OfferRequest` (its SDP checked by :mod:`signaling.sdp`); they know nothing of HTTP
servers, sessions or audio.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from signaling.errors import ApiError
from signaling.sdp import OfferSummary

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
    client: str = ""  # who asked: the key per-client limits count by (its address)


@dataclass(frozen=True)
class OfferAnswer:
    sdp: str
    session_id: str
    resume_token: str = ""  # what a later offer presents to resume this session


def parse_offer_json(
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


def whip_etag(answer_sdp: str) -> str:
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
