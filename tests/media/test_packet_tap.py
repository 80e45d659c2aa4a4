"""The packet tap's verdicts on real Opus packets: which carried sound, and when the last did."""

from __future__ import annotations

import numpy as np

from media.audio.frames import FRAME_SAMPLES, RTC_RATE
from media.audio.opus import OpusEncoder
from peer.packet_tap import PacketTap


class Path:
    def __init__(self) -> None:
        self.got: list[int] = []

    def receive(self, seq: int, timestamp: int, payload: bytes) -> None:
        self.got.append(seq)


def frames(loud: int, quiet: int) -> list[np.ndarray]:
    tone = 0.3 * np.sin(2 * np.pi * 440 * np.arange(loud * FRAME_SAMPLES) / RTC_RATE)
    audio = np.concatenate([tone, np.zeros(quiet * FRAME_SAMPLES)]).astype(np.float32)
    return list(audio.reshape(-1, FRAME_SAMPLES))


def feed(audio: list[np.ndarray], first_seq: int, order: list[int]) -> tuple[PacketTap, Path]:
    """Encode ``audio``; deliver packet ``order[i]`` at t = i * 20 ms."""
    encoder = OpusEncoder(channels=1, bitrate=32_000)
    payloads = [encoder.encode(frame) for frame in audio]
    path = Path()
    now = [0.0]
    tap = PacketTap(path, clock=lambda: now[0])
    for index, k in enumerate(order):
        now[0] = index * 0.02
        path.receive((first_seq + k) % (1 << 16), k * FRAME_SAMPLES, payloads[k])
    return tap, path


def test_the_last_packet_with_sound_and_nothing_after_the_first_silent_one() -> None:
    audio = frames(loud=20, quiet=10)
    tap, path = feed(audio, first_seq=65_530, order=list(range(30)))
    assert path.got[0] == 65_530 and path.got[6] == 0, "the path still gets every packet"
    # Packet 19 (the last of the tone) arrived at 0.38 s; asked from 0.31 s on: 70 ms.
    last = tap.last_speech_after(0.31)
    # A tone cut off with no fade rings on in the codec for up to two more packets.
    assert last is not None and 70.0 <= last <= 110.0 + 1e-6
    assert tap.audible_after_silence(0.31) == 0


def test_sound_after_silence_is_counted_in_sequence_order() -> None:
    audio = frames(loud=10, quiet=5) + frames(loud=3, quiet=5)
    order = list(range(len(audio)))
    order[15], order[16] = order[16], order[15]  # reordered on the way: judged by sequence
    tap, _ = feed(audio, first_seq=100, order=order)
    assert tap.audible_after_silence(0.15) >= 3
    last = tap.last_speech_after(0.25)
    assert last is not None and 90.0 <= last <= 130.0 + 1e-6, "the second tone's end (and tail)"
    assert tap.last_speech_after(0.41) == 0.0, "silent from the first packet after it"
    assert tap.last_speech_after(10.0) is None, "nothing came after: no verdict"
