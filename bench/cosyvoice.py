"""CosyVoice2 speak engine: first-chunk latency and real-time factor at 1 to 16 streams.

    .venv/bin/python -m bench.cosyvoice MODEL_DIR [--device cpu|cuda] [--repeat 2]
        [--triton-url HOST:PORT | --triton-standin] [--processes N]
        [--cpu-convolutions native|onednn] [--llm-steps dynamic static graph]
        [--precision float32|bfloat16|float16] [--batch-loops N]

Runs the engine in-process (no WebRTC), sequential (each utterance alone in its own threads)
and batched (one worker running every utterance's LLM steps and hops together), on the same
loaded model, in one run: each stream is one thread calling ``synthesize`` on its own session,
all started together. First chunk: from the call to the first audio chunk.
Real-time factor: the stream's synthesis time over the audio it produced; CPU seconds per
audio second counts the whole process, all streams, and does not grow with other load on the
machine the way wall-clock times do. With ``--triton-url HOST:PORT`` (a Triton server running
CosyVoice's official runtime) or ``--triton-standin`` (the repo's stand-in, started for the
run), ``cosyvoice-triton`` gets rows of its own; its CPU column is this process's share. A
second table times the flow per hop over a 12 s utterance, with the bounded left context
against upstream's full recompute. Results go to bench/results/cosyvoice.json.

``--processes N`` adds rows for the batched engine in N processes, as a server with one worker
process per core runs it: each loads the model, the streams of a level are split evenly
between them, and every process starts its share at the same moment (a barrier), so the
batch workers run side by side on their own cores. CPU seconds per audio second add up all
of them. ``--batch-loops N`` adds rows for one engine with ``cosyvoice.batch_loops=N``:
the engine itself places each utterance on the least-loaded of its N loops (the first in
this process, the others in processes of their own), as a model host runs it; its CPU
column adds up this process and the loop processes.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.common import ROOT, percentile, print_table, process_cpu_seconds, write_results
from media.engines.cosyvoice import loader
from media.engines.cosyvoice.batcher import CosyVoiceBatcher
from media.engines.cosyvoice.flow_window import flow_mel
from media.engines.cosyvoice.schedule import HopSchedule
from media.engines.cosyvoice.speak import CosyVoiceEngine
from media.engines.registry import EngineRegistry
from scripts.triton_standin import shm_prefix

SENTENCE = (
    "The train to the city leaves at half past nine, so please remember to bring your "
    "ticket and an umbrella, because it looks like rain this afternoon."
)
CONCURRENCY = (1, 2, 4, 8, 16)
FLOW_TOKENS = 300  # 12 s of speech
FLOW_REPEATS = 2
SPEECH_TOKENS = 6561
TRITON_READY_S = 60.0
STANDIN_STOP_S = 10.0
WORKER_STOP_S = 10.0  # a --processes worker, after its last level


def one_stream(engine: Any, seed: int, out: list[dict[str, float]]) -> None:
    seeded = any(spec.name == "seed" for spec in engine.option_specs)
    state = engine.new_state(engine.validate_options({"seed": seed} if seeded else {}))
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


def concurrency_rows(
    engines: dict[str, Any], concurrency: list[int], repeat: int
) -> list[dict[str, Any]]:
    """Every mode at each concurrency, next to each other, so drift hits them alike."""
    rows = []
    for streams in concurrency:
        for mode, engine in engines.items():
            rows.append({"mode": mode, **streams_row(engine, streams, repeat)})
            print(f"measured: {rows[-1]}", file=sys.stderr, flush=True)  # survives a timeout
    return rows


def streams_row(engine: Any, streams: int, repeat: int) -> dict[str, Any]:
    """``streams`` utterances started together, ``repeat`` times: latency, RTF, CPU (this
    process's and the engine's loop processes', if it has any)."""
    results: list[dict[str, float]] = []
    loops = [loop.pid for loop in getattr(engine, "loop_processes", ())]
    cpu_began = time.process_time() + sum(map(process_cpu_seconds, loops))
    for run in range(repeat):
        run_together(engine, [run * 100 + i for i in range(streams)], results)
    cpu = time.process_time() + sum(map(process_cpu_seconds, loops)) - cpu_began
    return summary_row(streams, results, cpu)


def run_together(engine: Any, seeds: list[int], out: list[dict[str, float]]) -> None:
    """One utterance per seed, each in its own thread, all started at once; until all end."""
    threads = [threading.Thread(target=one_stream, args=(engine, seed, out)) for seed in seeds]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def summary_row(streams: int, results: list[dict[str, float]], cpu: float) -> dict[str, Any]:
    """One level's streams (``one_stream`` results) and the CPU seconds they took, as a row."""
    first = [r["first_ms"] for r in results]
    rtf = [r["rtf"] for r in results]
    audio = [r["audio_s"] for r in results]
    return {
        "streams": streams,
        "n": len(results),
        "first_chunk_ms_p50": percentile(first, 50),
        "first_chunk_ms_p95": percentile(first, 95),
        "rtf_p50": round(float(np.median(rtf)), 3),
        "rtf_max": round(max(rtf), 3),
        "audio_s": round(float(np.mean(audio)), 2),
        "cpu_s_per_audio_s": round(cpu / sum(audio), 3),
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


def _share(streams: int, processes: int, index: int) -> int:
    """How many of ``streams`` the process ``index`` of ``processes`` runs."""
    return streams // processes + (1 if index < streams % processes else 0)


def _process_worker(
    settings: dict[str, Any],
    index: int,
    processes: int,
    concurrency: list[int],
    repeat: int,
    barrier: Any,
    results: Any,
) -> None:
    """One process of ``--processes``: its share of every level, started at the barrier."""
    engine = loader.load_speak(settings)
    for streams in concurrency:
        for run in range(repeat):
            out: list[dict[str, float]] = []
            barrier.wait()
            cpu_began = time.process_time()
            share = _share(streams, processes, index)
            run_together(engine, [run * 100 + index * 10 + i for i in range(share)], out)
            results.put((streams, out, time.process_time() - cpu_began))
    engine.close()


def processes_rows(
    settings: dict[str, Any], processes: int, concurrency: list[int], repeat: int
) -> list[dict[str, Any]]:
    """The batched engine in ``processes`` processes, each level's streams split evenly."""
    context = multiprocessing.get_context("spawn")  # torch's threads do not survive a fork
    barrier = context.Barrier(processes + 1)
    results = context.Queue()
    workers = [
        context.Process(
            target=_process_worker,
            args=(settings, i, processes, concurrency, repeat, barrier, results),
        )
        for i in range(processes)
    ]
    for worker in workers:
        worker.start()
    rows = []
    try:
        for streams in concurrency:
            level: list[dict[str, float]] = []
            cpu = 0.0
            for _ in range(repeat):
                barrier.wait(timeout=600)
                for _ in range(processes):
                    _, out, seconds = results.get(timeout=600)
                    cpu += seconds
                    level += out
            mode = f"batched x{processes} processes"
            rows.append({"mode": mode, **summary_row(streams, level, cpu)})
            print(f"measured: {rows[-1]}", file=sys.stderr, flush=True)
    finally:
        for worker in workers:
            worker.join(WORKER_STOP_S)
            if worker.is_alive():
                worker.terminate()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--streams", type=int, nargs="+", default=list(CONCURRENCY))
    parser.add_argument("--name", default="cosyvoice", help="results file: bench/results/NAME.json")
    parser.add_argument("--no-flow-table", action="store_true", help="skip the flow-per-hop table")
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="also run the batched engine in this many processes, streams split evenly",
    )
    triton = parser.add_mutually_exclusive_group()
    triton.add_argument(
        "--triton-url", help="also measure cosyvoice-triton against this server (HOST:PORT)"
    )
    triton.add_argument(
        "--triton-standin",
        action="store_true",
        help="also measure cosyvoice-triton against the stand-in server (make triton-standin)",
    )
    parser.add_argument(
        "--cpu-convolutions",
        choices=loader.CPU_CONVOLUTIONS,
        default="native",
        help="the engine's convolution kernels on a CPU (see loader.use_cpu_convolutions)",
    )
    parser.add_argument(
        "--llm-steps",
        nargs="+",
        choices=loader.LLM_STEPS,
        default=["dynamic"],
        help="the batched LLM step (cosyvoice.llm_step); each after the first adds batched rows",
    )
    parser.add_argument(
        "--precision",
        choices=loader.PRECISIONS,
        default="float32",
        help="what the LLM and flow compute in (cosyvoice.precision)",
    )
    parser.add_argument(
        "--batch-loops",
        type=int,
        default=1,
        help="also run an engine with this many batch loops (cosyvoice.batch_loops)",
    )
    args = parser.parse_args()
    settings = {
        "model": args.model_dir,
        "device": args.device,
        "cpu_convolutions": args.cpu_convolutions,
        "llm_step": args.llm_steps[0],
        "precision": args.precision,
    }
    engine = loader.load_speak(settings)
    sequential = CosyVoiceEngine(engine.model, engine.context_tokens, engine.chunk)
    engines: dict[str, Any] = {"sequential": sequential, "batched": engine}
    for step in args.llm_steps[1:]:  # the same loaded model, another batch loop
        batcher = CosyVoiceBatcher(engine.model, engine.context_tokens, engine.chunk, llm_step=step)
        engines[f"batched-{step}"] = CosyVoiceEngine(
            engine.model, engine.context_tokens, engine.chunk, batcher
        )
    if args.batch_loops > 1:
        looped = {**settings, "batch_loops": args.batch_loops}
        engines[f"batched x{args.batch_loops} loops"] = loader.load_speak(looped)
    with contextlib.ExitStack() as stack:
        url = args.triton_url
        if args.triton_standin:
            url = stack.enter_context(triton_standin())
        if url:
            engines["triton"] = stack.enter_context(triton_engine(url))
        rows = concurrency_rows(engines, args.streams, args.repeat)
    if args.processes > 1:
        rows += processes_rows(settings, args.processes, args.streams, args.repeat)
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
    flow = [] if args.no_flow_table else flow_rows(engine)
    if flow:
        print_table(
            flow, ["flow context", "hops", "first_hop_cpu_ms", "last_hop_cpu_ms", "total_cpu_ms"]
        )
    path = write_results(
        args.name,
        {
            "benchmark": "cosyvoice",
            "machine": platform.platform(),
            "model_dir": str(args.model_dir),
            "device": args.device,
            "cpu_convolutions": args.cpu_convolutions,
            "llm_steps": args.llm_steps,
            "precision": args.precision,
            "batch_loops": args.batch_loops,
            "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
            "rows": rows,
            "flow_per_hop": flow,
        },
    )
    print(f"\nwrote {path.relative_to(ROOT)}")
    for name, other in engines.items():
        if name.startswith("batched-"):
            other.shutdown()
        elif name.endswith(" loops"):
            other.close()
    engine.close()
    return 0


@contextlib.contextmanager
def triton_standin() -> Iterator[str]:
    """``scripts/triton_standin.py`` on a free port, from its own environment, for the run.

    Its responses are paced as its defaults say (20 ms of audio every 10 ms, the first after
    its simulated model delay), so the triton rows measure the bridge: our gRPC client, its
    buffering and re-framing, under concurrency, not a model.
    """
    python = ROOT / ".venv" / "triton" / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"no stand-in environment at {python}: run `make triton-standin`")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="cosyrtc-standin-") as workdir:
        with open(Path(workdir) / "server.log", "wb") as log:
            process = subprocess.Popen(
                [
                    python,
                    ROOT / "scripts" / "triton_standin.py",
                    f"--grpc-port={port}",
                    f"--workdir={workdir}/repo",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            yield f"127.0.0.1:{port}"
        finally:  # the server runs in a process group of its own, whose id is its pid
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(STANDIN_STOP_S)
            for region in Path("/dev/shm").glob(shm_prefix(process.pid) + "*"):
                region.unlink(missing_ok=True)


@contextlib.contextmanager
def triton_engine(url: str) -> Iterator[Any]:
    """The cosyvoice-triton engine connected to ``url``, as the server loads it."""
    registry = EngineRegistry.load(["cosyvoice-triton"], {"cosyvoice-triton": {"url": url}})
    try:
        engine: Any = registry.get("cosyvoice-triton")
        if not engine.wait_until_available(TRITON_READY_S):
            raise SystemExit(f"Triton at {url} is not available: {engine.unavailable_reason}")
        yield engine
    finally:
        registry.close()


if __name__ == "__main__":
    raise SystemExit(main())
