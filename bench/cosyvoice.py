"""CosyVoice2 speak engine: first-chunk latency and real-time factor at 1 to 16 streams.

    .venv/bin/python -m bench.cosyvoice MODEL_DIR [--device cpu|cuda] [--repeat 2]

Runs the engine in-process (no WebRTC), sequential (each utterance alone in its own threads)
and batched (one worker running every utterance's LLM steps and hops together), on the same
loaded model, in one run: each stream is one thread calling ``synthesize`` on its own session,
all started together. First chunk: from the call to the first audio chunk.
Real-time factor: the stream's synthesis time over the audio it produced; CPU seconds per
audio second counts the whole process, all streams, and does not grow with other load on the
machine the way wall-clock times do. A second table
times the flow per hop over a 12 s utterance, with the bounded left context against
upstream's full recompute. Results go to bench/results/cosyvoice.json.
"""

from __future__ import annotations

import argparse
import platform
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.common import ROOT, percentile, print_table, write_results
from media.engines.cosyvoice import loader
from media.engines.cosyvoice.flow_window import flow_mel
from media.engines.cosyvoice.schedule import HopSchedule
from media.engines.cosyvoice.speak import CosyVoiceEngine

SENTENCE = (
    "The train to the city leaves at half past nine, so please remember to bring your "
    "ticket and an umbrella, because it looks like rain this afternoon."
)
CONCURRENCY = (1, 2, 4, 8, 16)
FLOW_TOKENS = 300  # 12 s of speech
FLOW_REPEATS = 2
SPEECH_TOKENS = 6561


def one_stream(engine: Any, seed: int, out: list[dict[str, float]]) -> None:
    state = engine.new_state(engine.validate_options({"seed": seed}))
    began = time.perf_counter()
    first, samples = None, 0
    for chunk in engine.synthesize(state, SENTENCE, threading.Event()):
        if first is None:
            first = time.perf_counter() - began
        samples += len(chunk)
    elapsed = time.perf_counter() - began
    audio = samples / engine.sample_rate
    out.append(
        {"first_ms": 1000 * (first or elapsed), "rtf": elapsed / max(audio, 1e-9), "audio_s": audio}
    )
    engine.close_state(state)


def concurrency_rows(engines: dict[str, Any], repeat: int) -> list[dict[str, Any]]:
    """Both modes at each concurrency, next to each other, so drift hits them alike."""
    rows = []
    for streams in CONCURRENCY:
        for mode, engine in engines.items():
            rows.append({"mode": mode, **streams_row(engine, streams, repeat)})
    return rows


def streams_row(engine: Any, streams: int, repeat: int) -> dict[str, Any]:
    """``streams`` utterances started together, ``repeat`` times: latency, RTF, CPU."""
    results: list[dict[str, float]] = []
    cpu_began = time.process_time()
    for run in range(repeat):
        threads = [
            threading.Thread(target=one_stream, args=(engine, run * 100 + i, results))
            for i in range(streams)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    cpu = time.process_time() - cpu_began
    first = [r["first_ms"] for r in results]
    rtf = [r["rtf"] for r in results]
    audio = sum(r["audio_s"] for r in results)
    return {
        "streams": streams,
        "n": len(results),
        "first_chunk_ms_p50": percentile(first, 50),
        "first_chunk_ms_p95": percentile(first, 95),
        "rtf_p50": round(float(np.median(rtf)), 3),
        "rtf_max": round(max(rtf), 3),
        "audio_s": round(float(np.mean([r["audio_s"] for r in results])), 2),
        "cpu_s_per_audio_s": round(cpu / audio, 3),
    }


def flow_rows(engine: Any) -> list[dict[str, Any]]:
    """Flow CPU time per hop along one long utterance: bounded context against full recompute.

    Both variants run the same hop back to back, best of ``FLOW_REPEATS``, on one torch thread
    and timed with the thread's CPU clock, so other load on the machine does not count.
    """
    model, chunk = engine.model, engine.chunk
    prompt = engine.new_state(engine.validate_options({})).prompt.flow
    tokens = np.random.default_rng(0).integers(0, SPEECH_TOKENS, FLOW_TOKENS).astype(np.int32)
    lookahead = model.flow.pre_lookahead_len
    variants = {"bounded (100 tokens)": 100, "full recompute (upstream)": None}
    costs: dict[str, list[float]] = {label: [] for label in variants}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    schedule, start = HopSchedule(chunk, prompt.length, max_chunks=1), 0
    while start + schedule.next_hop() + lookahead <= len(tokens):
        end = start + schedule.taken[-1]
        for label, context in variants.items():
            best = float("inf")
            for _ in range(FLOW_REPEATS):
                began = time.thread_time()
                window = tokens[: end + lookahead]
                flow_mel(model.flow, prompt, window, start, end, False, context, chunk)
                best = min(best, time.thread_time() - began)
            costs[label].append(1000 * best)
        start = end
    torch.set_num_threads(threads)
    return [
        {
            "flow context": label,
            "hops": len(times),
            "first_hop_cpu_ms": round(times[0], 1),
            "last_hop_cpu_ms": round(times[-1], 1),
            "total_cpu_ms": round(sum(times), 1),
        }
        for label, times in costs.items()
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    engine = loader.load_speak({"model": args.model_dir, "device": args.device})
    sequential = CosyVoiceEngine(engine.model, engine.context_tokens, engine.chunk)
    rows = concurrency_rows({"sequential": sequential, "batched": engine}, args.repeat)
    columns = [
        "mode",
        "streams",
        "n",
        "first_chunk_ms_p50",
        "first_chunk_ms_p95",
        "rtf_p50",
        "rtf_max",
        "audio_s",
        "cpu_s_per_audio_s",
    ]
    print_table(rows, columns)
    print()
    flow = flow_rows(engine)
    print_table(
        flow, ["flow context", "hops", "first_hop_cpu_ms", "last_hop_cpu_ms", "total_cpu_ms"]
    )
    path = write_results(
        "cosyvoice",
        {
            "benchmark": "cosyvoice",
            "machine": platform.platform(),
            "model_dir": str(args.model_dir),
            "device": args.device,
            "rows": rows,
            "flow_per_hop": flow,
        },
    )
    print(f"\nwrote {path.relative_to(ROOT)}")
    engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
