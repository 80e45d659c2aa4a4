"""Trickle ICE for WHIP (RFC 9725 section 4.3): the PATCH body and its preconditions.

A client that trickles may offer with few or no candidates and send the rest later in
``PATCH`` requests to the session URL. The body is an SDP fragment,
``application/trickle-ice-sdpfrag`` (RFC 8840 sections 4.4 and 9): session-level ICE attributes,
then an ``m=`` section per media stream, named by its ``a=mid``, holding ``a=ice-ufrag``,
``a=ice-pwd``, ``a=candidate`` lines and ``a=end-of-candidates``. With BUNDLE only the
bundle tag's section carries candidates (RFC 9725 section 4.3.2). This module turns the body
into a :class:`TrickleFragment` and checks ``If-Match``; it knows nothing of peer connections.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from signaling.errors import ApiError

TRICKLE_TYPE = "application/trickle-ice-sdpfrag"

_LINE = re.compile(r"([a-z])=(.*)")
_ICE_CHARS = re.compile(r"[A-Za-z0-9+/]+")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`{|}~0-9A-Za-z]+")  # RFC 8866 token
_ENTITY_TAG = re.compile(r'(W/)?"([^"]*)"')
MAX_PRIORITY = 2**32 - 1
MAX_COMPONENT = 256


@dataclass(frozen=True)
class IceCredentials:
    """An ICE session's username fragment and password (RFC 8839 section 5.4)."""

    ufrag: str
    pwd: str


@dataclass(frozen=True)
class IceSession:
    """What a trickle PATCH is checked against: the answer as sent, the client's credentials.

    The answer's entity tag names the ICE session (``If-Match``); a fragment with other
    credentials than the client's asks for an ICE restart.
    """

    answer_sdp: str
    remote: IceCredentials


@dataclass(frozen=True)
class TrickleCandidate:
    """One ``a=candidate`` line: its value, checked against RFC 8839 section 5.1, and its mid."""

    mid: str
    candidate: str


@dataclass(frozen=True)
class TrickleFragment:
    """A parsed ``application/trickle-ice-sdpfrag`` body."""

    ufrag: str | None
    pwd: str | None
    candidates: tuple[TrickleCandidate, ...]
    end_of_candidates: bool

    def restarts_ice(self, current: IceCredentials) -> bool:
        """Whether it carries new credentials, which RFC 9725 section 4.3.3 reads as a restart.

        RFC 8840 would discard such a fragment; RFC 9725 updates that for WHIP. Credentials
        left out mean the current ICE session.
        """
        return (self.ufrag is not None and self.ufrag != current.ufrag) or (
            self.pwd is not None and self.pwd != current.pwd
        )


def _malformed(number: int, message: str) -> ApiError:
    return ApiError(400, "malformed_sdpfrag", f"Line {number} of the SDP fragment: {message}")


def _shown(text: str) -> str:
    """``text`` quoted for an error message, cut short: it comes from the client."""
    return repr(text if len(text) <= 16 else text[:16] + "...")


def _digits(text: str, most: int) -> bool:
    return 0 < len(text) <= most and text.isascii() and text.isdigit()


def _check_candidate(value: str) -> str:
    """``value`` (what follows ``a=candidate:``) when it follows RFC 8839 section 5.1.

    The connection address is not checked: one the session cannot resolve is dropped
    silently, as RFC 9725 section 4.3.2 asks. Raises ValueError saying what is wrong.
    """
    fields = value.split()
    if len(fields) < 8 or fields[6] != "typ":
        raise ValueError("expected 'foundation component transport priority address port typ type'")
    foundation, component, transport, priority, _, port, _, kind, *extensions = fields
    if len(foundation) > 32 or not _ICE_CHARS.fullmatch(foundation):
        raise ValueError(f"foundation {_shown(foundation)} is not 1-32 ice-chars")
    if not _digits(component, 3) or not 1 <= int(component) <= MAX_COMPONENT:
        raise ValueError(f"component {_shown(component)} is not 1-{MAX_COMPONENT}")
    if not _TOKEN.fullmatch(transport) or not _TOKEN.fullmatch(kind):
        raise ValueError("transport and candidate type must be tokens")
    if not _digits(priority, 10) or int(priority) > MAX_PRIORITY:
        raise ValueError(f"priority {_shown(priority)} is not 0-{MAX_PRIORITY}")
    if not _digits(port, 5) or int(port) > 65535:
        raise ValueError(f"port {_shown(port)} is not 0-65535")
    if len(extensions) % 2:
        raise ValueError("extensions come as name-value pairs")
    for name, extension in zip(extensions[::2], extensions[1::2], strict=True):
        if name == "rport" and (not _digits(extension, 5) or int(extension) > 65535):
            raise ValueError(f"rport {_shown(extension)} is not 0-65535")
    return " ".join(fields)


def _credential(number: int, name: str, value: str, shortest: int, seen: str | None) -> str:
    if not shortest <= len(value) <= 256 or not _ICE_CHARS.fullmatch(value):
        raise _malformed(number, f"{name} must be {shortest}-256 ice-chars")
    if seen is not None and seen != value:
        raise _malformed(number, f"a second, different {name}")
    return value


@dataclass
class _Section:
    """An ``m=`` section while it is read: its mid and its candidate lines by line number."""

    mid: str | None = None
    candidates: list[tuple[int, str]] = field(default_factory=list)


def parse_sdpfrag(text: str) -> TrickleFragment:
    """The fragment in ``text``; :class:`ApiError` 400 naming the line when it is malformed.

    Attributes trickle ICE does not use (``a=ice-options``, ``a=group``, ...) and other
    SDP lines are skipped, as SDP receivers skip what they do not know.
    """
    ufrag: str | None = None
    pwd: str | None = None
    end = False
    sections: list[_Section] = []
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if not lines:
        raise ApiError(400, "malformed_sdpfrag", "The SDP fragment is empty.")
    for number, line in lines:
        match = _LINE.fullmatch(line)
        if match is None:
            raise _malformed(number, f"{line[:40]!r} is not an SDP line (x=value)")
        kind, value = match.groups()
        if kind == "m":
            sections.append(_Section())
            continue
        if kind != "a":
            continue
        name, _, attribute = value.partition(":")
        if name == "ice-ufrag":
            ufrag = _credential(number, "ice-ufrag", attribute, 4, ufrag)
        elif name == "ice-pwd":
            pwd = _credential(number, "ice-pwd", attribute, 22, pwd)
        elif name == "end-of-candidates":
            end = True
        elif name == "mid":
            if not sections or sections[-1].mid is not None:
                raise _malformed(number, "a=mid belongs once in each m= section")
            if not _TOKEN.fullmatch(attribute):
                raise _malformed(number, f"mid {_shown(attribute)} is not a token")
            sections[-1].mid = attribute
        elif name == "candidate":
            if not sections:
                raise _malformed(number, "a=candidate before any m= line")
            try:
                sections[-1].candidates.append((number, _check_candidate(attribute)))
            except ValueError as exc:
                raise ApiError(
                    400, "invalid_candidate", f"Line {number} of the SDP fragment: {exc}."
                ) from None
    candidates: list[TrickleCandidate] = []
    for section in sections:
        for number, candidate in section.candidates:
            if section.mid is None:
                raise _malformed(number, "a=candidate in an m= section without a=mid")
            candidates.append(TrickleCandidate(section.mid, candidate))
    return TrickleFragment(ufrag, pwd, tuple(candidates), end)


def check_if_match(header: str | None, etag: str) -> None:
    """Require ``If-Match`` to name the session's current ICE session.

    RFC 9725 section 4.3.1: a missing entity tag gets 428 (RFC 6585 section 3), one that
    does not match gets 412 (RFC 9110 section 13.1.1). ``*`` matches any ICE session; a
    list matches when one of its tags does, compared strongly (a weak ``W/`` tag never
    does).
    """
    if header is None:
        raise ApiError(
            428,
            "precondition_required",
            "Send If-Match with the ETag the session was created with.",
        )
    if header.strip() == "*":
        return
    tags = [f'"{opaque}"' for weak, opaque in _ENTITY_TAG.findall(header) if not weak]
    if etag not in tags:
        raise ApiError(
            412,
            "precondition_failed",
            "If-Match does not name this session's ICE session; its ETag has changed.",
        )
