"""Twilio's wire formats: request signatures, the <Connect><Stream> TwiML, and the Media
Stream messages in both directions, from the examples in Twilio's documentation."""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import json
import xml.etree.ElementTree as ET
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from signaling.twilio import (
    MAX_PARAMETER_CHARS,
    Connected,
    Dtmf,
    Mark,
    Media,
    Start,
    Stop,
    TwilioProtocolError,
    clear_message,
    connect_stream_twiml,
    mark_message,
    media_message,
    parse_message,
    signature,
    signature_valid,
)
from tests.fuzz.strategies import below, broken_json, choice, json_texts, json_values, object_text

# Text as it can arrive from the network: lone surrogates included.
ANY_TEXT = st.characters(exclude_categories=())

# ---------------------------------------------------------------------------------------------
# Request signatures

# The worked example on Twilio's security page ("Validating requests").
TOKEN = "12345"
URL = "https://mycompany.com/myapp.php?foo=1&bar=2"
PARAMS = {
    "CallSid": "CA1234567890ABCDE",
    "Caller": "+12349013030",
    "Digits": "1234",
    "From": "+12349013030",
    "To": "+18005551212",
}
DOCUMENTED_SIGNATURE = "0/KCTR6DLpKmkAf8muzZqo1nDgQ="


def independent_signature(token: str, url: str, params: dict[str, str]) -> str:
    """The documented algorithm written out again, step by step."""
    data = url
    for key in sorted(params):
        data += key + params[key]
    mac = hmac.new(token.encode("utf-8"), data.encode("utf-8"), hashlib.sha1)
    return base64.b64encode(mac.digest()).decode("ascii")


def test_the_documented_example_signs_as_twilio_says() -> None:
    assert signature(TOKEN, URL, PARAMS) == DOCUMENTED_SIGNATURE
    assert signature_valid(TOKEN, URL, PARAMS, DOCUMENTED_SIGNATURE)


def test_the_vector_in_twilios_python_helper_library() -> None:
    """twilio-python's own test: the same request with other caller numbers."""
    params = {**PARAMS, "Caller": "+14158675309", "From": "+14158675309"}
    assert signature(TOKEN, URL, params) == "RSOYDt4T1cUTdK1PDd93/VVr8B8="


@pytest.mark.parametrize(
    ("url", "params"),
    [
        ("wss://voice.example.com/twilio/stream", {}),
        ("https://voice.example.com/twilio/voice", {"b": "2", "a": "1", "B": "3", "ä": "ü"}),
        ("https://voice.example.com/twilio/voice?x=%20y", {"Body": "line\nbreak & more"}),
    ],
)
def test_the_signature_is_the_documented_algorithm(url: str, params: dict[str, str]) -> None:
    assert signature("s3cr3t-tøken", url, params) == independent_signature(
        "s3cr3t-tøken", url, params
    )


def test_parameters_are_signed_in_key_order_whatever_order_they_came_in() -> None:
    backwards = dict(reversed(list(PARAMS.items())))
    assert signature(TOKEN, URL, backwards) == DOCUMENTED_SIGNATURE


@pytest.mark.parametrize(
    ("token", "url", "params"),
    [
        pytest.param("12346", URL, PARAMS, id="another token"),
        pytest.param(TOKEN, URL.replace("bar=2", "bar=3"), PARAMS, id="another query"),
        pytest.param(TOKEN, URL.replace("https", "http"), PARAMS, id="another scheme"),
        pytest.param(TOKEN, URL, {**PARAMS, "Digits": "1235"}, id="a parameter changed"),
        pytest.param(TOKEN, URL, {**PARAMS, "Extra": ""}, id="a parameter added"),
        pytest.param(
            TOKEN, URL, {k: v for k, v in PARAMS.items() if k != "To"}, id="a parameter removed"
        ),
    ],
)
def test_any_change_to_the_request_invalidates_the_signature(
    token: str, url: str, params: dict[str, str]
) -> None:
    assert not signature_valid(token, url, params, DOCUMENTED_SIGNATURE)


@pytest.mark.parametrize(
    "presented",
    [
        None,
        "",
        DOCUMENTED_SIGNATURE[:-1],
        DOCUMENTED_SIGNATURE + "=",
        "0/KCTR6DLpKmkAf8muzZqo1nDgQ\u00e9",
    ],
)
def test_a_missing_or_wrong_header_is_invalid(presented: str | None) -> None:
    assert not signature_valid(TOKEN, URL, PARAMS, presented)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(presented=st.text(ANY_TEXT, max_size=40), url=st.text(ANY_TEXT, max_size=40))
def test_any_header_or_url_is_answered_without_an_exception(presented: str, url: str) -> None:
    assert signature_valid(TOKEN, url, PARAMS, presented) == (
        presented == signature(TOKEN, url, PARAMS)
    )


# ---------------------------------------------------------------------------------------------
# TwiML


def stream_of(twiml: str) -> ET.Element:
    root = ET.fromstring(twiml)
    assert root.tag == "Response"
    (connect,) = root
    assert connect.tag == "Connect"
    (stream,) = connect
    assert stream.tag == "Stream"
    return stream


def test_connect_stream_twiml_is_the_documented_shape() -> None:
    twiml = connect_stream_twiml("wss://voice.example.com/twilio/stream", {"session": "s-1"})
    assert twiml == (
        '<?xml version="1.0" encoding="UTF-8"?><Response><Connect>'
        '<Stream url="wss://voice.example.com/twilio/stream">'
        '<Parameter name="session" value="s-1"/>'
        "</Stream></Connect></Response>"
    )


def test_without_parameters_the_stream_is_empty() -> None:
    stream = stream_of(connect_stream_twiml("wss://voice.example.com/s", {}))
    assert stream.attrib == {"url": "wss://voice.example.com/s"} and len(stream) == 0


def test_every_value_is_escaped_and_reads_back_unchanged() -> None:
    url = "wss://voice.example.com/s/a&b<c>\"d'e"
    parameters = {'we"ird&<name>': 'Tom & "Jerry" <tj@example.com>', "lines": "a\nb\r\tc  d"}
    twiml = connect_stream_twiml(url, parameters)
    assert "&amp;" in twiml and "&lt;" in twiml and "&quot;" in twiml
    stream = stream_of(twiml)
    assert stream.get("url") == url
    assert {p.get("name"): p.get("value") for p in stream} == parameters
    assert [p.tag for p in stream] == ["Parameter", "Parameter"]


def test_a_parameter_at_twilios_length_limit_is_refused_before_twilio_sees_it() -> None:
    longest = "v" * (MAX_PARAMETER_CHARS - 1)
    assert stream_of(connect_stream_twiml("wss://x/s", {"k": longest}))[0].get("value") == longest
    with pytest.raises(ValueError, match="limited to 499"):
        connect_stream_twiml("wss://x/s", {"k": longest + "v"})


@pytest.mark.parametrize("text", ["\x00", "a\x1fb", "\ud800", "\uffff"])
def test_text_xml_cannot_carry_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="XML cannot carry"):
        connect_stream_twiml("wss://x/s", {"k": text})
    with pytest.raises(ValueError, match="XML cannot carry"):
        connect_stream_twiml("wss://x/s" + text, {})


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    url=st.text(ANY_TEXT, max_size=30),
    parameters=st.dictionaries(st.text(ANY_TEXT, max_size=10), st.text(ANY_TEXT)),
)
def test_any_text_makes_twiml_that_reads_back_or_a_value_error(
    url: str, parameters: dict[str, str]
) -> None:
    try:
        twiml = connect_stream_twiml(url, parameters)
    except ValueError:
        return
    stream = stream_of(twiml)
    assert stream.get("url") == url
    assert {p.get("name"): p.get("value") for p in stream} == parameters


# ---------------------------------------------------------------------------------------------
# Media Stream messages: examples as Twilio's "WebSocket Messages" page shows them

STREAM = "MZ18ad3ab5a668481ce02b83e7395059f0"
CALL = "CA9a0e2b0c24f0e6c1bd2f3d1f5f1d5c3e"
ACCOUNT = "AC25e16e9a716a4a1786a7c83f58e30482"
AUDIO = bytes(range(160))  # 20 ms of mu-law

CONNECTED = {"event": "connected", "protocol": "Call", "version": "1.0.0"}
START = {
    "event": "start",
    "sequenceNumber": "1",
    "start": {
        "accountSid": ACCOUNT,
        "streamSid": STREAM,
        "callSid": CALL,
        "tracks": ["inbound"],
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        "customParameters": {"FirstName": "Jane", "LastName": "Doe", "RemoteParty": "Bob"},
    },
    "streamSid": STREAM,
}
MEDIA = {
    "event": "media",
    "sequenceNumber": "4",
    "media": {
        "track": "inbound",
        "chunk": "2",
        "timestamp": "5",
        "payload": base64.b64encode(AUDIO).decode(),
    },
    "streamSid": STREAM,
}
MARK = {"event": "mark", "sequenceNumber": "4", "streamSid": STREAM, "mark": {"name": "my label"}}
DTMF = {
    "event": "dtmf",
    "streamSid": STREAM,
    "sequenceNumber": "5",
    "dtmf": {"track": "inbound_track", "digit": "1"},
}
STOP = {
    "event": "stop",
    "sequenceNumber": "5",
    "stop": {"accountSid": ACCOUNT, "callSid": CALL},
    "streamSid": STREAM,
}
EXAMPLES: list[dict[str, Any]] = [CONNECTED, START, MEDIA, MARK, DTMF, STOP]
PARSED = [
    Connected(protocol="Call", version="1.0.0"),
    Start(
        stream_sid=STREAM,
        call_sid=CALL,
        account_sid=ACCOUNT,
        tracks=("inbound",),
        custom_parameters={"FirstName": "Jane", "LastName": "Doe", "RemoteParty": "Bob"},
        encoding="audio/x-mulaw",
        sample_rate=8000,
        channels=1,
    ),
    Media(stream_sid=STREAM, track="inbound", chunk=2, timestamp_ms=5, payload=AUDIO),
    Mark(stream_sid=STREAM, name="my label"),
    Dtmf(stream_sid=STREAM, digit="1"),
    Stop(stream_sid=STREAM),
]
ERROR_CODES = {
    "message_too_large",
    "invalid_encoding",
    "invalid_json",
    "invalid_message",
    "unknown_event",
    "missing_field",
    "invalid_field",
    "invalid_payload",
}


def changed(message: dict[str, Any], path: str, value: Any = ...) -> dict[str, Any]:
    """A deep copy of ``message`` with the field at dotted ``path`` set, or removed (...)."""
    result = copy.deepcopy(message)
    *parents, key = path.split(".")
    target = result
    for parent in parents:
        target = target[parent]
    if value is ...:
        del target[key]
    else:
        target[key] = value
    return result


@pytest.mark.parametrize(("message", "parsed"), list(zip(EXAMPLES, PARSED, strict=True)))
def test_each_documented_example_parses(message: dict[str, Any], parsed: object) -> None:
    assert parse_message(json.dumps(message)) == parsed
    assert parse_message(json.dumps(message, indent=1).encode()) == parsed


def test_numbers_may_come_as_json_numbers_or_as_strings() -> None:
    as_numbers = changed(changed(MEDIA, "media.chunk", 2), "media.timestamp", 5)
    assert parse_message(json.dumps(as_numbers)) == PARSED[2]
    as_strings = changed(
        changed(START, "start.mediaFormat.sampleRate", "8000"), "sequenceNumber", 1
    )
    assert parse_message(json.dumps(as_strings)) == PARSED[1]


def test_fields_nobody_reads_are_ignored() -> None:
    extra = changed(changed(MEDIA, "media.extra", {"x": [1]}), "future", None)
    assert parse_message(json.dumps(extra)) == PARSED[2]
    assert parse_message(json.dumps(changed(STOP, "stop", ...))) == PARSED[5]


def test_custom_parameters_are_strings_and_may_be_left_out() -> None:
    bare = parse_message(json.dumps(changed(START, "start.customParameters", ...)))
    assert isinstance(bare, Start) and bare.custom_parameters == {}
    scalars = {"n": 5, "f": 1.5, "yes": True, "none": None, "s": "x"}
    start = parse_message(json.dumps(changed(START, "start.customParameters", scalars)))
    assert isinstance(start, Start)
    assert start.custom_parameters == {
        "n": "5",
        "f": "1.5",
        "yes": "true",
        "none": "null",
        "s": "x",
    }


@pytest.mark.parametrize("nested", [{"a": "b"}, ["a"]])
def test_a_nested_custom_parameter_is_refused_by_name(nested: object) -> None:
    raw = json.dumps(changed(START, "start.customParameters.session", nested))
    with pytest.raises(TwilioProtocolError, match="'session'") as caught:
        parse_message(raw)
    assert caught.value.code == "invalid_field"


def test_an_empty_payload_is_an_empty_chunk() -> None:
    media = parse_message(json.dumps(changed(MEDIA, "media.payload", "")))
    assert isinstance(media, Media) and media.payload == b""


def test_the_error_carries_its_code_and_message() -> None:
    with pytest.raises(TwilioProtocolError) as caught:
        parse_message('{"event": "hangup"}')
    assert caught.value.code == "unknown_event"
    assert caught.value.message == str(caught.value) == "Unknown event 'hangup'."


BROKEN: list[tuple[str, str | bytes, str]] = [
    ("not UTF-8", b'{"event": "stop", "streamSid": "\xff"}', "invalid_encoding"),
    ("not JSON", "event=media", "invalid_json"),
    ("truncated JSON", json.dumps(MEDIA)[:-1], "invalid_json"),
    ("a number past the digit limit", "9" * 5000, "invalid_json"),
    ("nesting past the recursion limit", "[" * 20_000, "invalid_json"),
    ("an array", json.dumps([CONNECTED]), "invalid_message"),
    ("a string", '"connected"', "invalid_message"),
    ("no event", json.dumps(changed(MEDIA, "event")), "invalid_message"),
    ("a number for event", json.dumps(changed(MEDIA, "event", 3)), "invalid_message"),
    ("an unknown event", json.dumps(changed(MEDIA, "event", "Media")), "unknown_event"),
    ("an event we send", json.dumps({"event": "clear", "streamSid": STREAM}), "unknown_event"),
    ("connected without version", json.dumps(changed(CONNECTED, "version")), "missing_field"),
    ("start without start", json.dumps(changed(START, "start")), "missing_field"),
    ("start as a string", json.dumps(changed(START, "start", "x")), "invalid_field"),
    ("start without callSid", json.dumps(changed(START, "start.callSid")), "missing_field"),
    ("tracks as a string", json.dumps(changed(START, "start.tracks", "inbound")), "invalid_field"),
    ("tracks of numbers", json.dumps(changed(START, "start.tracks", [1])), "invalid_field"),
    ("no mediaFormat", json.dumps(changed(START, "start.mediaFormat")), "missing_field"),
    ("mediaFormat as a list", json.dumps(changed(START, "start.mediaFormat", [])), "invalid_field"),
    ("no sample rate", json.dumps(changed(START, "start.mediaFormat.sampleRate")), "missing_field"),
    ("zero channels", json.dumps(changed(START, "start.mediaFormat.channels", 0)), "invalid_field"),
    (
        "parameters as a list",
        json.dumps(changed(START, "start.customParameters", [])),
        "invalid_field",
    ),
    ("no streamSid", json.dumps(changed(MEDIA, "streamSid")), "missing_field"),
    ("a null streamSid", json.dumps(changed(STOP, "streamSid", None)), "invalid_field"),
    ("no payload", json.dumps(changed(MEDIA, "media.payload")), "missing_field"),
    ("a numeric payload", json.dumps(changed(MEDIA, "media.payload", 7)), "invalid_field"),
    (
        "payload not base64",
        json.dumps(changed(MEDIA, "media.payload", "no+Jhoa@")),
        "invalid_payload",
    ),
    ("payload badly padded", json.dumps(changed(MEDIA, "media.payload", "abc")), "invalid_payload"),
    (
        "payload not ASCII",
        json.dumps(changed(MEDIA, "media.payload", "n\u00f6==")),
        "invalid_payload",
    ),
    ("a negative chunk", json.dumps(changed(MEDIA, "media.chunk", "-1")), "invalid_field"),
    ("a fractional chunk", json.dumps(changed(MEDIA, "media.chunk", "1.5")), "invalid_field"),
    ("a float chunk", json.dumps(changed(MEDIA, "media.chunk", 1.0)), "invalid_field"),
    ("a boolean chunk", json.dumps(changed(MEDIA, "media.chunk", True)), "invalid_field"),
    ("a superscript chunk", json.dumps(changed(MEDIA, "media.chunk", "\u00b2")), "invalid_field"),
    (
        "an endless timestamp",
        json.dumps(changed(MEDIA, "media.timestamp", "9" * 19)),
        "invalid_field",
    ),
    ("an empty timestamp", json.dumps(changed(MEDIA, "media.timestamp", "")), "invalid_field"),
    ("no track", json.dumps(changed(MEDIA, "media.track")), "missing_field"),
    ("mark without a name", json.dumps(changed(MARK, "mark.name")), "missing_field"),
    ("mark as a string", json.dumps(changed(MARK, "mark", "my label")), "invalid_field"),
    ("dtmf with a numeric digit", json.dumps(changed(DTMF, "dtmf.digit", 1)), "invalid_field"),
    ("oversize text", json.dumps(changed(MARK, "mark.name", "m" * 70_000)), "message_too_large"),
    (
        "oversize bytes",
        json.dumps(changed(MARK, "mark.name", "m" * 70_000)).encode(),
        "message_too_large",
    ),
]


@pytest.mark.parametrize(
    ("raw", "code"), [pytest.param(raw, code, id=name) for name, raw, code in BROKEN]
)
def test_each_kind_of_broken_message_is_refused_with_its_code(raw: str | bytes, code: str) -> None:
    with pytest.raises(TwilioProtocolError) as caught:
        parse_message(raw)
    assert caught.value.code == code
    assert caught.value.message


def test_the_size_limit_counts_utf8_bytes_and_can_be_set() -> None:
    raw = json.dumps(changed(MARK, "mark.name", "\u00e9" * 40), ensure_ascii=False)
    size = len(raw.encode())
    assert parse_message(raw, max_bytes=size) == Mark(STREAM, "\u00e9" * 40)
    assert parse_message(raw.encode(), max_bytes=size) == Mark(STREAM, "\u00e9" * 40)
    for too_small in (raw, raw.encode()):
        with pytest.raises(TwilioProtocolError) as caught:
            parse_message(too_small, max_bytes=size - 1)
        assert caught.value.code == "message_too_large"


# ---------------------------------------------------------------------------------------------
# Messages to Twilio


def test_a_media_message_carries_the_audio_as_base64() -> None:
    sent = json.loads(media_message(STREAM, AUDIO))
    assert sent == {
        "event": "media",
        "streamSid": STREAM,
        "media": {"payload": base64.b64encode(AUDIO).decode()},
    }
    assert base64.b64decode(sent["media"]["payload"], validate=True) == AUDIO


def test_mark_and_clear_messages() -> None:
    assert json.loads(mark_message(STREAM, "reply-3")) == {
        "event": "mark",
        "streamSid": STREAM,
        "mark": {"name": "reply-3"},
    }
    assert clear_message(STREAM) == f'{{"event":"clear","streamSid":"{STREAM}"}}'


def test_a_mark_twilio_echoes_back_parses_to_the_name_that_was_sent() -> None:
    name = 'reply 3 \u00e9 "quoted"'
    echoed = {**json.loads(mark_message(STREAM, name)), "sequenceNumber": "9"}
    assert parse_message(json.dumps(echoed)) == Mark(STREAM, name)


# ---------------------------------------------------------------------------------------------
# Anything at all

ODD_STRINGS = ["", "-1", "1.5", "\u00b2", "9" * 30, "no+Jhoa@", "abc", "\ud800", "inbound"]
field_values = json_values | st.sampled_from(ODD_STRINGS)
junk = json_texts | st.text(max_size=60)


def field_paths(message: dict[str, Any], prefix: str = "") -> list[str]:
    """The dotted path of every field, nested ones included."""
    paths = []
    for key, value in message.items():
        paths.append(prefix + key)
        if isinstance(value, dict):
            paths.extend(field_paths(value, f"{prefix}{key}."))
    return paths


@st.composite
def twilio_messages(draw: st.DrawFn) -> str | bytes:
    """A documented example with a field removed or replaced, raw JSON text, a message cut
    short, or junk; as text or as bytes, sometimes not UTF-8."""
    base = choice(draw, EXAMPLES)
    how = below(draw, 6)
    if how == 0:
        text = json.dumps(changed(base, choice(draw, field_paths(base))))
    elif how == 1:
        text = json.dumps(changed(base, choice(draw, field_paths(base)), draw(field_values)))
    elif how == 2:  # a field whose value no Python object serialises to
        fields = {key: json.dumps(value) for key, value in base.items()}
        fields[choice(draw, [*base, "event"])] = draw(json_texts)
        text = object_text(fields)
    elif how == 3:
        text = broken_json(draw, json.dumps(base))
    elif how == 4:
        text = draw(junk)
    else:
        text = json.dumps(base)
    as_bytes = below(draw, 4)
    if as_bytes == 0:
        return text
    data = text.encode("utf-8", "surrogatepass")
    return data + b"\xc3" if as_bytes == 1 else data


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(st.lists(twilio_messages(), min_size=1, max_size=8))
def test_parse_message_raises_nothing_but_its_own_error(batch: list[str | bytes]) -> None:
    for raw in batch:
        try:
            message = parse_message(raw)
        except TwilioProtocolError as exc:
            assert exc.code in ERROR_CODES
            assert isinstance(exc.message, str) and exc.message
            continue
        assert isinstance(message, Connected | Start | Media | Mark | Dtmf | Stop)
