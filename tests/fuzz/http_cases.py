"""Fuzzed requests on the session routes and on HTTP itself, each with what must come back:
speak and interrupt bodies, content types, body sizes around the cap, every method on every
route, trickle PATCHes, and raw requests no client library would send.
"""

from __future__ import annotations

import json
import string
from urllib.parse import quote

from hypothesis import strategies as st

from tests.fuzz import expect
from tests.fuzz.cases import (
    ACCEPTED,
    JSON_TYPE,
    SDP_TYPE,
    TRICKLE_TYPE,
    Case,
    json_case,
    utf8,
)
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

path_segments = st.text(min_size=1, max_size=16).map(lambda text: quote(text, safe=""))
# Ids shaped like real ones (URL-safe base64), so they reach the session lookup.
fake_session_ids = st.text(alphabet=string.ascii_letters + string.digits + "-_", min_size=1)
small_bodies = st.one_of(st.none(), st.binary(max_size=40))
chunk_sizes = st.lists(st.integers(1, 3000), min_size=1, max_size=6)


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
        if not broken and expect.foreign_to_the_voice(value["text"]):
            expected = "unsupported_language"  # the session's voice (piper) speaks English
    return json_case("speak", path, text.encode(), allowed, expected, limit)


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
    elif utf8(body) is None:
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
