"""The WebSocket transport (``GET /ws``) fed thousands of generated messages on one server.

Hellos: every generated or mutated first message gets ``ready`` (then a hang-up) or an
``error`` whose code names a rule the hello breaks, then a close code of 4000 + the HTTP
status the same refusal has over HTTP. The rules are restated below from the protocol's
documentation, independently of signaling/websocket.py.

Live sessions (echo and piper): batches of audio messages of every length and header,
control messages, broken JSON and ``ack``/``credit`` with wild values. Replies come back in
the order the messages were sent, so each batch ends with a message whose reply is known and
every text message must have had exactly the reply the protocol gives it, in order. The
sessions must still carry audio (and speech) afterwards, and the error trap of
tests/fuzz/harness.py is checked after every batch.

The tests share one server and run in file order; ``-m slow`` runs each family ten times
longer with fresh random inputs.
"""

from __future__ import annotations

import asyncio
import json
import string
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from media.audio.frames import FRAME_SAMPLES, RTC_RATE
from media.engines.base import OptionSpec
from media.engines.registry import EngineRegistry
from media.transports.socket_frames import HEADER, SEQ_MOD
from peer.socket_call import SocketCall
from server.http.socket_routes import MAX_SOCKET_MESSAGE_BYTES
from server.sessions.control import MESSAGE_TYPES
from signaling.websocket import MAX_HELLO_BYTES
from tests.fuzz import expect
from tests.fuzz.cases import option_is_valid
from tests.fuzz.conftest import BATCH, Budget
from tests.fuzz.harness import FUZZ_SETTINGS, INPUTS, OPENED, FuzzServer
from tests.fuzz.strategies import (
    below,
    broken_json,
    choice,
    control_messages,
    json_texts,
    object_text,
    short_texts,
)

SUBPROTOCOL = "cosyrtc"
REPLY_TIMEOUT_S = 10.0
HELLO_EXAMPLES = 40  # of one first message of each kind (24)
SESSION_EXAMPLES = 120  # of 8-40 mixed messages
SESSION_END_TIMEOUT_S = 5.0
MAX_MESSAGE_BYTES = 16 * 1024  # the documented limit of a hello or a control message
# The largest message generated: within the documented limit (the limit itself and beyond
# have tests of their own).
LARGEST_SENT = MAX_MESSAGE_BYTES - 1
CLOSE_NORMAL = 1000
CLOSE_REPLACED = 4409  # the session continues on another connection (a resume)
HANG_UP = json.dumps({"type": "bye"})

# ---------------------------------------------------------------------------------------------
# The hello, as the protocol states it (signaling/websocket.py's docstring, the README)

HELLO_FIELDS = ("type", "engine", "options", "codec", "credit_ms", "resume")
PCM_RATES = (8_000, 16_000, 24_000, 48_000)
DEFAULT_CODEC = ("pcm16", 16_000)
OPUS = ("opus", 48_000)
DEFAULT_CREDIT_MS = 1000
CREDIT_RANGE = (20, 10_000)
SEQ_RANGE = (0, SEQ_MOD - 1)
# Every code a hello can be refused with, and the HTTP status it carries (the close code is
# 4000 + that status).
HELLO_STATUS: Mapping[str, int] = {
    "invalid_hello": 400,
    "invalid_options": 400,
    "unsupported_codec": 400,
    "unknown_engine": 400,
    "unsupported_engine": 400,
    "resume_engine_mismatch": 400,
    "resume_codec_mismatch": 400,
    "invalid_resume_token": 403,
    "session_not_found": 404,
    "message_too_large": 413,
    "engine_unavailable": 503,  # an engine the server knows but could not load
    "at_capacity": 503,
}
# Refusals that pass (the server is full, for now) say when to retry: ``retry_after_s``.
RETRY_CODES = frozenset({"at_capacity"})
# The session a valid resume claim in a fuzzed hello takes over: placeholders in the
# generated text are replaced by its id and current token when the hello is sent.
HELD_ID = "@held-session@"
HELD_TOKEN = "@held-token@"
HELD_ENGINE = "echo"
HELD_CODEC = ("pcm16", 24_000)


def is_int_in(value: Any, bounds: tuple[int, int]) -> bool:
    return type(value) is int and bounds[0] <= value <= bounds[1]


def codec_of(raw: Any) -> tuple[str, int] | None:
    """The (name, rate) a codec object asks for, or None when it asks for none we carry."""
    name, rate = raw.get("name"), raw.get("rate")
    if name == "opus":
        # Opus is carried at 48 kHz only; saying so is allowed.
        return OPUS if "rate" not in raw or (type(rate) is int and rate == OPUS[1]) else None
    if name == "pcm16":
        if "rate" not in raw:
            return DEFAULT_CODEC
        return ("pcm16", rate) if type(rate) is int and rate in PCM_RATES else None
    return None


@dataclass
class Held:
    """A live session that resume claims aim at, on the socket that holds it now."""

    session_id: str
    token: str
    ws: aiohttp.ClientWebSocketResponse
    closed: asyncio.Task[int | None]  # reads the socket to its end; its close code

    def fill(self, text: str) -> str:
        return text.replace(HELD_ID, self.session_id).replace(HELD_TOKEN, self.token)


@dataclass(frozen=True)
class Engines:
    """What the hello rules need to know of the server's engines."""

    default: str
    kinds: Mapping[str, str]  # loaded engine -> "transform" / "speak" / other
    unavailable: frozenset[str]
    specs: Mapping[str, tuple[OptionSpec, ...]]


def hello_violations(raw: str, binary: bool, held: Held, engines: Engines) -> set[str]:
    """Every rule a first message breaks; empty when it must get ``ready``."""
    if binary:
        return {"invalid_hello"}
    if len(raw.encode()) > MAX_HELLO_BYTES:
        return {"message_too_large"}
    parsed, hello = expect.json_value(raw)
    if not parsed or not isinstance(hello, dict) or hello.get("type") != "hello":
        return {"invalid_hello"}
    broken = set()
    engine, options, codec = hello.get("engine"), hello.get("options"), hello.get("codec")
    if engine is not None and not isinstance(engine, str):
        broken.add("invalid_hello")
    if options is not None and not isinstance(options, dict):
        broken.add("invalid_options")
    if codec is not None:
        if not isinstance(codec, dict):
            broken.add("invalid_hello")
        elif codec_of(codec) is None:
            broken.add("unsupported_codec")
    credit = hello.get("credit_ms")  # null, like absent, is the default
    if credit is not None and not is_int_in(credit, CREDIT_RANGE):
        broken.add("invalid_hello")
    resume = hello.get("resume")
    if resume is not None:
        claims = isinstance(resume, dict) and all(
            isinstance(resume.get(key), str) for key in ("session_id", "token")
        )
        played = resume.get("played_seq") if claims else None
        if not claims or (played is not None and not is_int_in(played, SEQ_RANGE)):
            broken.add("invalid_hello")
        elif not broken:  # a well-formed claim, checked against the session it names
            if resume["session_id"] != held.session_id:
                broken.add("session_not_found")
            elif resume["token"] != held.token:
                broken.add("invalid_resume_token")
            elif engine not in (None, HELD_ENGINE):
                broken.add("resume_engine_mismatch")
            elif codec is not None and codec_of(codec) != HELD_CODEC:
                broken.add("resume_codec_mismatch")
        return broken
    if broken:
        return broken
    name = engine or engines.default
    if name in engines.unavailable:
        return {"engine_unavailable"}
    if name not in engines.kinds:
        return {"unknown_engine"}
    if engines.kinds[name] not in ("transform", "speak"):
        return {"unsupported_engine"}
    specs = {spec.name: spec for spec in engines.specs.get(name, ())}
    for key, value in (options or {}).items():
        if key not in specs or not option_is_valid(specs[key], value):
            return {"invalid_options"}
    return set()


# ---------------------------------------------------------------------------------------------
# Hellos: a valid one with one field changed, or a first message broken as a whole

ENGINE_NAMES = ("echo", "piper", "", "ECHO", " echo", "x", "echo\x00")
CODEC_NAMES = ("pcm16", "opus", "PCM16", "mulaw", "pcmu", "L16", "", "pcm16 ")
CODEC_RATES = (
    "8000",
    "16000",
    "24000",
    "48000",
    "44100",
    "11025",
    "0",
    "-16000",
    "16000.0",
    '"16000"',
    "true",
    "null",
    "1099511627776",
)
CREDIT_VALUES = (
    "20",
    "19",
    "10000",
    "10001",
    "1000",
    "0",
    "-1",
    "1000.0",
    '"1000"',
    "true",
    "false",
    "null",
    "9223372036854775808",
)
SEQ_VALUES = (
    "0",
    "41",
    "4294967295",
    "4294967296",
    "-1",
    "1.5",
    "41.0",
    '"41"',
    "true",
    "null",
    "1e10",
    "1180591620717411303424",
)
TYPE_VALUES = ('"hello"', '"HELLO"', '"ready"', '"bye"', '""', "null", '["hello"]')
HELLO_FAULTS = (
    "valid",
    "type",
    "missing type",
    "engine",
    "options",
    "engine options",
    "codec",
    "codec name",
    "codec rate",
    "credit",
    "resume",
    "extra",
    "whole",
    "broken",
    "padded",
    "binary",
)
OTHER_CODECS = ('{"name": "pcm16", "rate": 8000}', '{"name": "opus"}', '{"name": "pcm16"}')
option_keys = st.text(max_size=8)


# Ids and tokens shaped like real ones (URL-safe base64), and any text.
claimed_ids = st.one_of(
    st.text(alphabet=string.ascii_letters + string.digits + "-_", min_size=1, max_size=43),
    short_texts,
)


CLAIM_VARIANTS = (
    "valid",
    "session_id",
    "token",
    "played_seq",
    "engine",
    "codec",
    "credit",
    "extra",
)


def held_codec_text() -> str:
    return json.dumps(dict(zip(("name", "rate"), HELD_CODEC, strict=True)))


@dataclass(frozen=True)
class HelloInput:
    fault: str
    text: str  # may name the held session by placeholder
    binary: bool = False


def value_or_json(draw: st.DrawFn, values: Sequence[str]) -> str:
    """One of ``values`` (JSON texts near the rule's edges) or any JSON text."""
    return choice(draw, values) if below(draw, 3) else draw(json_texts)


credits = st.integers(-50, 12_000).map(str)


def credit_value(draw: st.DrawFn) -> str:
    """A ``credit_ms`` value as JSON text: near the range's edges, in or out of it, or any."""
    how = below(draw, 3)
    if how == 0:
        return choice(draw, CREDIT_VALUES)
    return draw(credits) if how == 1 else draw(json_texts)


def option_values(draw: st.DrawFn, spec: OptionSpec) -> str:
    """JSON texts around what ``spec`` accepts."""
    near: list[Any] = [spec.default, None, "", True, 1, -1, 0.5]
    if spec.minimum is not None:
        near += [spec.minimum, spec.minimum - 0.01]
    if spec.maximum is not None:
        near += [spec.maximum, spec.maximum + 0.01]
    near += list(spec.choices or ())
    return json.dumps(choice(draw, near)) if below(draw, 2) else draw(json_texts)


@st.composite
def hello_inputs(draw: st.DrawFn, engines: Engines, fault: str) -> HelloInput:
    """A valid hello (its fields drawn), then ``fault``."""
    fields: dict[str, str] = {"type": '"hello"'}
    if below(draw, 3):
        fields["engine"] = json.dumps(choice(draw, ["echo", "echo", "piper"]))
    if below(draw, 2):
        fields["codec"] = choice(draw, [*OTHER_CODECS, held_codec_text()])
    if below(draw, 3) == 0:
        fields["credit_ms"] = choice(draw, ["20", "1000", "10000"])
    binary = False
    if fault == "type":
        fields["type"] = value_or_json(draw, TYPE_VALUES)
    elif fault == "missing type":
        del fields["type"]
    elif fault == "engine":
        names = [*sorted(engines.unavailable), *ENGINE_NAMES]
        fields["engine"] = json.dumps(choice(draw, names)) if below(draw, 3) else draw(json_texts)
    elif fault == "options":
        fields["engine"] = '"echo"'  # takes no options
        fields["options"] = value_or_json(draw, ("{}", "null", "[]", '{"speed": 1}', '"x"'))
    elif fault == "engine options":
        fields["engine"] = '"piper"'
        specs = engines.specs["piper"]
        if below(draw, 5):
            spec = choice(draw, specs)
            fields["options"] = object_text({spec.name: option_values(draw, spec)})
        else:
            fields["options"] = object_text({draw(option_keys): draw(json_texts)})
    elif fault == "codec":
        fields["codec"] = value_or_json(draw, ("{}", "null", "[]", '"pcm16"', "16000"))
    elif fault == "codec name":
        name = json.dumps(choice(draw, CODEC_NAMES)) if below(draw, 3) else draw(json_texts)
        fields["codec"] = object_text({"name": name})
    elif fault == "codec rate":
        name = choice(draw, ['"pcm16"', '"opus"'])
        fields["codec"] = object_text({"name": name, "rate": value_or_json(draw, CODEC_RATES)})
    elif fault == "credit":
        fields["credit_ms"] = credit_value(draw)
    elif fault == "resume":
        fields["resume"] = value_or_json(
            draw, ("null", "{}", "[]", '"x"', '{"session_id": "x"}', '{"token": "x"}')
        )
    elif fault == "extra":
        key = draw(short_texts.filter(lambda k: k not in HELLO_FIELDS))
        fields[key] = draw(json_texts)
    text = object_text(fields)
    if fault == "whole":
        text = draw(json_texts)
    elif fault == "broken":
        text = broken_json(draw, text)
    elif fault == "padded":  # up to the largest message sent
        room = LARGEST_SENT - len(object_text({**fields, "pad": '""'}).encode())
        pad = room - below(draw, 3) * below(draw, 2000)
        text = object_text({**fields, "pad": json.dumps("p" * pad)})
    elif fault == "binary":
        binary = True
    return HelloInput(fault, text, binary)


@st.composite
def resume_claims(draw: st.DrawFn, variant: str) -> HelloInput:
    """A claim on the held session: valid, or with ``variant`` changed."""
    fields = {"type": '"hello"'}
    claim = {"session_id": json.dumps(HELD_ID), "token": json.dumps(HELD_TOKEN)}
    if variant in ("session_id", "token"):
        claim[variant] = json.dumps(draw(claimed_ids)) if below(draw, 3) else draw(json_texts)
    elif variant == "played_seq":
        claim["played_seq"] = value_or_json(draw, SEQ_VALUES)
    elif variant == "engine":
        fields["engine"] = json.dumps(choice(draw, ENGINE_NAMES))
    elif variant == "codec":
        fields["codec"] = choice(draw, [*OTHER_CODECS, held_codec_text()])
    elif variant == "credit":
        fields["credit_ms"] = credit_value(draw)
    elif variant == "extra":
        claim[draw(short_texts)] = draw(json_texts)
    fields["resume"] = object_text(claim)
    return HelloInput(f"resume claim: {variant}", object_text(fields))


# ---------------------------------------------------------------------------------------------
# Sending hellos


def socket_url(fuzz: FuzzServer) -> str:
    return fuzz.url + "ws"


async def read_to_close(ws: aiohttp.ClientWebSocketResponse) -> int | None:
    """Read (and drop) everything up to the close; the close code."""
    while True:
        message = await ws.receive()
        if message.type in (
            aiohttp.WSMsgType.CLOSE,
            aiohttp.WSMsgType.CLOSING,
            aiohttp.WSMsgType.CLOSED,
            aiohttp.WSMsgType.ERROR,
        ):
            return ws.close_code


@dataclass
class Answer:
    """What came back to a first message: the first reply, and how the socket closed."""

    first: Any  # the first message's data: a decoded JSON text, or its type's name
    close_code: int | None = None
    close_reason: str = ""


async def send_first(
    fuzz: FuzzServer, data: str | bytes
) -> tuple[Answer, aiohttp.ClientWebSocketResponse]:
    """Open a socket and send ``data`` first; returns the answer with the socket, which is
    left open after a ``ready`` and closed after anything else."""
    assert fuzz.http is not None
    ws = await fuzz.http.ws_connect(socket_url(fuzz), protocols=(SUBPROTOCOL,))
    try:
        if isinstance(data, bytes):
            await ws.send_bytes(data)
        else:
            await ws.send_str(data)
        async with asyncio.timeout(REPLY_TIMEOUT_S):
            message = await ws.receive()
            if message.type is aiohttp.WSMsgType.TEXT:
                answer = Answer(json.loads(message.data))
            else:
                answer = Answer(message.type.name)
                if message.type is aiohttp.WSMsgType.CLOSE:
                    answer.close_code, answer.close_reason = ws.close_code, message.extra or ""
                    return answer, ws
            if isinstance(answer.first, dict) and answer.first.get("type") == "ready":
                return answer, ws
            closing = await ws.receive()
            answer.close_code = ws.close_code
            if closing.type is aiohttp.WSMsgType.CLOSE:
                answer.close_reason = closing.extra or ""
            return answer, ws
    except BaseException:
        await ws.close()
        raise


async def hang_up(ws: aiohttp.ClientWebSocketResponse) -> int | None:
    """``bye`` on a socket with a session: the server ends the session and closes."""
    await ws.send_str(HANG_UP)
    async with asyncio.timeout(REPLY_TIMEOUT_S):
        return await read_to_close(ws)


async def hang_up_held(held: Held) -> int | None:
    await held.ws.send_str(HANG_UP)
    async with asyncio.timeout(REPLY_TIMEOUT_S):
        return await held.closed


async def open_held(fuzz: FuzzServer) -> Held:
    codec = json.loads(held_codec_text())
    hello = json.dumps({"type": "hello", "engine": HELD_ENGINE, "codec": codec})
    answer, ws = await send_first(fuzz, hello)
    assert answer.first["type"] == "ready", answer
    ready = answer.first
    return Held(
        ready["session_id"], ready["resume_token"], ws, asyncio.create_task(read_to_close(ws))
    )


def check_refusal(answer: Answer, broken: set[str], what: str) -> None:
    """An ``error`` naming a rule ``broken`` states, then the close code of its status."""
    error = answer.first
    assert isinstance(error, dict) and error.get("type") == "error", f"{answer} for {what}"
    code = error.get("error")
    assert code in broken, f"{code!r}, but the hello breaks {broken}: {what}"
    status = HELLO_STATUS[code]
    keys = {"type", "error", "message"} | ({"retry_after_s"} if code in RETRY_CODES else set())
    assert set(error) == keys, error
    assert isinstance(error["message"], str) and error["message"].strip(), error
    assert answer.close_code == 4000 + status, f"close {answer.close_code} after {error}"
    assert answer.close_reason == code, answer
    assert not 4500 <= answer.close_code < 4600 or code in ("at_capacity", "engine_unavailable")


def check_ready(ready: dict[str, Any], hello: dict[str, Any], held: Held, engines: Engines) -> None:
    """The ``ready`` a valid hello gets: its engine, codec and credit, a new or the held
    session."""
    assert set(ready) == {
        "type",
        "session_id",
        "resume_token",
        "engine",
        "kind",
        "codec",
        "frame_ms",
        "credit_ms",
        "next_seq",
        "resumed",
    }, ready
    resumes = hello.get("resume") is not None
    engine = HELD_ENGINE if resumes else hello.get("engine") or engines.default
    codec = HELD_CODEC if resumes else codec_of(hello.get("codec") or {"name": "pcm16"})
    assert ready["engine"] == engine and ready["kind"] == engines.kinds[engine], ready
    assert (ready["codec"]["name"], ready["codec"]["rate"]) == codec, ready
    assert ready["credit_ms"] == (hello.get("credit_ms") or DEFAULT_CREDIT_MS), ready
    assert ready["frame_ms"] == 20 and ready["resumed"] is resumes, ready
    assert is_int_in(ready["next_seq"], SEQ_RANGE), ready
    assert isinstance(ready["resume_token"], str) and len(ready["resume_token"]) >= 16, ready
    if resumes:
        assert ready["session_id"] == held.session_id and ready["resume_token"] != held.token
    else:
        assert ready["next_seq"] == 0 and ready["session_id"] != held.session_id, ready


# What the hellos got, for the test's report: ready, resumed, or the refusal's code.
HELLO_OUTCOMES: Counter[str] = Counter()


async def try_hello(fuzz: FuzzServer, case: HelloInput, held: Held, engines: Engines) -> Held:
    """Send one first message, check what came back; the held session, which a valid resume
    claim moves to a new socket."""
    text = held.fill(case.text)
    broken = hello_violations(text, case.binary, held, engines)
    what = f"{case.fault}: {text[:300]!r}{' (binary)' if case.binary else ''}"
    answer, ws = await send_first(fuzz, text.encode() if case.binary else text)
    ready = answer.first if isinstance(answer.first, dict) else {}
    if ready.get("type") != "ready":
        assert broken, f"a valid hello was refused ({answer}): {what}"
        check_refusal(answer, broken, what)
        HELLO_OUTCOMES[answer.first["error"]] += 1
        return held
    if not ready.get("resumed"):
        code = await hang_up(ws)
        assert not broken, f"a hello breaking {broken} was accepted: {what}"
        assert code == CLOSE_NORMAL, f"closed with {code} after bye"
        check_ready(ready, json.loads(text), held, engines)
        OPENED["socket hello"] += 1
        HELLO_OUTCOMES["ready"] += 1
        return held
    resumed = Held(
        ready["session_id"], ready["resume_token"], ws, asyncio.create_task(read_to_close(ws))
    )
    async with asyncio.timeout(REPLY_TIMEOUT_S):
        replaced = await held.closed
    assert not broken, f"a hello breaking {broken} was accepted: {what}"
    check_ready(ready, json.loads(text), held, engines)
    assert replaced == CLOSE_REPLACED, f"the replaced socket closed with {replaced}"
    HELLO_OUTCOMES["ready, resumed"] += 1
    return resumed


# ---------------------------------------------------------------------------------------------
# Live sessions: what each message must get back


def undecodable(data: bytes, rate: int) -> bool:
    """Whether a binary message cannot be a PCM16 audio message at ``rate``."""
    if len(data) < HEADER.size:
        return True
    payload = len(data) - HEADER.size
    return payload % 2 == 1 or payload // 2 > rate * MAX_AUDIO_MS // 1000


MAX_AUDIO_MS = 120  # the most audio one message carries


def transport_refused(message: dict[str, Any]) -> bool:
    """Whether an ``ack``/``credit`` breaks its rules: ``credit_ms`` an integer in range
    (required in a ``credit``, optional with an ``ack``), an ack's ``seq`` a sequence number."""
    credit = message.get("credit_ms")
    needs_credit = message["type"] == "credit" or credit is not None
    if needs_credit and not is_int_in(credit, CREDIT_RANGE):
        return True
    return message["type"] == "ack" and not is_int_in(message.get("seq"), SEQ_RANGE)


@dataclass(frozen=True)
class Expected:
    """The one reply a text message gets: an error with one of ``codes``, or ``speech_queued``
    (with ``utterance`` as its id when the message named one)."""

    raw: str
    codes: frozenset[str] = frozenset()
    utterance: str | None = None

    def check(self, event: dict[str, Any]) -> None:
        if not self.codes:
            assert event["type"] == "speech_queued", f"{event} for {self.raw[:200]!r}"
            assert isinstance(event["id"], str) and event["id"], event
            assert self.utterance in (None, event["id"]), f"{event} for {self.raw[:200]!r}"
            return
        assert event["type"] == "error", f"{event} for {self.raw[:200]!r}"
        assert set(event) == {"type", "error", "message", "received_at"}, event
        assert event["error"] in self.codes, (
            f"{event['error']!r} for {self.raw[:200]!r}, which breaks {set(self.codes)}"
        )
        assert isinstance(event["message"], str) and event["message"], event


def is_transport(payload: Any) -> bool:
    return isinstance(payload, dict) and payload.get("type") in ("ack", "credit")


def hangs_up(raw: str) -> bool:
    parsed, payload = expect.json_value(raw)
    return parsed and isinstance(payload, dict) and payload.get("type") == "bye"


def expected_reply(raw: str, speaks: bool) -> Expected | None:
    """What a text message on a live session gets back; None: no reply."""
    parsed, payload = expect.json_value(raw)
    if parsed and is_transport(payload):
        return Expected(raw, frozenset({"invalid_message"})) if transport_refused(payload) else None
    broken = expect.message_violations(raw)
    if broken:
        return Expected(raw, frozenset(broken))
    if not speaks:
        return Expected(raw, frozenset({"not_a_speak_session"}))
    kind = payload["type"]
    if kind in ("speak", "speak_delta") and expect.foreign_to_the_voice(payload["text"]):
        return Expected(raw, frozenset({"unsupported_language"}))
    if kind == "speak":
        return Expected(raw, utterance=payload.get("id"))
    return None


# ---------------------------------------------------------------------------------------------
# Live sessions: the messages

# Values around what an ack's seq and a credit take, as JSON texts.
ACK_SEQS = (*SEQ_VALUES, "[]", "{}", "NaN", "1e999", "-0", "00", "0x10")
uint32s = st.integers(0, SEQ_MOD - 1)
wide_ints = st.integers(-(2**70), 2**70).map(str)


@st.composite
def transport_texts(draw: st.DrawFn) -> str:
    """``ack`` and ``credit`` messages with wild values, fields missing or extra."""
    kind = choice(draw, ["ack", "ack", "credit"])
    fields = {"type": json.dumps(kind)}
    if kind == "ack" or below(draw, 4) == 0:
        how = below(draw, 4)
        fields["seq"] = (
            choice(draw, ACK_SEQS)
            if how == 0
            else str(draw(uint32s))
            if how == 1
            else draw(wide_ints)
            if how == 2
            else draw(json_texts)
        )
    if kind == "credit" or below(draw, 3) == 0:
        fields["credit_ms"] = credit_value(draw)
    if below(draw, 6) == 0:
        del fields[choice(draw, list(fields))]
    if below(draw, 6) == 0:
        fields[draw(short_texts)] = draw(json_texts)
    text = object_text(fields)
    return broken_json(draw, text) if below(draw, 8) == 0 else text


AUDIO_SHAPES = ("short", "header only", "frame", "odd", "edge", "long", "any", "json")


@st.composite
def audio_messages(draw: st.DrawFn, rate: int) -> bytes:
    """Binary messages: short, odd-length, around and past the longest audio a message
    carries, with sequence numbers that jump anywhere."""
    shape = choice(draw, AUDIO_SHAPES)
    if shape == "short":
        return draw(st.binary(max_size=HEADER.size - 1))
    if shape == "json":  # a control message sent as binary is audio, not a command
        data = draw(control_messages())
        return data if isinstance(data, bytes) else data.encode()
    seq = choice(draw, [below(draw, 64), SEQ_MOD - 1 - below(draw, 2), draw(uint32s)])
    header = HEADER.pack(seq, draw(uint32s))
    most = rate * MAX_AUDIO_MS // 1000 * 2
    size = {
        "header only": 0,
        "frame": rate // 50 * 2,
        "odd": 2 * below(draw, most // 2) + 1,
        "edge": most + below(draw, 5) - 2,
        "long": most + below(draw, MAX_MESSAGE_BYTES - HEADER.size - most),
        "any": below(draw, 1000),
    }[shape]
    pattern = choice(draw, [b"\x00", b"\xff\x7f\x00\x80", draw(st.binary(min_size=1, max_size=12))])
    return header + (pattern * (size // len(pattern) + 1))[:size]


# Well-formed control messages (rare among control_messages): carried out on a speak
# session, refused on a transform one; some in scripts the voice does not read.
SPOKEN_TEXTS = ("Hello.", "Yes", "  Two words ", "Привет, мир.", "こんにちは", "مرحبا", "1, 2, 3.")
valid_controls = st.builds(
    lambda kind, text, utterance_id: json.dumps(
        {"type": kind, "text": text} | ({} if utterance_id is None else {"id": utterance_id}),
        ensure_ascii=False,
    ),
    st.sampled_from(MESSAGE_TYPES),
    st.one_of(st.sampled_from(SPOKEN_TEXTS), st.text(min_size=1, max_size=24)),
    st.one_of(st.none(), st.text(min_size=1, max_size=12)),
)


def session_messages(rate: int) -> st.SearchStrategy[str | bytes]:
    """Audio, control messages and transport messages, mixed; none over the size cap (the
    socket itself closes on that, tested separately) and none that hangs up."""
    texts = st.one_of(control_messages(), transport_texts(), valid_controls).map(
        lambda m: m.decode("utf-8", "replace") if isinstance(m, bytes) else m
    )
    return st.one_of(audio_messages(rate), texts, audio_messages(rate)).filter(
        lambda m: (
            len(m if isinstance(m, bytes) else m.encode()) <= LARGEST_SENT
            and (isinstance(m, bytes) or not hangs_up(m))
        )
    )


# ---------------------------------------------------------------------------------------------
# Live sessions: sending a batch and checking what came back

REPLY_TYPES = ("error", "speech_queued")
SPEECH_EVENTS = frozenset({"speech_queued", "speech_started", "speech_finished", "barge_in"})
# What a live session may send besides replies; never that it ended, detached or resumed.
LIVE_EVENTS = SPEECH_EVENTS | {"error", "clear", "stats", "backpressure"}


class ToneShape:
    """Replaces each sent frame with the next 20 ms of a steady tone (a ``SocketCall``
    ``shape``), so the call streams the tone for as long as it lasts."""

    def __init__(self, hz: float) -> None:
        self.hz = hz
        self._at = 0

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        t = (self._at + np.arange(FRAME_SAMPLES)) / RTC_RATE
        self._at += FRAME_SAMPLES
        return (0.3 * np.sin(2 * np.pi * self.hz * t)).astype(np.float32)


def dominant_hz(audio: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(audio * np.hanning(len(audio))))
    return float(np.argmax(spectrum) * RTC_RATE / len(audio))


async def until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


@dataclass
class LiveSession:
    """A ``SocketCall`` the fuzz batches go through, and what they have shown so far."""

    call: SocketCall
    speaks: bool
    rate: int
    sent: int = 0
    undecodable_errors: int = 0
    undecodable_sent: int = 0
    replies: Counter[str] = field(default_factory=Counter)

    @property
    def ws(self) -> aiohttp.ClientWebSocketResponse:
        assert self.call.ws is not None
        return self.call.ws

    async def exchange(self, batch: Sequence[str | bytes]) -> list[dict[str, Any]]:
        """Send ``batch`` and a sentinel; every event up to the sentinel's reply."""
        self.sent += 1
        sentinel = f"fuzz-sentinel-{self.sent}"
        since = len(self.call.events)
        for message in batch:
            if isinstance(message, bytes):
                await self.ws.send_bytes(message)
            else:
                await self.ws.send_str(message)
        if self.speaks:  # nothing queued outlives its batch: the queue never fills
            await self.ws.send_str(json.dumps({"type": "interrupt"}))
        await self.ws.send_str(json.dumps({"type": sentinel}))

        def answered() -> bool:
            assert not self.ws.closed, f"the server closed the socket ({self.ws.close_code})"
            return any(
                e.get("error") == "unknown_type" and sentinel in e.get("message", "")
                for e in self.call.events[since:]
            )

        await until(answered, REPLY_TIMEOUT_S, f"the reply to {sentinel}")
        events = self.call.events[since:]
        end = next(i for i, e in enumerate(events) if sentinel in e.get("message", ""))
        return events[: end + 1]

    def check(self, batch: Sequence[str | bytes], events: list[dict[str, Any]]) -> None:
        """Each text message's reply, in order; nothing else but the transport's own."""
        expected = [
            reply
            for message in batch
            if isinstance(message, str)
            for reply in [expected_reply(message, self.speaks)]
            if reply is not None
        ]
        replies = [
            e for e in events if e["type"] in REPLY_TYPES and e.get("error") != "undecodable_audio"
        ]
        sentinel = replies.pop()
        assert sentinel["error"] == "unknown_type"
        for reply, event in zip(expected, replies, strict=False):
            reply.check(event)
            self.replies[event.get("error") or event["type"]] += 1
        assert len(replies) == len(expected), (
            f"{len(replies)} replies to {len(expected)} messages that get one: "
            f"{replies[len(expected) :][:3]} {[r.raw[:100] for r in expected[len(replies) :][:3]]}"
        )
        bad_audio = [m for m in batch if isinstance(m, bytes) and undecodable(m, self.rate)]
        told = [e for e in events if e.get("error") == "undecodable_audio"]
        # Told at most once in a while (not once a message), and only about real faults.
        assert len(told) <= 1 and (bad_audio or not told), (told, len(bad_audio))
        for event in told:
            assert set(event) == {"type", "error", "message", "received_at"}, event
        self.undecodable_sent += len(bad_audio)
        self.undecodable_errors += len(told)
        kinds = {e["type"] for e in events}
        assert kinds <= LIVE_EVENTS, f"unexpected events: {kinds - LIVE_EVENTS}"
        if not self.speaks:
            changed = kinds & SPEECH_EVENTS
            assert not changed, f"a message to an echo session made speech: {changed}"


def fuzz_session(
    fuzz: FuzzServer,
    budget: Budget,
    examples: int,
    session: LiveSession,
    family: str,
) -> None:
    """Run ``examples`` batches of mixed messages through a live session."""

    @budget(examples)
    @given(st.lists(session_messages(session.rate), min_size=BATCH, max_size=BATCH * 5))
    def run(batch: list[str | bytes]) -> None:
        for message in batch:
            kind = "binary" if isinstance(message, bytes) else "text"
            INPUTS[f"socket: {family}, {kind}"] += 1
        events = fuzz.client.run(session.exchange(batch))
        fuzz.trap.check()
        session.check(batch, events)

    run()
    assert session.undecodable_sent == 0 or session.undecodable_errors >= 1


async def restore_credit(session: LiveSession) -> None:
    """Grant the call's own credit again (fuzzed ``credit`` messages changed it)."""
    await session.ws.send_str(json.dumps({"type": "credit", "credit_ms": session.call.credit_ms}))


async def open_call(fuzz: FuzzServer, **kwargs: Any) -> SocketCall:
    call = SocketCall(fuzz.url, np.zeros(RTC_RATE, np.float32), **kwargs)
    try:
        await call.connect()
    except BaseException:
        await call.close()
        raise
    return call


def end_call(fuzz: FuzzServer, call: SocketCall) -> None:
    """Hang up; the session must be gone within a few seconds."""
    session_id = call.session_id

    def gone() -> bool:
        return all(s.id != session_id for s in fuzz.running.server.sessions.live_sessions())

    async def hang_up_call() -> None:
        await call.end()
        await until(gone, SESSION_END_TIMEOUT_S, f"session {session_id} to end")

    try:
        fuzz.client.run(hang_up_call())
    finally:
        fuzz.client.run(call.close())


# ---------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def fuzz(registry: EngineRegistry) -> Iterator[FuzzServer]:
    server = FuzzServer(registry, **FUZZ_SETTINGS).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def engines(fuzz: FuzzServer, registry: EngineRegistry) -> Engines:
    loaded = {name: registry.get(name) for name in registry.names}
    return Engines(
        fuzz.settings.engine,
        {name: engine.kind.value for name, engine in loaded.items()},
        frozenset(registry.unavailable),
        {name: tuple(engine.option_specs) for name, engine in loaded.items()},
    )


def settled(fuzz: FuzzServer, sessions: int) -> None:
    """Wait for the server to be down to ``sessions`` sessions (closing ones wind down)."""

    async def wait() -> None:
        await until(
            lambda: fuzz.live_sessions == sessions, SESSION_END_TIMEOUT_S, "sessions to end"
        )

    fuzz.client.run(wait())


# ---------------------------------------------------------------------------------------------
# The families


def test_hello_codes_are_ones_the_server_raises():
    root = Path(__file__).resolve().parents[2]
    sources = "".join(
        path.read_text()
        for folder in ("server", "signaling")
        for path in root.glob(f"{folder}/**/*.py")
    )
    for code in HELLO_STATUS:
        assert f'"{code}"' in sources, f"no {code!r} in server/ or signaling/"


def test_hellos(fuzz: FuzzServer, engines: Engines, budget: Budget):
    """Each first message gets ``ready`` or a refusal naming a rule it breaks; valid resume
    claims take the held session over; nothing escapes in the server."""
    sessions = fuzz.live_sessions
    state = {"held": fuzz.client.run(open_held(fuzz))}

    # One input of each kind an example: every kind is sent in every run, however
    # hypothesis happens to spread its draws.
    every_kind = st.tuples(
        *(hello_inputs(engines, fault) for fault in HELLO_FAULTS),
        *(resume_claims(variant) for variant in CLAIM_VARIANTS),
    )

    @budget(HELLO_EXAMPLES)
    @given(every_kind)
    def run(batch: tuple[HelloInput, ...]) -> None:
        for case in batch:
            INPUTS["socket: hello"] += 1
            state["held"] = fuzz.client.run(try_hello(fuzz, case, state["held"], engines))
        fuzz.server_loop.run(asyncio.sleep(0.01))  # handlers that just closed finish
        fuzz.trap.check()

    try:
        run()
    finally:
        assert fuzz.client.run(hang_up_held(state["held"])) == CLOSE_NORMAL
    settled(fuzz, sessions)
    fuzz.trap.check()
    print(f"hellos: {dict(HELLO_OUTCOMES.most_common())}")


@pytest.mark.parametrize(
    ("engine", "rate"),
    [pytest.param("echo", 16_000, id="echo"), pytest.param("piper", 8_000, id="piper")],
)
def test_messages_on_a_live_session(fuzz: FuzzServer, budget: Budget, engine: str, rate: int):
    """Thousands of mixed messages; each text gets its reply in order; the session then
    still echoes a tone (echo) or speaks (piper)."""
    shape = ToneShape(440.0) if engine == "echo" else None
    codec = {"name": "pcm16", "rate": rate}
    call = fuzz.client.run(open_call(fuzz, engine=engine, codec=codec, shape=shape))
    session = LiveSession(call, speaks=engine == "piper", rate=rate)
    try:
        fuzz_session(fuzz, budget, SESSION_EXAMPLES, session, f"{engine} session")
        fuzz.client.run(restore_credit(session))
        if engine == "echo":
            fuzz.client.run(echoes_a_tone(call, 440.0))
        else:
            fuzz.client.run(still_speaks(call))
        fuzz.trap.check()
        end_call(fuzz, call)
    finally:
        fuzz.client.run(call.close())
    print(
        f"{engine}: replies {dict(session.replies)}, undecodable audio told "
        f"{session.undecodable_errors}x for {session.undecodable_sent}"
    )


def received_since(call: SocketCall, chunk: int) -> np.ndarray:
    """The audio the call has received since its ``chunk``-th frame."""
    chunks = call.recorder.chunks[chunk:]
    return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)


async def echoes_a_tone(call: SocketCall, hz: float) -> None:
    """The echo brings the call's tone back (and not the fuzzed noise)."""
    window = RTC_RATE // 2

    def clean_tone() -> bool:
        audio = received_since(call, since)[-window:]
        if len(audio) < window:
            return False
        rms = float(np.sqrt(np.mean(audio**2)))
        return rms > 0.05 and abs(dominant_hz(audio) - hz) < 10

    since = call.recorder.frames
    await until(clean_tone, 5.0, "the tone to come back")


async def still_speaks(call: SocketCall) -> None:
    """A valid ``speak`` is queued, started and heard."""
    await asyncio.sleep(0.3)  # the fuzzed noise in the backlog is through
    since = len(call.events)
    await call.send({"type": "speak", "text": "The session still works.", "id": "after-fuzz"})
    await call.wait_for("speech_queued", REPLY_TIMEOUT_S, since=since, id="after-fuzz")
    await call.wait_for("speech_started", REPLY_TIMEOUT_S, since=since, id="after-fuzz")
    heard_from = call.recorder.frames

    def heard() -> bool:
        audio = received_since(call, heard_from)
        return len(audio) > RTC_RATE // 5 and float(np.sqrt(np.mean(audio**2))) > 0.01

    await until(heard, REPLY_TIMEOUT_S, "speech audio")
    await call.send({"type": "interrupt"})


# ---------------------------------------------------------------------------------------------
# Sizes, and sockets that end early: single inputs, each with what must come back


def session_ids(fuzz: FuzzServer) -> set[str]:
    assert fuzz.running is not None
    return {session.id for session in fuzz.running.server.sessions.live_sessions()}


def trapped(fuzz: FuzzServer) -> list[str]:
    """What the error trap caught once handlers that just ended have finished (and forget it)."""
    fuzz.server_loop.run(asyncio.sleep(0.2))
    errors, fuzz.trap.errors = fuzz.trap.errors, []
    return errors


def end_new_sessions(fuzz: FuzzServer, before: set[str]) -> set[str]:
    """DELETE every session opened since ``before``; their ids."""
    left = session_ids(fuzz) - before
    for session_id in left:
        fuzz.end_session(session_id)
    return left


def padded_speak(size: int) -> str:
    """A ``speak`` message of exactly ``size`` bytes (its text too long to speak)."""
    bare = json.dumps({"type": "speak", "text": ""})
    return json.dumps({"type": "speak", "text": "x" * (size - len(bare))})


def padded_hello(size: int) -> str:
    bare = json.dumps({"type": "hello", "pad": ""})
    return json.dumps({"type": "hello", "pad": "p" * (size - len(bare))})


@pytest.mark.parametrize("kind", ["text", "binary"])
def test_a_message_over_the_limit_drops_the_socket_not_the_session(fuzz: FuzzServer, kind: str):
    """Far beyond every limit the protocol checks, aiohttp closes the socket with 1009
    (message too big), as a lost connection: the session is detached, resumable with its
    token, and goes on."""
    INPUTS["socket: over the limit"] += 1

    async def oversize() -> tuple[int | None, dict[str, Any]]:
        call = await open_call(fuzz, engine="echo")
        try:
            ws = call.ws
            assert ws is not None
            if kind == "text":
                await ws.send_str(padded_speak(MAX_SOCKET_MESSAGE_BYTES + 1))
            else:
                await ws.send_bytes(HEADER.pack(0, 0) + bytes(MAX_SOCKET_MESSAGE_BYTES))
            await until(lambda: ws.closed, REPLY_TIMEOUT_S, "a close")
            return ws.close_code, call.resume_info()
        finally:
            await call.close()

    code, resume = fuzz.client.run(oversize())
    # 1009, or 1006 when the server stops reading mid-frame and the connection is reset
    # before the client reads the close frame.
    assert code in (aiohttp.WSCloseCode.MESSAGE_TOO_BIG, aiohttp.WSCloseCode.ABNORMAL_CLOSURE)
    assert not trapped(fuzz)
    assert resume["session_id"] in session_ids(fuzz), "the session ended with its socket"
    call = fuzz.client.run(open_call(fuzz, resume=resume))
    try:
        assert call.ready is not None and call.ready["resumed"] is True, call.ready
        end_call(fuzz, call)
    finally:
        fuzz.client.run(call.close())


# aiohttp (3.14) refuses a frame whose payload is its max_msg_size or more: the socket's cap
# sits above the documented 16 KiB, so a message of exactly that size reaches the hello's own
# check (signaling/websocket.py) and the control protocol's (server/sessions/control.py).
@pytest.mark.parametrize("where", ["hello", "live session"])
def test_messages_at_the_size_limit_are_taken(fuzz: FuzzServer, where: str):
    before = session_ids(fuzz)
    INPUTS["socket: at the limit"] += 1

    async def hello() -> None:
        answer, ws = await send_first(fuzz, padded_hello(MAX_MESSAGE_BYTES))
        assert isinstance(answer.first, dict) and answer.first["type"] == "ready", answer
        assert await hang_up(ws) == CLOSE_NORMAL

    async def message() -> None:
        call = await open_call(fuzz, engine="echo")
        try:
            since = len(call.events)
            await call.send(padded_speak(MAX_MESSAGE_BYTES))
            await until(
                lambda: bool(call.ws and call.ws.closed) or len(call.events) > since,
                REPLY_TIMEOUT_S,
                "an answer",
            )
            assert call.ws is not None and not call.ws.closed, f"closed: {call.ws.close_code}"
            error = await call.wait_for("error", REPLY_TIMEOUT_S, since=since)
            assert error["error"] == "text_too_long", error
            await call.end()
        finally:
            await call.close()

    try:
        fuzz.client.run(hello() if where == "hello" else message())
    finally:
        errors = trapped(fuzz)
        end_new_sessions(fuzz, before)
    assert not errors, errors


# A first message over the hello's limit gets its precise refusal; text that is not UTF-8
# (aiohttp closes with 1007), or a socket closed or dropped before its hello, leaves nothing
# to refuse: the handler must end quietly.
@pytest.mark.parametrize("first", ["over the limit", "not utf-8", "close", "drop"])
def test_a_socket_that_breaks_or_ends_before_its_hello(fuzz: FuzzServer, first: str):
    """Refused with a reason where there is still a socket to tell; never an error in the
    server."""
    before = session_ids(fuzz)
    INPUTS["socket: before the hello"] += 1

    async def exchange() -> Answer | None:
        assert fuzz.http is not None
        if first == "drop":  # the connection goes, with no close handshake
            async with aiohttp.ClientSession() as http:
                await http.ws_connect(socket_url(fuzz), protocols=(SUBPROTOCOL,))
            return None
        if first == "over the limit":
            answer, ws = await send_first(fuzz, padded_hello(MAX_MESSAGE_BYTES + 1))
            await ws.close()
            return answer
        async with fuzz.http.ws_connect(socket_url(fuzz), protocols=(SUBPROTOCOL,)) as ws:
            if first == "close":
                await ws.close()
                return None
            await ws.send_frame(b'{"type": "hello", "engine": "\xff"}', aiohttp.WSMsgType.TEXT)
            async with asyncio.timeout(REPLY_TIMEOUT_S):
                return Answer("close", await read_to_close(ws))

    try:
        answer = fuzz.client.run(exchange())
    finally:
        errors = trapped(fuzz)
        left = end_new_sessions(fuzz, before)
    assert not left
    assert not errors, errors
    if first == "over the limit":
        assert answer is not None
        check_refusal(answer, {"message_too_large"}, "a hello over the limit")
    elif first == "not utf-8":
        assert answer is not None and answer.close_code in (1007, 4400), answer


@pytest.mark.parametrize("engine", ["echo", "piper"])
def test_a_client_gone_right_after_its_hello_leaves_a_detached_session(
    fuzz: FuzzServer, engine: str
):
    """A client that sends a valid hello and drops the connection at once: its session is
    detached (resumable for the grace period, as any dropped socket's), never left as if
    connected with no socket behind it."""
    before = session_ids(fuzz)
    INPUTS["socket: gone before ready"] += 1

    async def hello_and_go() -> None:
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(socket_url(fuzz), protocols=(SUBPROTOCOL,))
            await ws.send_str(json.dumps({"type": "hello", "engine": engine}))

    def attached() -> list[str]:
        assert fuzz.running is not None
        sessions = fuzz.running.server.sessions.live_sessions()
        return [s.id for s in sessions if s.id not in before and s.connection is not None]

    async def settle() -> None:
        await until(lambda: not attached(), SESSION_END_TIMEOUT_S, "the session detached")

    try:
        fuzz.client.run(hello_and_go())
        fuzz.client.run(settle())
    finally:
        errors = trapped(fuzz)
        end_new_sessions(fuzz, before)
    assert not errors, errors


# ``ack``, ``credit`` and ``bye`` are told from other messages by their parsed ``type``, so
# the same JSON spelled with an escape is the same message.
@pytest.mark.parametrize(
    "raw", ['{"type": "\\u0061ck", "seq": 0}', '{"type": "\\u0062ye"}'], ids=["ack", "bye"]
)
def test_transport_messages_are_known_by_their_json_not_their_spelling(fuzz: FuzzServer, raw: str):
    INPUTS["socket: spelling"] += 1

    async def exchange() -> list[dict[str, Any]]:
        call = await open_call(fuzz, engine="echo")
        try:
            session = LiveSession(call, speaks=False, rate=16_000)
            events = await session.exchange([raw])
            return [e for e in events if e["type"] == "error"][:-1]
        except AssertionError:
            if call.ws is not None and call.ws.closed:  # hung up: what a bye asks for
                return []
            raise
        finally:
            await call.end()
            await call.close()

    assert fuzz.client.run(exchange()) == []
    settled(fuzz, 0)


def test_server_is_healthy_after_fuzzing(fuzz: FuzzServer, budget: Budget):
    """No session left after the hang-ups; health, and a new session, still answered."""
    fuzz.trap.check()
    settled(fuzz, 0)
    health = fuzz.request("GET", "healthz")
    assert health.status == 200 and health.json() == {"status": "ok"}

    async def a_new_session() -> None:
        answer, ws = await send_first(fuzz, json.dumps({"type": "hello"}))
        assert answer.first["type"] == "ready", answer
        assert await hang_up(ws) == CLOSE_NORMAL

    fuzz.client.run(a_new_session())
    settled(fuzz, 0)
    fuzz.trap.check()
