"""Fuzzed offers that carry what the server must answer to them: mutated SDP on both offer
routes, Opus settings in a WHIP query, JSON shapes on ``POST /offer``.

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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiortc import sdp as aiortc_sdp
from hypothesis import strategies as st

from media.engines.base import OptionSpec
from signaling.offers import APPLICATIONS, MAX_BITRATE, MIN_BITRATE
from tests.fuzz import expect
from tests.fuzz.strategies import (
    below,
    broken_json,
    choice,
    json_texts,
    json_values,
    object_text,
)

OFFER_FIELDS = ("sdp", "type", "engine", "options", "codec", "resume")
# Shared strategies are made once (see strategies.below for why).
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


def utf8(body: bytes) -> str | None:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return None


def capped(case: Case, limit: int) -> Case:
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
        return capped(
            Case("sdp", "POST", route, body, expect.OFFER_CODES, expected, headers), limit
        )
    body = sdp.encode("utf-8", "surrogatepass")
    if below(draw, 10) == 0:
        at = below(draw, len(body) + 1)
        body = body[:at] + choice(draw, NOT_UTF8) + body[at:]
    expected = sdp_expectation(utf8(body))
    headers = {"Content-Type": SDP_TYPE}
    return capped(Case("sdp", "POST", route, body, expect.WHIP_CODES, expected, headers), limit)


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
        if value in (None, "", "echo", "piper"):  # no name, or an empty one: the default
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
    return json_case("offer json", "offer", body, expect.OFFER_CODES, expected, limit)


def json_case(
    family: str, path: str, body: bytes, allowed: frozenset[str], expected: str | None, limit: int
) -> Case:
    case = Case(family, "POST", path, body, allowed, expected, {"Content-Type": JSON_TYPE})
    return capped(case, limit)


def free_offer_json_cases(sdp: str, limit: int) -> st.SearchStrategy[Case]:
    """Objects of any shape with the offer's field names: only the route's codes apply."""
    keys = st.sampled_from([*OFFER_FIELDS, "x"])
    values = st.one_of(json_values, st.just(sdp), st.just("offer"))
    return st.dictionaries(keys, values, max_size=6).map(
        lambda payload: json_case(
            "offer json", "offer", json.dumps(payload).encode(), expect.OFFER_CODES, None, limit
        )
    )
