"""Fuzzed HTTP requests that carry what the server must answer to them.

A :class:`Case` is one request plus its expectation: a specific code when the input's class
fixes it (a body over the cap is ``payload_too_large`` whatever else is wrong with it),
``ACCEPTED`` when the input is valid, or ``None`` when several outcomes are right and only
the route's code set applies. Most cases change one thing in a valid request, so the
expected code is known exactly; free-form cases cover what no single change reaches.
"""

from __future__ import annotations

import dataclasses
import json
import math
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from aiortc import sdp as aiortc_sdp
from hypothesis import strategies as st

from media.engines.base import OptionSpec
from signaling.routes import APPLICATIONS, MAX_BITRATE, MIN_BITRATE
from tests.fuzz import expect
from tests.fuzz.strategies import (
    below,
    broken_json,
    choice,
    content_types,
    control_payloads,
    header_tokens,
    header_values,
    json_texts,
    json_values,
    media_type,
    message_ids,
    message_texts,
    message_types,
    object_text,
    short_texts,
)

OFFER_FIELDS = ("sdp", "type", "engine", "options", "codec", "resume")
# Shared strategies (one object each: see strategies.below for why).
path_segments = st.text(min_size=1, max_size=16).map(lambda text: quote(text, safe=""))
# Ids shaped like real ones (URL-safe base64), so they reach the session lookup.
fake_session_ids = st.text(alphabet=string.ascii_letters + string.digits + "-_", min_size=1)
small_bodies = st.one_of(st.none(), st.binary(max_size=40))
chunk_sizes = st.lists(st.integers(1, 3000), min_size=1, max_size=6)
extra_keys = st.text(max_size=8).filter(lambda key: key not in OFFER_FIELDS)

ACCEPTED = "accepted"
JSON_TYPE = "application/json"
SDP_TYPE = "application/sdp"
TRICKLE_TYPE = "application/trickle-ice-sdpfrag"
NOT_UTF8 = (b"\xff", b"\xc3(", b"\xed\xa0\x80")


@dataclass(frozen=True)
class Case:
    """One request and what must come back."""

    family: str
    method: str
    path: str
    body: bytes | None
    allowed: frozenset[str]
    expected: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    params: Mapping[str, str] | None = None
    chunk_sizes: tuple[int, ...] = ()  # sent chunked, in pieces of these sizes, when set


def sdp_expectation(text: str | None) -> str | None:
    """``malformed_sdp`` for an offer the checks must refuse as such, else None.

    ``None`` for ``text`` means the body was not UTF-8.
    """
    if text is None:
        return "invalid_encoding"
    if not text.strip() or not text.lstrip().startswith("v=0"):
        return "malformed_sdp"
    try:
        aiortc_sdp.SessionDescription.parse(text)
    except Exception:  # the parser's own failures, whatever their type
        return "malformed_sdp"
    return None


def _utf8(body: bytes) -> str | None:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _capped(case: Case, limit: int) -> Case:
    """The case, expecting ``payload_too_large`` when its body is over the cap."""
    if case.body is not None and len(case.body) > limit:
        allowed = case.allowed | {"payload_too_large"}
        return dataclasses.replace(case, expected="payload_too_large", allowed=allowed)
    return case


# ---------------------------------------------------------------------------------------------
# Mutated SDP on both offer routes


@st.composite
def sdp_cases(draw: st.DrawFn, sdps: st.SearchStrategy[str], limit: int) -> Case:
    """A mutated offer, as JSON on ``/offer`` or as ``application/sdp`` on a WHIP path.

    ``sdps`` is built once by the caller (``mutated_sdp(bases)``): a strategy made inside a
    composite is made again for every draw, which costs hypothesis more than drawing."""
    sdp = draw(sdps)
    route = choice(draw, ["offer", "whip", "whip/echo", "whip/piper"])
    if route == "offer":
        body = json.dumps({"sdp": sdp, "type": "offer"}).encode()
        expected = sdp_expectation(sdp)
        headers = {"Content-Type": JSON_TYPE}
        return _capped(
            Case("sdp", "POST", route, body, expect.OFFER_CODES, expected, headers), limit
        )
    body = sdp.encode("utf-8", "surrogatepass")
    if below(draw, 10) == 0:
        at = below(draw, len(body) + 1)
        body = body[:at] + choice(draw, NOT_UTF8) + body[at:]
    expected = sdp_expectation(_utf8(body))
    headers = {"Content-Type": SDP_TYPE}
    return _capped(Case("sdp", "POST", route, body, expect.WHIP_CODES, expected, headers), limit)


def _decimal(text: str) -> int | None:
    """An ASCII digit string's value; None for anything else, or past int's digit limit."""
    if not (text.isascii() and text.isdigit()):
        return None
    try:
        return int(text)
    except ValueError:
        return None


_query_keys = st.lists(st.sampled_from(["application", "bitrate", "Bitrate", "x"]), unique=True)
_query_values = st.one_of(
    st.sampled_from([*APPLICATIONS, "VOIP", "", "48000", "6000", "510000", "5999", "510001"]),
    st.sampled_from(["\u00b2", "\u0664\u0668\u0660\u0660\u0660", "-1", "1e5"]),
    st.integers(-(10**9), 10**9).map(str),
    st.text(max_size=10),
)
# Past int()'s digit limit; one such value keeps the request line within aiohttp's 8190 bytes.
_huge_number = "4" * 4400


@st.composite
def whip_query_cases(draw: st.DrawFn, offer: str) -> Case:
    """A valid WHIP offer with Opus settings in the query (``?application=&bitrate=``)."""
    params = {key: draw(_query_values) for key in draw(_query_keys)}
    if "bitrate" in params and below(draw, 8) == 0:
        params["bitrate"] = _huge_number
    valid = set(params) <= {"application", "bitrate"}
    if "application" in params:
        valid &= params["application"] in APPLICATIONS
    if "bitrate" in params:
        bitrate = _decimal(params["bitrate"])
        valid &= bitrate is not None and MIN_BITRATE <= bitrate <= MAX_BITRATE
    headers = {"Content-Type": SDP_TYPE}
    expected = ACCEPTED if valid else "invalid_codec"
    return Case(
        "whip query", "POST", "whip", offer.encode(), expect.WHIP_CODES, expected, headers, params
    )


# ---------------------------------------------------------------------------------------------
# JSON shapes on POST /offer


def option_is_valid(spec: OptionSpec, value: Any) -> bool:
    """Whether ``value`` meets ``spec`` as ``GET /engines`` publishes it (JSON schema)."""
    if spec.type == "boolean":
        return isinstance(value, bool)
    if spec.type in ("number", "integer"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if spec.type == "integer" and value != int(value):
            return False
        above = spec.minimum is None or value >= spec.minimum
        return above and (spec.maximum is None or value <= spec.maximum)
    return isinstance(value, str) and (spec.choices is None or value in spec.choices)


def codec_is_valid(codec: Any) -> bool:
    if codec is None:
        return True
    if not isinstance(codec, dict) or not set(codec) <= {"application", "bitrate"}:
        return False
    if codec.get("application", "voip") not in APPLICATIONS:
        return False
    bitrate = codec.get("bitrate")
    if isinstance(bitrate, str):
        bitrate = _decimal(bitrate)
        if bitrate is None:
            return False
    if bitrate is None:
        return True
    return (
        isinstance(bitrate, int)
        and not isinstance(bitrate, bool)
        and (MIN_BITRATE <= bitrate <= MAX_BITRATE)
    )


OFFER_FAULTS = (
    "sdp",
    "type",
    "engine",
    "options",
    "piper options",
    "denoise options",
    "codec",
    "resume",
    "extra",
    "missing",
    "whole body",
    "broken",
    "not utf-8",
)


@st.composite
def offer_json_cases(
    draw: st.DrawFn,
    sdp: str,
    recvonly_sdp: str,
    specs: Mapping[str, tuple[OptionSpec, ...]],
    limit: int,
) -> Case:
    """A valid offer body with one field changed, or a body broken as a whole.

    Field values are JSON texts, so a field can hold what Python cannot (a 5000-digit
    number, nesting past the recursion limit): the whole body is then invalid JSON.
    """
    fields: dict[str, str] = {"sdp": json.dumps(sdp), "type": '"offer"'}
    expected: str | None
    fault = choice(draw, OFFER_FAULTS)
    value_text = draw(json_texts)
    _, value = expect.json_value(value_text)
    if fault == "sdp":
        fields["sdp"] = value_text
        expected = "invalid_request" if not isinstance(value, str) else sdp_expectation(value)
    elif fault == "type":
        fields["type"] = value_text
        expected = ACCEPTED if value == "offer" else "invalid_request"
    elif fault == "engine":
        if below(draw, 2):
            value_text = json.dumps(choice(draw, ["echo", "piper", "ECHO", " echo", "x"]))
            _, value = expect.json_value(value_text)
        fields["engine"] = value_text
        if value is None or value in ("echo", "piper"):
            expected = ACCEPTED
        else:
            expected = "unknown_engine" if isinstance(value, str) else "invalid_request"
    elif fault == "options":
        fields["engine"] = '"echo"'  # takes no options
        fields["options"] = value_text
        expected = ACCEPTED if value is None or value == {} else "invalid_options"
    elif fault in ("piper options", "denoise options"):
        engine = fault.split()[0]
        spec = choice(draw, specs[engine])
        fields["engine"] = json.dumps(engine)
        fields["options"] = object_text({spec.name: value_text})
        good = option_is_valid(spec, value)
        if engine == "denoise":  # a recvonly offer: refused once the options pass
            fields["sdp"] = json.dumps(recvonly_sdp)
            expected = "no_audio_input" if good else "invalid_options"
        else:
            expected = ACCEPTED if good else "invalid_options"
    elif fault == "codec":
        where = choice(draw, ["codec", "application", "bitrate", "x"])
        codec = value if where == "codec" else {where: value}
        fields["codec"] = value_text if where == "codec" else object_text({where: value_text})
        expected = ACCEPTED if codec_is_valid(codec) else "invalid_codec"
    elif fault == "resume":
        fields["resume"] = value_text
        claim = isinstance(value, dict) and all(
            isinstance(value.get(key), str) for key in ("session_id", "token")
        )
        # A well-formed claim goes on to the session host's own checks: any route code.
        expected = None if claim else (ACCEPTED if value is None else "invalid_resume")
    elif fault == "extra":
        fields[draw(extra_keys)] = value_text
        expected = ACCEPTED
    elif fault == "missing":
        del fields[choice(draw, ["sdp", "type"])]
        expected = "invalid_request"
    text = object_text(fields)
    if fault == "whole body":
        text, expected = value_text, "invalid_request"
    elif fault == "broken":
        text, expected = broken_json(draw, text), None
    body = text.encode()
    if fault == "not utf-8":
        at = below(draw, len(body) + 1)
        body, expected = body[:at] + choice(draw, NOT_UTF8) + body[at:], "invalid_encoding"
    elif not expect.json_value(text)[0]:
        expected = "invalid_json"
    return _json_case("offer json", "offer", body, expect.OFFER_CODES, expected, limit)


def _json_case(
    family: str, path: str, body: bytes, allowed: frozenset[str], expected: str | None, limit: int
) -> Case:
    case = Case(family, "POST", path, body, allowed, expected, {"Content-Type": JSON_TYPE})
    return _capped(case, limit)


def free_offer_json_cases(sdp: str, limit: int) -> st.SearchStrategy[Case]:
    """Objects of any shape with the offer's field names: only the route's codes apply."""
    keys = st.sampled_from([*OFFER_FIELDS, "x"])
    values = st.one_of(json_values, st.just(sdp), st.just("offer"))
    return st.dictionaries(keys, values, max_size=6).map(
        lambda payload: _json_case(
            "offer json", "offer", json.dumps(payload).encode(), expect.OFFER_CODES, None, limit
        )
    )


# ---------------------------------------------------------------------------------------------
# POST /sessions/{id}/speak and /interrupt


# A speak body's fields as JSON texts.
_speak_fields = st.fixed_dictionaries(
    {},
    optional={
        "text": message_texts.map(json.dumps),
        "id": message_ids.map(json.dumps),
        "type": message_types.map(json.dumps),
        "extra": json_values.map(json.dumps),
    },
)


@st.composite
def speak_cases(draw: st.DrawFn, session_id: str, limit: int) -> Case:
    """Speak bodies built from control-message fields (``type`` is the route's), and
    interrupts with any body; one in ten to a session id that does not exist."""
    live = below(draw, 10) > 0
    target = session_id if live else draw(fake_session_ids)
    if below(draw, 5) == 0:
        body = draw(small_bodies)
        headers = choice(draw, [{}, {"Content-Type": JSON_TYPE}, {"Content-Type": "x/y"}])
        path = f"sessions/{target}/interrupt"
        if not live:
            expected = "session_not_found"
            return Case("speak", "POST", path, body, expect.INTERRUPT_CODES, expected, headers)
        return Case("speak", "POST", path, body, expect.INTERRUPT_CODES, ACCEPTED, headers)
    how = below(draw, 4)
    if how <= 1:
        fields = draw(_speak_fields)
        if how == 1 and fields:
            fields[choice(draw, sorted(fields))] = draw(json_texts)
        text = object_text(fields)
    elif how == 2:
        text = draw(json_texts)
    else:
        text = broken_json(draw, json.dumps(draw(control_payloads)))
    path = f"sessions/{target}/speak"
    headers = {"Content-Type": JSON_TYPE}
    if not live:  # looked up before the body is read, whatever its size
        expected = "session_not_found"
        return Case("speak", "POST", path, text.encode(), expect.SPEAK_CODES, expected, headers)
    parsed, value = expect.json_value(text)
    allowed = expect.SPEAK_CODES
    if not parsed:
        expected = "invalid_json"
    elif not isinstance(value, dict):
        expected = "invalid_message"
    else:
        broken = expect.command_violations({**value, "type": "speak"})
        # Several broken rules: any of them may be named.
        expected, allowed = (ACCEPTED, allowed) if not broken else (None, frozenset(broken))
    return _json_case("speak", path, text.encode(), allowed, expected, limit)


# ---------------------------------------------------------------------------------------------
# Content types, body sizes, methods


@st.composite
def content_type_cases(draw: st.DrawFn, session_id: str) -> Case:
    """Bodies a route refuses with a known code once the type is right; the type varies."""
    route, wanted, body, code, allowed = choice(
        draw,
        [
            (
                "offer",
                JSON_TYPE,
                b'{"sdp": "", "type": "offer"}',
                "malformed_sdp",
                expect.OFFER_CODES,
            ),
            ("whip", SDP_TYPE, b"not an offer", "malformed_sdp", expect.WHIP_CODES),
            ("whip/echo", SDP_TYPE, b"", "malformed_sdp", expect.WHIP_CODES),
            (
                f"sessions/{session_id}/speak",
                JSON_TYPE,
                b'{"text": " "}',
                "missing_text",
                expect.SPEAK_CODES,
            ),
        ],
    )
    how = below(draw, 5)
    if how == 0:
        headers: dict[str, str] = {}
        expected: str | None = "unsupported_media_type"
    elif how == 1:  # free-form: whatever a server makes of it, one of the two answers
        headers = {"Content-Type": draw(header_values)}
        expected = None
        allowed = frozenset({"unsupported_media_type", code})
    else:
        content_type = draw(content_types)
        headers = {"Content-Type": content_type}
        expected = code if media_type(content_type) == wanted else "unsupported_media_type"
    return Case("content types", "POST", route, body, allowed, expected, headers)


@st.composite
def size_cases(draw: st.DrawFn, session_id: str, limit: int) -> Case:
    """Bodies within a few bytes of the cap, sent whole or chunked."""
    route, content_type, head, tail, code, allowed = choice(
        draw,
        [
            (
                "offer",
                JSON_TYPE,
                b'{"sdp": "", "type": "offer", "pad": "',
                b'"}',
                "malformed_sdp",
                expect.OFFER_CODES,
            ),
            ("whip", SDP_TYPE, b"x", b"", "malformed_sdp", expect.WHIP_CODES),
            (
                f"sessions/{session_id}/speak",
                JSON_TYPE,
                b'{"text": "", "pad": "',
                b'"}',
                "missing_text",
                expect.SPEAK_CODES,
            ),
        ],
    )
    size = limit - 40 + below(draw, 81)
    body = head + b"p" * (size - len(head) - len(tail)) + tail
    chunks: tuple[int, ...] = ()
    if below(draw, 2):
        chunks = tuple(draw(chunk_sizes))
    expected = "payload_too_large" if len(body) > limit else code
    headers = {"Content-Type": content_type}
    return Case("body sizes", "POST", route, body, allowed, expected, headers, chunk_sizes=chunks)


ROUTES = (
    "engines",
    "offer",
    "whip",
    "whip/{engine}",
    "whip/sessions/{id}",
    "sessions/{id}",
    "sessions/{id}/speak",
    "sessions/{id}/interrupt",
    "sessions/{id}/events",
    "sessions/{id}/prompt",
    "healthz",
    "",
    "index.html",
    "{random}",
    "{random}/{random}",
)
# Methods aiohttp's HTTP parser knows (it refuses others itself: see raw_requests).
METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "PROPFIND")


@st.composite
def method_cases(draw: st.DrawFn) -> Case:
    """Every method on every route, with ids and path segments no session has."""
    path = choice(draw, ROUTES).format(
        engine=choice(draw, ["echo", "piper", "denoise", "cosyvoice"])
        if below(draw, 2)
        else draw(path_segments),
        id=draw(path_segments),
        random=draw(path_segments),
    )
    body = draw(small_bodies)
    headers = {"Content-Type": draw(content_types)} if below(draw, 2) else {}
    return Case("methods", choice(draw, METHODS), path, body, expect.ANY_ROUTE_CODES, None, headers)


# ---------------------------------------------------------------------------------------------
# Trickle ICE: PATCH on a WHIP session


@st.composite
def patch_cases(
    draw: st.DrawFn, session_id: str, etag: str, fragments: st.SearchStrategy[str], limit: int
) -> Case:
    """Trickle PATCHes: mutated SDP fragments, entity tags and content types.

    The handler checks in RFC 9110's order (type, body, session, If-Match, fragment), so
    each earlier check fixes the code; past them any trickle code (or 204) may be right.
    """
    live = below(draw, 10) > 1
    target = session_id if live else draw(fake_session_ids)
    kind = below(draw, 4)
    content_type = TRICKLE_TYPE if kind < 2 else draw(content_types) if kind == 2 else None
    if_match = choice(draw, [etag, "*", f'"x", {etag}', None, f"W/{etag}", '"0000"', "free"])
    if if_match == "free":
        if_match = draw(header_values)
    text = draw(fragments) if below(draw, 4) else draw(short_texts)
    body = text.encode("utf-8", "surrogatepass")
    headers = {"If-Match": if_match} if if_match is not None else {}
    if content_type is not None:
        headers["Content-Type"] = content_type
    expected: str | None = None
    if content_type is None or media_type(content_type) != TRICKLE_TYPE:
        expected = "unsupported_media_type"
    elif len(body) > limit:
        expected = "payload_too_large"
    elif _utf8(body) is None:
        expected = "invalid_encoding"
    elif not live:
        expected = "session_not_found"
    elif if_match is None:
        expected = "precondition_required"
    elif if_match in (f"W/{etag}", '"0000"'):  # a weak tag never matches (strong comparison)
        expected = "precondition_failed"
    path = f"whip/sessions/{target}"
    return Case("whip patch", "PATCH", path, body, expect.PATCH_CODES, expected, headers)


# ---------------------------------------------------------------------------------------------
# Raw HTTP: what no client library would send

RAW_HEADER_NAMES = (
    "Host",
    "Content-Length",
    "Transfer-Encoding",
    "Content-Type",
    "Connection",
    "Expect",
    "If-Match",
)
RAW_HEADER_VALUES = (
    "0",
    "-1",
    "abc",
    "99999999999999999999",
    "10, 10",
    "chunked",
    "gzip, chunked",
    "identity",
    "100-continue",
    "close",
    "application/json",
    "application/sdp; charset=bogus",
)


_raw_targets = st.one_of(
    st.sampled_from(["/", "/offer", "/whip", "/healthz", "/sessions/x/speak", "*"]),
    st.sampled_from(["http://x/offer", "/%zz", "/a?b=%ff", "//", "/" + "a" * 9000]),
    st.text(max_size=20),
)
_raw_headers = st.lists(
    st.tuples(
        st.one_of(st.sampled_from(RAW_HEADER_NAMES), header_tokens, st.just("")),
        st.one_of(st.sampled_from(RAW_HEADER_VALUES), st.text(max_size=30)),
    ),
    max_size=6,
)
_raw_bodies = st.binary(max_size=64)


@st.composite
def raw_requests(draw: st.DrawFn) -> bytes:
    """An HTTP/1.x request with any method, target, version, headers and body."""
    method = choice(draw, ["GET", "POST", "PATCH", "DELETE", "get", "G E T", "\x00"])
    target = draw(_raw_targets)
    version = choice(draw, ["HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/1.1x", "", "HTTP/9"])
    headers = draw(_raw_headers)
    ending = choice(draw, ["\r\n", "\n"])
    head = f"{method} {target} {version}{ending}"
    head += "".join(f"{name}: {value}{ending}" for name, value in headers) + ending
    request = head.encode("utf-8", "surrogatepass") + draw(_raw_bodies)
    if below(draw, 5) == 0:
        request = request[: below(draw, len(request) + 1)]
    return request
