"""Hypothesis strategies for the fuzz suite: mutated SDP, JSON of every shape and size,
header values and data-channel messages.

Inputs start from real things (offers an aiortc peer made, well-formed control messages)
and break them a few edits at a time, because a parser's interesting paths are one edit
away from the valid input, not in uniformly random bytes. Raw JSON *text* is generated
too, for what no Python value serialises to: NaN and Infinity literals, numbers past
Python's integer digit limit, nesting deeper than the recursion limit.
"""

from __future__ import annotations

import json
import re
import string
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from hypothesis import strategies as st

from server.sessions.control import MAX_ID_CHARS, MAX_MESSAGE_BYTES, MAX_TEXT_CHARS, MESSAGE_TYPES

# Python refuses to parse integers longer than this many digits.
INT_DIGIT_LIMIT = sys.get_int_max_str_digits()
T = TypeVar("T")
_INDEX = st.integers(0, 2**16 - 1)


def below(draw: st.DrawFn, n: int) -> int:
    """A number in ``range(n)`` that shrinks towards 0.

    Drawn from one shared strategy: building a new strategy for each draw (``st.integers(0,
    n)`` inside a composite) costs hypothesis several times more than the draw itself.
    """
    return draw(_INDEX) % n


def choice(draw: st.DrawFn, options: Sequence[T]) -> T:
    return options[below(draw, len(options))]


# ---------------------------------------------------------------------------------------------
# JSON

short_texts = st.text(max_size=60)
json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=10),
)
# Small on purpose: generating JSON dominates a family's time, and parsers fail on kinds of
# values and on nesting, which small documents reach as well as large ones.
json_values = st.recursive(
    json_leaves,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
# Number literals Python's json module reads into awkward values, or refuses.
SPECIAL_NUMBERS = (
    "NaN",
    "Infinity",
    "-Infinity",
    "1e999",
    "-1e999",
    "1e-400",
    "-0",
    "1.0",
    "100000000000000000000",
    "-9223372036854775809",
    "18446744073709551616",
)
big_integers = st.integers(20, 400).map(lambda digits: "7" * digits)
huge_integers = st.integers(INT_DIGIT_LIMIT + 1, INT_DIGIT_LIMIT + 600).map(lambda n: "9" * n)


@st.composite
def deep_nesting(draw: st.DrawFn) -> str:
    """Arrays or objects nested past the parser's recursion limit (closed or not), or well
    short of it.

    Never near it: the limit counts the frames already on the parsing thread's stack, so
    near it the suite's own check (under pytest and hypothesis) and the server's handler
    would disagree.
    """
    depth = 1 + below(draw, 400) if below(draw, 2) else 1100 + below(draw, 300)
    opener, closer = choice(draw, [("[", "]"), ('{"a":', "}")])
    inner = choice(draw, ["", "0", '"x"'])
    closed = below(draw, 2) == 0
    return opener * depth + inner + (closer * depth if closed else "")


json_texts = st.one_of(
    json_values.map(json.dumps),
    st.sampled_from(SPECIAL_NUMBERS),
    big_integers,
    huge_integers,
    deep_nesting(),
)


def object_text(fields: Mapping[str, str]) -> str:
    """A JSON object whose values are JSON *texts* (so they can be NaN, huge, too deep)."""
    return "{" + ", ".join(f"{json.dumps(key)}: {value}" for key, value in fields.items()) + "}"


def broken_json(draw: st.DrawFn, valid: str) -> str:
    """``valid`` JSON text cut short, with a character changed, or with junk after it."""
    how = choice(draw, ["truncate", "replace", "append"])
    if how == "truncate":
        return valid[: below(draw, max(1, len(valid)))]
    if how == "replace" and valid:
        at = below(draw, len(valid))
        return valid[:at] + choice(draw, "{}[]\",:\\ 'x0") + valid[at + 1 :]
    return valid + choice(draw, ["}", "]", ",", "x", " {}", "\x00"])


# ---------------------------------------------------------------------------------------------
# SDP

# Lines a real offer could carry, and near misses of them.
SDP_LINES = (
    "m=audio 9 UDP/TLS/RTP/SAVPF 111",
    "m=audio 9 UDP/TLS/RTP/SAVPF",
    "m=audio nine UDP/TLS/RTP/SAVPF 96",
    "m=audio 9 RTP/AVP 0",
    "m=video 9 UDP/TLS/RTP/SAVPF 96",
    "m=application 9 UDP/DTLS/SCTP webrtc-datachannel",
    "m=",
    "a=rtpmap:96 opus/48000/2",
    "a=rtpmap:96 OPUS/48000",
    "a=rtpmap:96",
    "a=rtpmap:x opus/48000/2",
    "a=rtpmap:96 opus/abc/2",
    "a=rtpmap:300 opus/48000/2",
    "a=fmtp:96 minptime=10;useinbandfec=1",
    "a=fmtp:96 maxaveragebitrate=-5",
    "a=fmtp:96 maxaveragebitrate=0",
    "a=fmtp:96 maxaveragebitrate=1",
    "a=fmtp:96 maxaveragebitrate=999999999999",
    "a=fmtp:96 maxaveragebitrate=\u00b2",
    "a=fmtp:96 stereo=1;sprop-stereo=1;;=;a",
    "a=fmtp:96",
    "a=fmtp:abc x=y",
    "a=rtcp-fb:96 transport-cc",
    "a=rtcp-fb:* nack",
    "a=rtcp-fb:",
    "a=ssrc:1 cname:x",
    "a=ssrc:abc cname:x",
    "a=ssrc-group:FID 1 2",
    "a=ssrc-group:FID x",
    "a=extmap:1 urn:ietf:params:rtp-hdrext:sdes:mid",
    "a=extmap:x urn:x",
    "a=group:BUNDLE 0 1 2",
    "a=group:BUNDLE",
    "a=mid:0",
    "a=mid:",
    "a=msid:- -",
    "a=setup:holdconn",
    "a=setup:passive",
    "a=sctp-port:abc",
    "a=sctp-port:-1",
    "a=max-message-size:-1",
    "a=rtcp:abc",
    "a=rtcp:9 IN IP6 ::1",
    "c=IN IP6 ::1",
    "c=IN IP4 999.0.0.1",
    "c=IN",
    "a=candidate:1 1 udp 2130706431 127.0.0.1 9 typ host",
    "a=candidate:1 1 udp x 127.0.0.1 9 typ host",
    "a=candidate:1 1 tcp 2130706431 127.0.0.1 9 typ host tcptype active",
    "a=candidate:1 1 udp 2130706431 127.0.0.1 70000 typ host",
    "a=candidate:1 1 udp 2130706431 not-an-address 9 typ host",
    "a=candidate:1 1 udp 2130706431 127.0.0.1 9 typ prflx",
    "a=candidate:",
    "a=end-of-candidates",
    "a=ice-ufrag:",
    "a=ice-pwd:",
    "a=ice-ufrag:\u00e9\u00e9\u00e9\u00e9",
    "a=ice-lite",
    "a=ice-options:trickle",
    "a=fingerprint:sha-256",
    "a=fingerprint:md5 00:11",
    "a=fingerprint:sha-256 ZZ",
    "a=sendonly",
    "a=recvonly",
    "a=inactive",
    "a=x-unknown:value",
    "v=0",
    "v=1",
    "o=- 0 0 IN IP4 127.0.0.1",
    "s=",
    "t=0 0",
    "b=AS:-1",
    "",
)
tokens = st.one_of(
    st.text(max_size=12),
    st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(["", " ", "\u00b2", "\u0663", "0x10", "-1", "65536", "4294967296", "nan"]),
    st.integers(0, 10**40).map(str),
)
# Characters str.splitlines() breaks a line at, besides \r and \n (aiortc splits with it).
ODD_LINE_BREAKS = ("\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")
_FIELD_SPLIT = re.compile(r"([ :/;=])")
Lines = list[str]


def _pick(draw: st.DrawFn, lines: Lines) -> int:
    return below(draw, len(lines))


def _delete(draw: st.DrawFn, lines: Lines) -> Lines:
    del lines[_pick(draw, lines)]
    return lines


def _duplicate(draw: st.DrawFn, lines: Lines) -> Lines:
    lines.insert(_pick(draw, lines), lines[_pick(draw, lines)])
    return lines


def _swap(draw: st.DrawFn, lines: Lines) -> Lines:
    i, j = _pick(draw, lines), _pick(draw, lines)
    lines[i], lines[j] = lines[j], lines[i]
    return lines


def _replace_field(draw: st.DrawFn, lines: Lines, prefixes: tuple[str, ...] = ()) -> Lines:
    candidates = [i for i, line in enumerate(lines) if line.startswith(prefixes)] or [0]
    at = choice(draw, candidates)
    parts = _FIELD_SPLIT.split(lines[at])
    fields = list(range(0, len(parts), 2))
    parts[choice(draw, fields)] = draw(tokens)
    lines[at] = "".join(parts)
    return lines


def _corrupt_codec_line(draw: st.DrawFn, lines: Lines) -> Lines:
    return _replace_field(draw, lines, ("m=", "a=rtpmap:", "a=fmtp:", "a=rtcp-fb:"))


def _insert_known(draw: st.DrawFn, lines: Lines) -> Lines:
    lines.insert(_pick(draw, lines), choice(draw, SDP_LINES))
    return lines


def _insert_random(draw: st.DrawFn, lines: Lines) -> Lines:
    lines.insert(_pick(draw, lines), draw(short_texts))
    return lines


def _huge_line(draw: st.DrawFn, lines: Lines) -> Lines:
    lines.insert(_pick(draw, lines), "a=x-pad:" + "p" * (100 + below(draw, 6900)))
    return lines


def _truncate(draw: st.DrawFn, lines: Lines) -> Lines:
    at = _pick(draw, lines)
    return [*lines[:at], lines[at][: below(draw, len(lines[at]) + 1)]]


def _upper_case(draw: st.DrawFn, lines: Lines) -> Lines:
    at = _pick(draw, lines)
    lines[at] = lines[at].upper()
    return lines


def _odd_characters(draw: st.DrawFn, lines: Lines) -> Lines:
    at = _pick(draw, lines)
    line = lines[at]
    cut = below(draw, len(line) + 1)
    odd = choice(draw, ("\x00", "\t", "\ufeff", "\ud800", *ODD_LINE_BREAKS))
    lines[at] = line[:cut] + odd + line[cut:]
    return lines


SDP_EDITS: tuple[Callable[[st.DrawFn, Lines], Lines], ...] = (
    _delete,
    _duplicate,
    _swap,
    _replace_field,
    _corrupt_codec_line,
    _insert_known,
    _insert_random,
    _huge_line,
    _truncate,
    _upper_case,
    _odd_characters,
)
LINE_ENDINGS = ("\r\n", "\n", "\r", "\r\r\n", "\n\r", " \r\n")


def without_mdns(text: str) -> str:
    """Drop every line naming an mDNS host (``*.local``): resolving one would send
    multicast queries off this machine, and the fuzz suite stays on loopback."""
    return "".join(line for line in text.splitlines(keepends=True) if ".local" not in line.lower())


@st.composite
def mutated_sdp(draw: st.DrawFn, bases: Sequence[str], max_edits: int = 4) -> str:
    """A real offer with 1-``max_edits`` edits, then joined with any line ending."""
    lines = choice(draw, bases).split("\r\n")[:-1]
    for _ in range(1 + below(draw, max_edits)):
        if not lines:
            break
        lines = choice(draw, SDP_EDITS)(draw, lines)
    if below(draw, 2):
        ending = choice(draw, LINE_ENDINGS)
        text = ending.join(lines) + choice(draw, ["", ending])
    else:
        text = "".join(line + choice(draw, LINE_ENDINGS) for line in lines)
    return without_mdns(text)


def sdpfrag_base(offer: str) -> str:
    """A trickle-ICE fragment (RFC 8840) from an offer's ICE lines: what WHIP PATCH carries."""
    keep = ("a=ice-ufrag:", "a=ice-pwd:", "m=", "a=mid:", "a=candidate:", "a=end-of-candidates")
    lines = [line for line in offer.split("\r\n") if line.startswith(keep)]
    return "\r\n".join(lines) + "\r\n"


# ---------------------------------------------------------------------------------------------
# HTTP headers

_TCHARS = string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~"
header_tokens = st.text(alphabet=_TCHARS, min_size=1, max_size=12)
MEDIA_TYPES = (
    "application/json",
    "application/sdp",
    "application/trickle-ice-sdpfrag",
    "text/plain",
    "audio/wav",
    "multipart/form-data",
    "application/x-www-form-urlencoded",
    "application/octet-stream",
    "APPLICATION/JSON",
    "Application/SDP",
    "application/sdp+json",
    "application/*",
    "*/*",
)
CHARSETS = ("utf-8", "UTF-8", "utf8", "latin-1", "utf-16", "ascii", "bogus", "")


_media_types = st.one_of(
    st.sampled_from(MEDIA_TYPES), st.builds("{}/{}".format, header_tokens, header_tokens)
)
_parameters = st.lists(
    st.one_of(
        st.builds("charset={}".format, st.sampled_from(CHARSETS)),
        st.builds("{}={}".format, header_tokens, header_tokens),
    ),
    max_size=3,
)
# A well-formed Content-Type: known or random media type, random parameters.
content_types = st.builds(
    lambda media, params: "; ".join([media, *params]), _media_types, _parameters
)


# Header values as a client can send them: printable ASCII, no line breaks.
header_values = st.text(
    alphabet=string.printable.translate({ord(c): None for c in "\r\n\x0b\x0c"}), max_size=60
)


def media_type(content_type: str) -> str:
    """The media type of a well-formed Content-Type value, as a server should compare it."""
    return content_type.split(";", 1)[0].strip().lower()


# ---------------------------------------------------------------------------------------------
# Control messages

message_types = st.one_of(
    st.sampled_from(MESSAGE_TYPES),
    st.sampled_from(["SPEAK", "speak ", "", "stop", "error", "speech_queued"]),
    json_values,
)
message_texts = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", " ", "\n\t", "Hello."]),
    st.integers(MAX_TEXT_CHARS - 1, MAX_TEXT_CHARS + 2).map(lambda n: "a" * n),
    json_values,
)
message_ids = st.one_of(
    st.text(max_size=12),
    st.just(""),
    st.integers(MAX_ID_CHARS - 1, MAX_ID_CHARS + 2).map(lambda n: "i" * n),
    json_values,
)
control_payloads = st.fixed_dictionaries(
    {},
    optional={
        "type": message_types,
        "text": message_texts,
        "id": message_ids,
        "extra": json_values,
    },
)


@st.composite
def control_texts(draw: st.DrawFn) -> str:
    """A message as JSON text: a payload, a payload with raw values, or junk."""
    how = below(draw, 6)
    if how <= 1:
        return json.dumps(draw(control_payloads))
    if how == 2:  # a field whose value no Python object serialises to
        fields = {"type": json.dumps(choice(draw, MESSAGE_TYPES))}
        fields[choice(draw, ["text", "id", "type", "x"])] = draw(json_texts)
        return object_text(fields)
    if how == 3:
        return draw(json_texts)
    if how == 4:
        return broken_json(draw, json.dumps(draw(control_payloads)))
    return draw(short_texts)


@st.composite
def control_messages(draw: st.DrawFn) -> str | bytes:
    """A data-channel message: text or binary, sometimes over the size cap."""
    text = draw(control_texts())
    if below(draw, 16) == 0:
        text = json.dumps({"type": "speak", "text": "x" * MAX_MESSAGE_BYTES})
    as_bytes = below(draw, 4)
    if as_bytes == 0:
        return text
    data = text.encode("utf-8", "surrogatepass")
    if as_bytes == 1:
        data += choice(draw, [b"\xff", b"\x80", b"\xc3"])
    return data
