"""What a correct answer to a fuzzed input looks like: error shape, codes per route, the
control protocol's rules.

Every refusal must be a JSON ``{"error": code, "message": sentence}`` whose code is one a
client of that route can branch on. The sets below list, per route, the codes its handler
and the layers under it raise (server/http/signaling_routes.py, signaling/sdp.py,
server/sessions/manager.py, server/http/session_routes.py, server/sessions/control.py); the
generic codes the error middleware gives
aiohttp's own errors are allowed only where aiohttp itself answers (unknown path, wrong
method, body over the cap). A catch-all that turns any exception into one code would fail
here as soon as an input class with a known code gets the wrong one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from media.audio.languages import foreign_scripts
from server.sessions.control import MAX_ID_CHARS, MAX_MESSAGE_BYTES, MAX_TEXT_CHARS, MESSAGE_TYPES

JSON_TYPE = "application/json"

# Codes the middleware maps aiohttp's own HTTP errors to (signaling/errors.py).
ROUTING_CODES = frozenset({"not_found", "method_not_allowed"})
BODY_CODES = frozenset({"unsupported_media_type", "payload_too_large"})
SDP_CODES = frozenset({"invalid_encoding", "malformed_sdp", "no_audio", "unsupported_codec"})
# Raised while a session is opened for a checked offer (server/sessions/manager.py).
OPEN_CODES = frozenset(
    {"unknown_engine", "unsupported_engine", "invalid_options", "no_audio_input", "sdp_rejected"}
)
# An offer that claims to resume a session (server/sessions/manager.py).
RESUME_CODES = frozenset(
    {"invalid_resume", "session_not_found", "invalid_resume_token", "resume_engine_mismatch"}
)
OFFER_CODES = (
    BODY_CODES
    | SDP_CODES
    | OPEN_CODES
    | RESUME_CODES
    | {"invalid_json", "invalid_request", "invalid_codec"}
)
WHIP_CODES = BODY_CODES | SDP_CODES | OPEN_CODES | {"invalid_codec"}
# The control protocol's refusals (server/sessions/control.py, server/sessions/session.py).
CONTROL_CODES = frozenset(
    {
        "invalid_json",
        "invalid_encoding",
        "message_too_large",
        "invalid_message",
        "unknown_type",
        "missing_text",
        "text_too_long",
        "invalid_id",
        "not_a_speak_session",
        "unsupported_language",
    }
)
SESSION_CODES = frozenset({"session_not_found"})
# Over HTTP the route sets the type and aiohttp caps the body, so fewer control codes apply.
SPEAK_CODES = (
    SESSION_CODES
    | BODY_CODES
    | {
        "invalid_json",
        "invalid_message",
        "missing_text",
        "text_too_long",
        "invalid_id",
        "not_a_speak_session",
        "unsupported_language",
    }
)
INTERRUPT_CODES = SESSION_CODES | {"not_a_speak_session"}
# Trickle ICE on a WHIP session (signaling/trickle.py, server/remote_candidates.py).
PATCH_CODES = (
    SESSION_CODES
    | BODY_CODES
    | {
        "invalid_encoding",
        "session_detached",
        "precondition_required",
        "precondition_failed",
        "malformed_sdpfrag",
        "invalid_candidate",
        "unknown_mid",
        "ice_restart_unsupported",
    }
)
PROMPT_CODES = SESSION_CODES | BODY_CODES | {"no_voice_prompt", "invalid_audio", "invalid_prompt"}
ANY_ROUTE_CODES = (
    ROUTING_CODES
    | OFFER_CODES
    | WHIP_CODES
    | SPEAK_CODES
    | INTERRUPT_CODES
    | PROMPT_CODES
    | PATCH_CODES
)
# The fallbacks of signaling/errors.py: an answer with one of these names no cause.
GENERIC_CODES = frozenset({"bad_request", "http_error"})

_STATUS_OF_CODE: Mapping[str, frozenset[int]] = {
    "not_found": frozenset({404}),
    "session_not_found": frozenset({404}),
    "unknown_engine": frozenset({400, 404}),  # 404 when the engine is a WHIP path segment
    "method_not_allowed": frozenset({405}),
    "payload_too_large": frozenset({413}),
    "unsupported_media_type": frozenset({415}),
    "invalid_resume_token": frozenset({403}),
    "session_detached": frozenset({409}),
    "precondition_failed": frozenset({412}),
    "ice_restart_unsupported": frozenset({422}),
    "precondition_required": frozenset({428}),
}


@dataclass(frozen=True)
class Reply:
    """An HTTP answer as the fuzz client saw it."""

    method: str
    path: str
    status: int
    headers: Mapping[str, str]
    content_type: str
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def describe(self) -> str:
        return f"{self.method} {self.path} -> {self.status} {self.body[:300]!r}"


def error_code(reply: Reply) -> str:
    """The code of a well-formed JSON error answer; fails on any other shape."""
    assert 400 <= reply.status < 500, reply.describe()
    assert reply.content_type == JSON_TYPE, reply.describe()
    body = reply.json()
    assert isinstance(body, dict) and set(body) == {"error", "message"}, reply.describe()
    code, message = body["error"], body["message"]
    assert isinstance(code, str) and code not in GENERIC_CODES, reply.describe()
    assert isinstance(message, str) and message.strip(), reply.describe()
    assert reply.status in _STATUS_OF_CODE.get(code, frozenset({400})), reply.describe()
    if reply.status == 405:
        assert code == "method_not_allowed" and "Allow" in reply.headers, reply.describe()
    return code


def check_refusal(reply: Reply, allowed: frozenset[str], expected: str | None = None) -> None:
    """A refusal with a code from ``allowed`` (exactly ``expected`` when the cause is known)."""
    code = error_code(reply)
    assert code in allowed, f"code {code!r} not expected here: {reply.describe()}"
    if expected is not None:
        assert code == expected, f"expected {expected!r}: {reply.describe()}"


# ---------------------------------------------------------------------------------------------
# The control protocol as README.md states it, written independently of server/sessions/control.py:
# for a message, every rule it breaks. A refusal must name one of them; a message that breaks
# none must be accepted.


def json_value(text: str) -> tuple[bool, Any]:
    """(True, value) when ``text`` is JSON Python can hold, else (False, None)."""
    try:
        return True, json.loads(text)
    except (ValueError, RecursionError):  # also numbers past int's digit limit
        return False, None


def command_violations(payload: Any) -> set[str]:
    """The rules a decoded message breaks."""
    if not isinstance(payload, dict):
        return {"invalid_message"}
    kind = payload.get("type")
    if not isinstance(kind, str):
        return {"invalid_message"}
    if kind not in MESSAGE_TYPES:
        return {"unknown_type"}
    broken = set()
    utterance_id = payload.get("id")
    if utterance_id is not None and (
        not isinstance(utterance_id, str) or not 1 <= len(utterance_id) <= MAX_ID_CHARS
    ):
        broken.add("invalid_id")
    text = payload.get("text")
    if kind in ("speak", "speak_delta"):
        if not isinstance(text, str) or (kind == "speak" and not text.strip()):
            broken.add("missing_text")
        elif len(text) > MAX_TEXT_CHARS:
            broken.add("text_too_long")
    return broken


PIPER_LANGUAGES = ("en",)


def foreign_to_the_voice(text: str, languages: tuple[str, ...] = PIPER_LANGUAGES) -> bool:
    """Whether a well-formed speak text is refused as ``unsupported_language``."""
    return bool(foreign_scripts(text, languages))


def message_violations(raw: str | bytes) -> set[str]:
    """The rules a raw data-channel message breaks, from its bytes up to its fields."""
    size = len(raw) if isinstance(raw, bytes) else len(raw.encode("utf-8", "surrogatepass"))
    broken = {"message_too_large"} if size > MAX_MESSAGE_BYTES else set()
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            return broken | {"invalid_encoding"}
    parsed, payload = json_value(raw)
    if not parsed:
        return broken | {"invalid_json"}
    return broken | command_violations(payload)
