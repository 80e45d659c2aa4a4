"""What per-stage latency measurement costs the media path, per 20 ms frame.

    .venv/bin/python -m bench.stage_cost [--frames 50000] [--repeat 7]

Runs, in a loop, exactly the bookkeeping a transform (and a speak) session adds per frame:
the clock readings, the stage records, the cumulative histograms and the in-to-out meter's
drop check, against the same loop without them; prints the difference (best of
``--repeat``) and the cost of one stage summary (made once a second per session).
Writes bench/results/stage_cost.json.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from bench.common import print_table, write_results
from media.audio.resample import StreamResampler
from media.pipeline.latency import InToOutMeter
from media.pipeline.stages import SpeakStages, TransformStages, timed_resample

FRAME = 960


def best_per_frame(loop: Callable[[int], None], frames: int, repeat: int) -> float:
    """Microseconds per frame, best of ``repeat`` runs."""
    best = float("inf")
    for _ in range(repeat):
        began = time.perf_counter()
        loop(frames)
        best = min(best, time.perf_counter() - began)
    return best / frames * 1e6


def transform_with_stages(frames: int) -> None:
    clock = time.monotonic
    stages, meter = TransformStages(), InToOutMeter()
    resampler = StreamResampler(48_000, 48_000)
    chunk = [0.0] * FRAME
    written = 0
    for _ in range(frames):
        arrived = clock()  # the receive path's own reading, not an addition
        fed = clock()
        meter.arrived(FRAME, arrived)
        _, resample = timed_resample(resampler, chunk)  # type: ignore[arg-type]
        stages.pushed(FRAME, arrived, fed, resample, clock())
        stages.dequeued(clock())
        done = clock()
        _, resample = timed_resample(resampler, chunk)  # type: ignore[arg-type]
        written += FRAME
        stages.produced(done, resample, written, clock())
        ready, taken, sent = clock(), clock(), clock()
        stages.departed(written, ready, taken, sent, meter.departed(written, sent))


def transform_without(frames: int) -> None:
    clock = time.monotonic
    meter = InToOutMeter()
    written = 0
    for _ in range(frames):
        meter.arrived(FRAME, clock())
        written += FRAME
        clock()  # the pacer's reading for the slot
        meter.departed(written, clock())


def speak_with_stages(frames: int) -> None:
    clock = time.monotonic
    stages = SpeakStages()
    written = 0
    for _ in range(frames):
        written += FRAME
        stages.synthesised(written, 0.002, 0.0001, clock())
        ready, taken, sent = clock(), clock(), clock()
        stages.departed(written, ready, taken, sent)


def speak_without(frames: int) -> None:
    clock = time.monotonic
    for _ in range(frames):
        clock()
        clock()


def summary_cost(repeat: int) -> float:
    """Microseconds for one summary of a full window."""
    stages = TransformStages()
    for index in range(stages.window.rows.maxlen or 0):
        stages.window.rows.append(tuple(float(index + k) * 1e-3 for k in range(8)))
    best = float("inf")
    for _ in range(repeat):
        began = time.perf_counter()
        for _ in range(100):
            stages.window.summary_ms()
        best = min(best, (time.perf_counter() - began) / 100)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--frames", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    rows = []
    for kind, with_stages, without in (
        ("transform", transform_with_stages, transform_without),
        ("speak", speak_with_stages, speak_without),
    ):
        added = best_per_frame(with_stages, args.frames, args.repeat)
        base = best_per_frame(without, args.frames, args.repeat)
        rows.append({"session": kind, "us_per_frame_added": round(added - base, 2)})
    summary = round(summary_cost(args.repeat), 1)
    print_table(rows, ["session", "us_per_frame_added"])
    print(f"stage summary (once a second per session): {summary} us")
    write_results("stage_cost", {"per_frame": rows, "summary_us": summary})


if __name__ == "__main__":
    main()
