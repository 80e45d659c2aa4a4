"""The receive path fed garbage: random bytes, broken Opus, odd timing, all through ``add``.

Tried as a new user would: a caller whose Opus payloads were random bytes (after DTLS) made
the first undecodable packet raise ``OpusError: corrupted stream`` inside the receive path;
aiortc's DTLS loop died with it and the session closed. Whatever a caller sends, the path
must keep its shape: no exception, one whole finite frame per slot, bounded buffers. The
run is derandomised and bounded to a few seconds.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from aiortc.rtp import RtpPacket
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from media.audio.opus import OpusEncoder
from media.rtc.receive import MAX_BUFFER_S, MAX_MISORDER, SEQ_MOD, TS_MOD, AudioReceivePath
from tests.media.test_receive import FRAME, RATE, SLOT, Scheduler, voiced

VALID = [
    OpusEncoder(bitrate=48_000).encode(chunk) for chunk in voiced(1.0, seed=5).reshape(-1, FRAME)
]

payloads = st.one_of(
    st.sampled_from(VALID),
    st.binary(min_size=0, max_size=400),  # random bytes, often "decodable" as noise
    st.sampled_from(VALID).map(lambda p: p[: len(p) // 2]),  # truncated
    st.tuples(st.sampled_from(VALID), st.integers(0, 255)).map(
        lambda t: bytes([t[1]]) + t[0][1:]  # a valid body under another TOC byte
    ),
)
packets = st.tuples(
    st.integers(-3, 130),  # sequence step (0: duplicate, <0: reordered, >100: restart)
    st.integers(-FRAME, 4 * FRAME),  # timestamp step beyond the usual 960
    st.floats(0.0, 0.2),  # time since the previous packet
    payloads,
)


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=(HealthCheck.too_slow, HealthCheck.data_too_large),
)
@given(st.lists(packets, min_size=1, max_size=80), st.booleans())
def test_whatever_a_caller_sends_the_path_keeps_its_shape(
    stream: list[tuple[int, int, float, bytes]], garbage_first: bool
) -> None:
    failures = _Failures()
    logging.getLogger("media.rtc.receive").addHandler(failures)
    try:
        _run(stream, garbage_first)
    finally:
        logging.getLogger("media.rtc.receive").removeHandler(failures)
    assert failures.records == [], failures.records[0].getMessage()


class _Failures(logging.Handler):
    """Errors the path logged: a failure it caught is still a failure here."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _run(stream: list[tuple[int, int, float, bytes]], garbage_first: bool) -> None:
    time = Scheduler()
    frames: list[np.ndarray] = []
    errors: list[tuple[str, str]] = []
    path = AudioReceivePath(
        frames.append,
        clock=time.clock,
        call_at=time.call_at,
        on_error=lambda code, message: errors.append((code, message)),
    )
    seq, timestamp, now = 4000, 12345, 0.0
    if garbage_first:  # a burst of pure noise first: the path must mute it and recover
        rng = np.random.default_rng(len(stream))
        for _ in range(60):
            now += SLOT
            seq, timestamp = (seq + 1) % SEQ_MOD, (timestamp + FRAME) % TS_MOD
            time.advance_to(now)
            noise = rng.integers(0, 256, int(rng.integers(1, 300)), dtype=np.uint8).tobytes()
            path.add(_packet(seq, timestamp, noise))
    for seq_step, timestamp_step, gap, payload in stream:
        now += gap
        seq = (seq + seq_step) % SEQ_MOD
        timestamp = (timestamp + FRAME + timestamp_step) % TS_MOD
        time.advance_to(now)
        path.receive(seq, timestamp, payload)  # raises what add() would only log
        assert len(path._pending) <= MAX_MISORDER // 2
        assert path._decoded.samples <= MAX_BUFFER_S * RATE
    time.advance_to(now + 2.0)
    for frame in frames:
        assert frame.shape == (FRAME,) and frame.dtype == np.float32
        assert np.isfinite(frame).all()
    stats = path.stats
    assert stats.packets == len(stream) + (60 if garbage_first else 0)
    assert stats.frames == len(frames)
    assert all(code == "undecodable_audio" for code, _ in errors)
    path.close()


def _packet(seq: int, timestamp: int, payload: bytes) -> Any:
    return RtpPacket(payload_type=111, sequence_number=seq, timestamp=timestamp, payload=payload)
