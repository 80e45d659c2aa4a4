"""What Opus complexity costs and buys: encode time per frame vs PESQ-WB of the result.

    python -m bench.opus_complexity [--repeat 5]

Speech with pauses (the fixture the tests use) is encoded as the server sends it (mono,
96 kb/s, ``voip``; the 20 ms frames a session sends), decoded, and scored against the
original with PESQ-WB at 16 kHz; the encode time per frame is this process's CPU time,
median of ``--repeat`` passes per complexity, all in one run so that the machine's speed
drift cancels. Writes bench/results/opus_complexity.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
from pesq import pesq

from bench.common import print_table, write_results
from media.audio.frames import FRAME_SAMPLES, RTC_RATE
from media.audio.opus import Application, OpusDecoder, OpusEncoder
from media.audio.resample import StreamResampler
from peer.speech import speech_with_pauses

BITRATE = 96_000
PESQ_RATE = 16_000
COMPLEXITIES = tuple(range(11))


def to_16k(audio: np.ndarray) -> np.ndarray:
    return StreamResampler(RTC_RATE, PESQ_RATE).process(audio, last=True)


def code(audio: np.ndarray, complexity: int) -> tuple[np.ndarray, float]:
    """The audio through encoder and decoder; seconds of encode CPU per frame."""
    encoder = OpusEncoder(channels=1, application=Application.VOIP, bitrate=BITRATE)
    encoder.set_complexity(complexity)
    decoder = OpusDecoder(channels=1)
    frames = [
        audio[i : i + FRAME_SAMPLES] for i in range(0, len(audio) - FRAME_SAMPLES, FRAME_SAMPLES)
    ]
    out = []
    spent = 0.0
    for frame in frames:
        began = time.process_time()
        packet = encoder.encode(frame)
        spent += time.process_time() - began
        out.append(decoder.decode(packet))
    encoder.close()
    decoder.close()
    return np.concatenate(out), spent / len(frames)


def measure(repeat: int) -> list[dict[str, Any]]:
    clean = speech_with_pauses().clean
    reference = to_16k(clean)
    rows = []
    costs: dict[int, list[float]] = {c: [] for c in COMPLEXITIES}
    scores: dict[int, float] = {}
    for _ in range(repeat):
        for complexity in COMPLEXITIES:  # interleaved: drift hits every level alike
            decoded, per_frame = code(clean, complexity)
            costs[complexity].append(per_frame)
            if complexity not in scores:
                coded = to_16k(decoded)[: len(reference)]
                delay = int(
                    np.argmax(np.correlate(coded[:PESQ_RATE], reference[: PESQ_RATE // 2], "valid"))
                )
                aligned = coded[delay:]
                n = min(len(aligned), len(reference))
                scores[complexity] = float(pesq(PESQ_RATE, reference[:n], aligned[:n], "wb"))
    for complexity in COMPLEXITIES:
        values = sorted(costs[complexity])
        rows.append(
            {
                "complexity": complexity,
                "encode_us_p50": round(1e6 * statistics.median(values), 1),
                "encode_us_max": round(1e6 * values[-1], 1),
                "pesq_wb": round(scores[complexity], 3),
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rows = measure(args.repeat)
    print_table(rows, ["complexity", "encode_us_p50", "encode_us_max", "pesq_wb"])
    path = write_results("opus_complexity", {"bitrate": BITRATE, "rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
