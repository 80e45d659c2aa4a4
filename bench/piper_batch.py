"""Piper's first chunk for many callers at once: would batching the model across them pay?

    .venv/bin/python -m bench.piper_batch [--batches 1 2 4 8] [--repeats 7] [--callers 8]

A speak caller's first audio waits for two model runs (``media.engines.piper``): the encoder
over the whole sentence, then the flow and the decoder over the first chunk's window. For
each batch size B this times both with the same sentence repeated B times (one ORT thread,
as the engine runs them; the median of ``--repeats``), per run and per caller. Batching pays
where the per-caller cost falls with B; on a CPU where these graphs are bound by arithmetic
it does not, and then ``--callers`` callers sending at once cannot all have first audio
sooner than ``callers * per-caller cost / cores`` however they are scheduled: the floor that
the table's last line compares with one caller alone. Writes bench/results/piper_batch.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from typing import Any

import numpy as np

from bench.common import print_table, write_results
from media.engines import piper

SENTENCE = "The train to the city leaves at half past nine, from platform four."


def median_ms(session: Any, feeds: dict[str, np.ndarray], repeats: int) -> float:
    """The median time of ``session.run`` on ``feeds``, after a warm-up run."""
    session.run(None, feeds)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--callers", type=int, default=8)
    args = parser.parse_args()

    voice = piper.load_voice(piper.VOICE_PACKAGES[piper.DEFAULT_VOICE])
    front = voice.front_end
    ids = np.array([front.phonemes_to_ids(front.phonemize(SENTENCE)[0])], dtype=np.int64)
    scales = np.array([voice.noise_scale, voice.length_scale, voice.noise_w_scale], np.float32)
    prior, mask = voice.encoder.run(
        None, {"input": ids, "input_lengths": np.array([ids.shape[1]]), "scales": scales}
    )
    # The first chunk's windows, as PiperEngine._decode cuts them at a sentence's start.
    decoded = piper.FIRST_CHUNK_FRAMES + piper.DECODER_CONTEXT_FRAMES
    flowed = decoded + piper.FLOW_CONTEXT_FRAMES
    cuts = voice.cuts
    rows = []
    for batch in args.batches:
        encoder_feeds = {
            "input": np.repeat(ids, batch, 0),
            "input_lengths": np.full(batch, ids.shape[1], np.int64),
            "scales": scales,
        }
        flow_feeds = {
            cuts.prior: np.repeat(prior[:, :, :flowed], batch, 0),
            cuts.mask: np.repeat(mask[:, :, :flowed], batch, 0),
        }
        (latent,) = voice.flow.run(None, flow_feeds)
        decoder_feeds = {cuts.latent: np.ascontiguousarray(latent[:, :, :decoded])}
        encoder = median_ms(voice.encoder, encoder_feeds, args.repeats)
        flow = median_ms(voice.flow, flow_feeds, args.repeats)
        decoder = median_ms(voice.decoder, decoder_feeds, args.repeats)
        rows.append(
            {
                "batch": batch,
                "encoder_ms": round(encoder, 1),
                "flow_ms": round(flow, 1),
                "decoder_ms": round(decoder, 1),
                "per_caller_ms": round((encoder + flow + decoder) / batch, 1),
            }
        )
        print(rows[-1], flush=True)
    print()
    print_table(rows, ["batch", "encoder_ms", "flow_ms", "decoder_ms", "per_caller_ms"])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    alone = rows[0]["per_caller_ms"] if rows[0]["batch"] == 1 else None
    cheapest = min(row["per_caller_ms"] for row in rows)
    floor = args.callers * cheapest / (cores or 1)
    print(
        f"\n{args.callers} callers at once on {cores} cores: the last first chunk is done "
        f"{floor:.0f} ms after the text at the soonest ({cheapest} ms per caller at best)"
        + (f"; one caller alone: {alone} ms of compute" if alone else "")
    )
    path = write_results(
        "piper_batch",
        {
            "benchmark": "piper_batch",
            "machine": platform.platform(),
            "sentence": SENTENCE,
            "phonemes": int(ids.shape[1]),
            "cores": cores,
            "callers": args.callers,
            "rows": rows,
            "floor_ms": round(floor, 1),
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
