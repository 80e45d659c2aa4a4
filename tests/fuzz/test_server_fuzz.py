"""A running server fed thousands of generated requests and data-channel messages.

Every input must get an answer below 500, a refusal must be the JSON error shape with a
code specific to the input (tests/fuzz/expect.py, tests/fuzz/cases.py), and no exception
may escape anywhere in the server (the error trap of tests/fuzz/harness.py is checked after
each input). The last test checks the server afterwards: no session left, memory back near
where it was after warm-up, health, and real calls that still work.

The tests share one server and run in file order; ``-m slow`` runs each family ten times
longer with fresh random inputs.
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
import re
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiortc import RTCPeerConnection
from hypothesis import given
from hypothesis import strategies as st

from media.audio.frames import RTC_RATE
from media.audio.ringbuffer import live_buffers
from media.engines.registry import EngineRegistry
from media.pipeline.speak import SpeakPipeline
from media.pipeline.transform import TransformPipeline
from peer.call import PeerCall
from server.sessions.session import Session
from tests.fuzz import cases, expect, http_cases
from tests.fuzz.cases import ACCEPTED, Case
from tests.fuzz.conftest import BATCH, Budget
from tests.fuzz.harness import FUZZ_SETTINGS, INPUTS, OPENED, FuzzServer, rss_bytes
from tests.fuzz.strategies import control_messages, mutated_sdp, sdpfrag_base
from tests.signaling.offers import new_offer

WHIP_LOCATION = re.compile(r"^/whip/sessions/([A-Za-z0-9_-]+)$")
# Growth of the process's RSS past the warm-up that counts as a leak: a floor for the
# allocators' steps, plus what hypothesis keeps of the examples it ran, which lives in this
# process too (2-4 KiB an input, measured with the inputs generated but not sent). The CI run
# (~6,500 requests, ~500 sessions opened) grows +12-35 MB against a limit of ~60 MB; keeping
# every closed session grew it +115-128 MB, keeping 8 KiB a request +59-63 MB (just over):
# smaller per-request leaks hide in the allocators' noise. Leaked sessions, peer connections,
# pipelines, buffers and coroutines are also counted exactly.
RSS_GROWTH_FLOOR = 40 * 2**20
RSS_GROWTH_PER_INPUT = 3 * 2**10
WARM_UP_ROUNDS = 30
WARM_UP_CHANNEL_MESSAGES = 250
WARM_UP_TEXT_CHARS = 2000  # at up to 3 bytes each, within the fuzz server's 8 KiB body cap
SPEAK_TIMEOUT_S = 20.0
JSON_HEADERS = {"Content-Type": cases.JSON_TYPE}
SDP_HEADERS = {"Content-Type": cases.SDP_TYPE}


@dataclass(frozen=True)
class Baseline:
    """The server after warm-up, for the leak checks at the end."""

    rss: int
    inputs: int
    coroutines: int
    buffers: int
    objects: Counter[str]


def session_objects() -> Counter[str]:
    """Live objects a session is made of: any left after its DELETE is a leak."""
    kinds = (RTCPeerConnection, Session, SpeakPipeline, TransformPipeline)
    return Counter(type(o).__name__ for o in gc.get_objects() if isinstance(o, kinds))


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * RTC_RATE), np.float32)


def tone(seconds: float, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * RTC_RATE)) / RTC_RATE
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


async def running_coroutines() -> int:
    return len(asyncio.all_tasks())


# ---------------------------------------------------------------------------------------------
# Sending a case and checking the answer


async def in_pieces(body: bytes, sizes: Sequence[int]) -> AsyncIterator[bytes]:
    at, index = 0, 0
    while at < len(body):
        size = sizes[index % len(sizes)]
        yield body[at : at + size]
        at, index = at + size, index + 1


def send(fuzz: FuzzServer, case: Case) -> expect.Reply:
    body: Any = case.body
    if case.chunk_sizes and body is not None:
        body = in_pieces(body, case.chunk_sizes)
    return fuzz.request(case.method, case.path, body, case.headers, case.params)


def close_what_it_opened(fuzz: FuzzServer, case: Case, reply: expect.Reply) -> None:
    """End the session a valid offer opened, and stop what a valid speak queued."""
    if case.method != "POST":
        return
    if case.path == "offer" and reply.status == 200:
        answer = reply.json()
        assert answer["type"] == "answer" and answer["sdp"].startswith("v=0"), reply.describe()
        fuzz.end_session(answer["session_id"])
        OPENED[case.family] += 1
    elif case.path.startswith("whip") and reply.status == 201:
        assert reply.content_type == "application/sdp" and "ETag" in reply.headers
        location = WHIP_LOCATION.match(reply.headers.get("Location", ""))
        assert location, reply.describe()
        assert fuzz.request("DELETE", location.group(0)).status == 200
        OPENED[case.family] += 1
    elif case.path.endswith("/speak") and reply.status == 202:
        assert isinstance(reply.json()["id"], str), reply.describe()
        session = case.path.split("/")[1]
        assert fuzz.request("POST", f"sessions/{session}/interrupt").status == 200
    elif case.path.endswith("/interrupt"):
        assert reply.json() == {"interrupted": True}, reply.describe()


def check(fuzz: FuzzServer, case: Case) -> None:
    """Send ``case`` and check the answer, and that the server reported no error."""
    INPUTS[case.family] += 1
    reply = send(fuzz, case)
    fuzz.trap.check()
    assert reply.status < 500, reply.describe()
    if case.method == "HEAD":  # no body to check
        return
    if reply.status < 400:
        close_what_it_opened(fuzz, case, reply)
        assert case.expected in (ACCEPTED, None), f"expected {case.expected}: {reply.describe()}"
        return
    assert case.expected != ACCEPTED, f"a valid request was refused: {reply.describe()}"
    expect.check_refusal(reply, case.allowed, case.expected)


def fuzz_cases(fuzz: FuzzServer, budget: Budget, examples: int, strategy: Any) -> None:
    """Run a family: ``examples`` hypothesis examples of up to ``BATCH`` cases each."""
    sessions = fuzz.live_sessions

    @budget(examples)
    @given(st.lists(strategy, min_size=1, max_size=BATCH))
    def run(batch: list[Case]) -> None:
        for case in batch:
            check(fuzz, case)

    run()
    assert fuzz.live_sessions == sessions, "a fuzzed input left a session open"


# ---------------------------------------------------------------------------------------------
# Fixtures: one server for the module, real offers to mutate, a speak session to talk to


@dataclass(frozen=True)
class Offers:
    sendrecv: str
    with_channel: str
    sendonly: str
    recvonly: str

    @property
    def bases(self) -> list[str]:
        return [self.sendrecv, self.with_channel, self.sendonly]


async def say(call: PeerCall, text: str) -> dict[str, Any]:
    """Speak ``text`` on a live call; the ``speech_finished`` event of it."""
    since = len(call.events)
    await call.send({"type": "speak", "text": text})
    queued = await call.wait_for("speech_queued", SPEAK_TIMEOUT_S, since=since)
    await call.wait_for("speech_started", SPEAK_TIMEOUT_S, since=since, id=queued["id"])
    return await call.wait_for("speech_finished", SPEAK_TIMEOUT_S, since=since, id=queued["id"])


async def short_speak_call(url: str, malformed: int = 0) -> None:
    """A piper call that sends ``malformed`` bad messages (each answered), then speaks."""
    call = PeerCall(url, silence(1), engine="piper")
    async with call:
        for _ in range(malformed):
            since = len(call.events)
            await call.send("{")
            await call.wait_for("error", 5.0, since=since)
        finished = await say(call, "Ready.")
        assert finished["interrupted"] is False
        await call.end()


def warm_up(fuzz: FuzzServer, offers: Offers) -> Baseline:
    """Take every path the families take, many times, then measure what the server holds.

    The first sessions, calls and error paths allocate caches, pools and imported code that
    stay for the process's life, and the allocators (glibc's, ONNX Runtime's arena) grow to
    their working size; measuring before that would read it as a leak.
    """
    speaker = open_speak_session(fuzz, offers)
    rng = random.Random(7)
    for round_ in range(WARM_UP_ROUNDS):
        for engine in ("echo", "piper"):
            body = json.dumps({"sdp": offers.with_channel, "type": "offer", "engine": engine})
            reply = fuzz.request("POST", "offer", body.encode(), JSON_HEADERS)
            fuzz.end_session(reply.json()["session_id"])
        for path in ("whip", "whip/piper"):
            reply = fuzz.request("POST", path, offers.sendrecv.encode(), SDP_HEADERS)
            assert fuzz.request("DELETE", reply.headers["Location"]).status == 200
        fuzz.request("POST", "offer", b"{", JSON_HEADERS)
        fuzz.request("POST", "whip", b"x" * (fuzz.settings.max_body_bytes + 1), SDP_HEADERS)
        if round_ % 5 == 0:  # the longest pieces text can make, in the voice's script
            # (text in other scripts is refused with unsupported_language before synthesis)
            text = "".join(chr(rng.randint(0x20, 0x24F)) for _ in range(WARM_UP_TEXT_CHARS))
            body = json.dumps({"text": text}, ensure_ascii=False).encode()
            assert (
                fuzz.request("POST", f"sessions/{speaker}/speak", body, JSON_HEADERS).status == 202
            )
            fuzz.server_loop.run(asyncio.sleep(0.5))
            fuzz.request("POST", f"sessions/{speaker}/interrupt")
    fuzz.end_session(speaker)
    # As long a call as the data-channel family makes: the client side of a call (its own
    # aiortc peer, its recordings) is in this process too.
    fuzz.client.run(short_speak_call(fuzz.url, malformed=WARM_UP_CHANNEL_MESSAGES))
    fuzz.trap.check()
    return Baseline(
        rss_bytes(),
        sum(INPUTS.values()),
        fuzz.server_loop.run(running_coroutines()),
        live_buffers(),
        session_objects(),
    )


def open_speak_session(fuzz: FuzzServer, offers: Offers) -> str:
    """A piper session (not connected) that HTTP speak requests can address."""
    body = json.dumps({"sdp": offers.sendrecv, "type": "offer", "engine": "piper"})
    reply = fuzz.request("POST", "offer", body.encode(), JSON_HEADERS)
    assert reply.status == 200, reply.describe()
    return reply.json()["session_id"]


@pytest.fixture(scope="module")
def fuzz(registry: EngineRegistry) -> Iterator[FuzzServer]:
    server = FuzzServer(registry, **FUZZ_SETTINGS).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def offers(fuzz: FuzzServer) -> Offers:
    async def make() -> Offers:
        return Offers(
            await new_offer(),
            await new_offer(data_channel=True),
            await new_offer(audio="sendonly"),
            await new_offer(audio="recvonly"),
        )

    return fuzz.client.run(make())


@pytest.fixture(scope="module")
def baseline(fuzz: FuzzServer, offers: Offers) -> Baseline:
    return warm_up(fuzz, offers)


@pytest.fixture
def speak_session(fuzz: FuzzServer, offers: Offers) -> Iterator[str]:
    session_id = open_speak_session(fuzz, offers)
    yield session_id
    fuzz.end_session(session_id)


# ---------------------------------------------------------------------------------------------
# The families


def test_expected_codes_are_ones_the_server_raises():
    """The code sets above name real codes: a typo or a renamed code fails here first."""
    root = Path(__file__).resolve().parents[2]
    sources = "".join(
        path.read_text()
        for folder in ("server", "signaling")
        for path in root.glob(f"{folder}/**/*.py")
    )
    for code in expect.ANY_ROUTE_CODES | expect.CONTROL_CODES:
        assert f'"{code}"' in sources, f"no {code!r} in server/ or signaling/"


def test_mutated_sdp_offers(fuzz: FuzzServer, offers: Offers, baseline: Baseline, budget: Budget):
    limit = fuzz.settings.max_body_bytes
    fuzz_cases(fuzz, budget, 380, cases.sdp_cases(mutated_sdp(offers.bases), limit))


def test_whip_codec_query(fuzz: FuzzServer, offers: Offers, baseline: Baseline, budget: Budget):
    fuzz_cases(fuzz, budget, 40, cases.whip_query_cases(offers.sendrecv))


def test_offer_json_shapes(
    fuzz: FuzzServer, offers: Offers, registry: EngineRegistry, baseline: Baseline, budget: Budget
):
    specs = {name: registry.get(name).option_specs for name in ("piper", "denoise")}
    limit = fuzz.settings.max_body_bytes
    strategy = st.one_of(
        cases.offer_json_cases(offers.sendrecv, offers.recvonly, specs, limit),
        cases.free_offer_json_cases(offers.sendrecv, limit),
    )
    fuzz_cases(fuzz, budget, 300, strategy)


def test_speak_and_interrupt_bodies(
    fuzz: FuzzServer, speak_session: str, baseline: Baseline, budget: Budget
):
    limit = fuzz.settings.max_body_bytes
    fuzz_cases(fuzz, budget, 260, http_cases.speak_cases(speak_session, limit))


def test_content_types(fuzz: FuzzServer, speak_session: str, baseline: Baseline, budget: Budget):
    fuzz_cases(fuzz, budget, 130, http_cases.content_type_cases(speak_session))


def test_body_sizes_around_the_cap(
    fuzz: FuzzServer, speak_session: str, baseline: Baseline, budget: Budget
):
    limit = fuzz.settings.max_body_bytes
    fuzz_cases(fuzz, budget, 60, http_cases.size_cases(speak_session, limit))


def test_every_method_on_every_route(fuzz: FuzzServer, baseline: Baseline, budget: Budget):
    fuzz_cases(fuzz, budget, 250, http_cases.method_cases())


def test_whip_trickle_patch(fuzz: FuzzServer, offers: Offers, baseline: Baseline, budget: Budget):
    reply = fuzz.request("POST", "whip", offers.sendrecv.encode(), SDP_HEADERS)
    assert reply.status == 201, reply.describe()
    location = WHIP_LOCATION.match(reply.headers["Location"])
    assert location
    try:
        limit = fuzz.settings.max_body_bytes
        fragments = mutated_sdp([sdpfrag_base(o) for o in (offers.sendrecv, offers.with_channel)])
        strategy = http_cases.patch_cases(
            location.group(1), reply.headers["ETag"], fragments, limit
        )
        fuzz_cases(fuzz, budget, 150, strategy)
    finally:
        assert fuzz.request("DELETE", location.group(0)).status == 200


def test_raw_http_requests(fuzz: FuzzServer, baseline: Baseline, budget: Budget):
    """Requests the HTTP parser must refuse (400) or route; never a 5xx, never a crash."""
    host, port = fuzz.url.split("//")[1].rstrip("/").split(":")

    async def exchange(request: bytes) -> bytes:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(request)
            writer.write_eof()
            return await asyncio.wait_for(reader.read(), 10)
        finally:
            writer.close()

    @budget(90)
    @given(st.lists(http_cases.raw_requests(), min_size=1, max_size=BATCH))
    def run(batch: list[bytes]) -> None:
        for request in batch:
            INPUTS["raw http"] += 1
            answer = fuzz.client.run(exchange(request))
            fuzz.trap.check()
            for status in re.findall(rb"^HTTP/1\.[01] (\d{3}) ", answer, re.MULTILINE):
                assert int(status) < 500, f"{request[:200]!r} -> {answer[:300]!r}"

    run()


# The live call's aiortc stack draws from the random module on its own thread while
# hypothesis generates messages here, which hypothesis takes for the strategy's doing.
@pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies")
def test_data_channel_messages_on_a_live_speak_session(
    fuzz: FuzzServer, baseline: Baseline, budget: Budget
):
    """Malformed messages through a real aiortc data channel each get one error event with
    a code of a rule they break, change nothing, and the session still speaks after."""

    async def open_call() -> PeerCall:
        call = PeerCall(fuzz.url, silence(1), engine="piper")
        try:
            await call.connect()
        except BaseException:
            await call.close()
            raise
        return call

    async def send_raw(call: PeerCall, raw: str | bytes) -> None:
        assert call.channel is not None
        call.channel.send(raw)

    call = fuzz.client.run(open_call())
    try:

        @budget(60)
        @given(
            st.lists(
                control_messages().filter(expect.message_violations), min_size=1, max_size=BATCH
            )
        )
        def run(batch: list[str | bytes]) -> None:
            for raw in batch:
                INPUTS["data channel: live session"] += 1
                since = len(call.events)
                fuzz.client.run(send_raw(call, raw))
                event = fuzz.client.run(call.wait_for("error", 5.0, since=since))
                fuzz.trap.check()
                assert set(event) == {"type", "error", "message", "received_at"}, event
                assert event["error"] in expect.message_violations(raw), (event, raw[:200])
                assert isinstance(event["message"], str) and event["message"], event
                others = {e["type"] for e in call.events[since:]} - {"error", "stats"}
                assert not others, f"a refused message changed something: {others}"

        run()
        finished = fuzz.client.run(say(call, "The session still works."))
        assert finished["interrupted"] is False and finished["position_ms"] > 300
        fuzz.client.run(call.end())
    finally:
        fuzz.client.run(call.close())


def test_server_is_healthy_and_holds_no_more_memory_after_fuzzing(
    fuzz: FuzzServer, baseline: Baseline, budget: Budget
):
    fuzz.trap.check()
    assert fuzz.live_sessions == 0
    fuzz.server_loop.run(asyncio.sleep(1.0))  # closing sessions wind down
    growth = rss_bytes() - baseline.rss
    limit = RSS_GROWTH_FLOOR + RSS_GROWTH_PER_INPUT * (sum(INPUTS.values()) - baseline.inputs)
    print(f"RSS {growth / 2**20:+.1f} MiB since warm-up (limit {limit / 2**20:.0f} MiB)")
    assert growth < limit, f"RSS grew by {growth / 2**20:.1f} MiB during fuzzing"
    assert fuzz.server_loop.run(running_coroutines()) <= baseline.coroutines
    assert live_buffers() <= baseline.buffers
    assert session_objects() <= baseline.objects, session_objects()

    health = fuzz.request("GET", "healthz")
    assert health.status == 200 and health.json() == {"status": "ok"}

    async def echo_call() -> np.ndarray:
        async with PeerCall(fuzz.url, tone(3.0), engine="echo", data_channel=False) as call:
            await asyncio.sleep(2.0)
            await call.end()
            return call.received()

    received = fuzz.client.run(echo_call())
    rms = float(np.sqrt(np.mean(received[-RTC_RATE:] ** 2))) if len(received) else 0.0
    assert rms > 0.05, f"the echo call brought back no tone (RMS {rms:.4f})"
    fuzz.client.run(short_speak_call(fuzz.url))
    fuzz.trap.check()
