"""Batched DeepFilterNet3 (``media.engines.dfn``) against per-session calls and the C library.

    .venv/bin/python -m bench.batching [--streams 1 2 4 8 16 32] [--hops 100] [--repeats 5]
                                       [--variant-streams 16] [--no-variants]

For each number of streams N, the CPU time of this process (``time.process_time``, ORT on one
thread) per stream and 10 ms hop of:

- ``model_batched``: the three graphs once for all N streams (batch N, states carried);
- ``model_per_session``: the same graphs called N times with batch 1, one stream each;
- ``hop_batched``: ``BatchedDeepFilter.process`` with all N slots: DSP, model, state commit;
- ``hop_per_session``: ``process`` N times with one slot each (a one-slot call runs its row
  twice, see ``MIN_BATCH``);
- ``c_library``: the ``denoise`` engine's ``df_process_frame``, N native states in turn.

Each figure is taken ``--repeats`` times over ``--hops`` hops after a warm-up, the measures
taking turns within each repeat; the table gives the median and p95 across repeats. Then the
variants: onnxruntime's optimisation levels and int8 dynamic quantisation (``quantize_dynamic``:
MatMul only, which here means the grouped linear layers, and every op type it quantises, which
adds the convolutions; it has no int8 GRU, where most of the arithmetic is), each with its
per-stream hop cost at ``--variant-streams`` streams (taking turns too) and its quality against
the C library on the noisy-speech fixture: the SNR of the difference and PESQ-WB against the
clean speech. Writes bench/results/batching.json and, when matplotlib is installed,
bench/results/batching.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import RESULTS, percentile, print_table, write_results
from media.engines import deepfilter
from media.engines.deepfilter import DeepFilterEngine, DeepFilterState
from media.engines.dfn import BatchedDeepFilter
from media.engines.dfn.graphs import DeepFilterModel, GraphSession, StreamingGraph, load_model
from peer.speech import add_white_noise, speech_with_pauses

HOP = 480
RATE = 48_000
DELAY = 1440  # 30 ms, both engines
WARM_UP_HOPS = 10
PESQ_RATE = 16_000
MEASURES = ("model_batched", "model_per_session", "hop_batched", "hop_per_session", "c_library")
QUANTISED = {"int8_matmul": ["MatMul"], "int8_all": None}  # None: every op type it quantises


def interleaved(
    steps: Mapping[str, Callable[[int], object]], streams: int, hops: int, repeats: int
) -> dict[str, list[float]]:
    """CPU microseconds per stream and hop of each ``step(hop)``, once per repeat.

    Each repeat runs every step in turn, so that whatever else the machine does at the
    time (its two cores are shared) weighs on all of them alike.
    """
    for step in steps.values():
        for hop in range(WARM_UP_HOPS):
            step(hop)
    samples: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            began = time.process_time()
            for hop in range(hops):
                step(hop)
            samples[name].append((time.process_time() - began) / hops / streams * 1e6)
    return samples


def signals(noisy: np.ndarray, streams: int, hops: int) -> np.ndarray:
    """[streams, hops, HOP] of the fixture, each stream from its own offset."""
    length = hops * HOP
    tiled = np.tile(noisy, length // noisy.size + 2)
    return np.stack([tiled[i * 37 * HOP :][:length] for i in range(streams)]).reshape(
        streams, hops, HOP
    )


class ModelOnly:
    """The three graphs as ``BatchedDeepFilter`` runs them, features given, states carried;
    the sessions (the weights) are shared, as per-session calls in one process would."""

    def __init__(self, sessions: Sequence[GraphSession], batch: int) -> None:
        self._sessions = sessions
        self._states = [self._zeros(session.graph, batch) for session in sessions]
        rng = np.random.default_rng(5)
        self._erb = (rng.standard_normal((batch, 1, 1, 32)) * 0.5).astype(np.float32)
        self._spec = (rng.standard_normal((batch, 2, 1, 96)) * 0.5).astype(np.float32)

    @staticmethod
    def _zeros(graph: StreamingGraph, batch: int) -> dict[str, np.ndarray]:
        return {spec.input: np.zeros((batch, *spec.shape), np.float32) for spec in graph.states}

    def step(self) -> None:
        encoded = self._run(0, feat_erb=self._erb, feat_spec=self._spec)
        e0, e1, e2, e3, emb, c0 = encoded
        self._run(1, emb=emb, e3=e3, e2=e2, e1=e1, e0=e0)
        self._run(2, emb=emb, c0=c0)

    def _run(self, index: int, **inputs: np.ndarray) -> list[np.ndarray]:
        session = self._sessions[index]
        outputs, states = session.run({**inputs, **self._states[index]})
        self._states[index] = {
            spec.input: value for spec, value in zip(session.graph.states, states, strict=True)
        }
        return outputs


def measure_streams(
    model: DeepFilterModel,
    engine: DeepFilterEngine,
    c_states: Sequence[DeepFilterState],
    noisy: np.ndarray,
    streams: int,
    args: argparse.Namespace,
) -> dict[str, list[float]]:
    total_hops = WARM_UP_HOPS + args.hops
    audio = signals(noisy, streams, total_hops)
    sessions = [GraphSession(graph) for graph in model.graphs]
    batched = ModelOnly(sessions, streams)
    singles = [ModelOnly(sessions, 1) for _ in range(streams)]
    filt = BatchedDeepFilter(capacity=max(2, streams), max_capacity=max(2, streams), model=model)
    slots = [filt.open_slot() for _ in range(streams)]

    def each_model(hop: int) -> None:
        for single in singles:
            single.step()

    def each_hop(hop: int) -> None:
        for index, slot in enumerate(slots):
            filt.process([slot], audio[index, hop % total_hops][None])

    def each_native(hop: int) -> None:
        for index, state in enumerate(c_states[:streams]):
            engine.process(state, audio[index, hop % total_hops])

    steps: dict[str, Callable[[int], object]] = {
        "model_batched": lambda hop: batched.step(),
        "model_per_session": each_model,
        "hop_batched": _batched_step(filt, slots, audio),
        "hop_per_session": each_hop,
        "c_library": each_native,
    }
    return interleaved(steps, streams, args.hops, args.repeats)


def quantised(model: DeepFilterModel, op_types: list[str] | None) -> DeepFilterModel:
    """``model`` with int8 weights (``quantize_dynamic``) for ``op_types``."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    def one(graph: StreamingGraph) -> StreamingGraph:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / f"{graph.name}.onnx"
            quantize_dynamic(
                graph.model, path, op_types_to_quantize=op_types, weight_type=QuantType.QInt8
            )
            return dataclasses.replace(graph, model=onnx.load(str(path)))

    return dataclasses.replace(
        model,
        encoder=one(model.encoder),
        erb_decoder=one(model.erb_decoder),
        df_decoder=one(model.df_decoder),
    )


def difference_snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    reference = reference.astype(np.float64)
    error = other.astype(np.float64) - reference
    return float(10 * np.log10(np.sum(reference**2) / max(np.sum(error**2), 1e-30)))


def pesq_wb(clean: np.ndarray, denoised: np.ndarray) -> float | None:
    """PESQ-WB of the delay-aligned output against the clean speech; None without ``pesq``."""
    try:
        from pesq import pesq
    except ImportError:
        return None
    import soxr

    reference = soxr.resample(clean[: clean.size - DELAY], RATE, PESQ_RATE)
    degraded = soxr.resample(denoised[DELAY:], RATE, PESQ_RATE)
    return round(float(pesq(PESQ_RATE, reference, degraded, "wb")), 3)


def denoise_alone(filt: BatchedDeepFilter, noisy: np.ndarray) -> np.ndarray:
    slot = filt.open_slot()
    out = np.concatenate([filt.process([slot], hop[None])[0] for hop in noisy.reshape(-1, HOP)])
    filt.close_slot(slot)
    return out


def _batched_step(
    filt: BatchedDeepFilter, slots: list[int], audio: np.ndarray
) -> Callable[[int], object]:
    return lambda hop: filt.process(slots, audio[:, hop % audio.shape[1]])


def measure_variants(
    model: DeepFilterModel,
    noisy: np.ndarray,
    clean: np.ndarray,
    reference: np.ndarray,
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    """Per-stream hop cost and quality of each optimisation level and quantisation."""
    streams = args.variant_streams
    audio = signals(noisy, streams, WARM_UP_HOPS + args.hops)
    variants: list[tuple[str, DeepFilterModel, str]] = [
        (f"float32 opt={level}", model, level) for level in ("disable", "basic", "extended", "all")
    ]
    variants += [(name, quantised(model, ops), "all") for name, ops in QUANTISED.items()]
    filters = {}
    for name, variant, level in variants:
        filt = BatchedDeepFilter(capacity=streams, max_capacity=streams, optimization=level,
                                 model=variant)  # fmt: skip
        filters[name] = (filt, [filt.open_slot() for _ in range(streams)])
    steps = {name: _batched_step(filt, slots, audio) for name, (filt, slots) in filters.items()}
    costs = interleaved(steps, streams, args.hops, args.repeats)
    rows = []
    for name, (filt, slots) in filters.items():
        for slot in slots:
            filt.close_slot(slot)
        out = denoise_alone(filt, noisy)
        rows.append(
            {
                "variant": name,
                "streams": streams,
                "hop_us_median": percentile(costs[name], 50),
                "hop_us_p95": percentile(costs[name], 95),
                "snr_vs_c_db": round(difference_snr_db(reference, out), 1),
                "pesq_wb": pesq_wb(clean, out),
            }
        )
    return rows


def plot(rows: Sequence[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 5))
    streams = [row["streams"] for row in rows]
    for measure in MEASURES:
        axis.plot(streams, [row[f"{measure}_us"] for row in rows], marker="o", label=measure)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("streams")
    axis.set_ylabel("CPU per stream and 10 ms hop (us, median)")
    axis.legend()
    axis.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--hops", type=int, default=100, help="hops per repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--variant-streams", type=int, default=16)
    parser.add_argument("--no-variants", action="store_true")
    args = parser.parse_args()

    fixture = speech_with_pauses()
    noisy = add_white_noise(fixture.clean, snr_db=5.0)
    noisy = noisy[: noisy.size // HOP * HOP]
    clean = fixture.clean[: noisy.size]
    model = load_model()
    engine = deepfilter.load(pool_size=0)
    try:
        reference_state = engine.new_state(engine.validate_options({}))
        reference = engine.process(reference_state, noisy)[0]
        engine.close_state(reference_state)
        c_states = [engine.new_state(engine.validate_options({})) for _ in range(max(args.streams))]
        rows = []
        for streams in args.streams:
            samples = measure_streams(model, engine, c_states, noisy, streams, args)
            row: dict[str, Any] = {"streams": streams}
            for measure in MEASURES:
                row[f"{measure}_us"] = percentile(samples[measure], 50)
                row[f"{measure}_us_p95"] = percentile(samples[measure], 95)
            row["speedup_vs_c"] = round(row["c_library_us"] / row["hop_batched_us"], 2)
            rows.append(row)
            print(row, flush=True)
        for state in c_states:
            engine.close_state(state)
        c_pesq = pesq_wb(clean, reference)
        per_session_bytes = engine.per_session_bytes
    finally:
        engine.close()
    variants = [] if args.no_variants else measure_variants(model, noisy, clean, reference, args)
    batched_bytes = BatchedDeepFilter(model=model).bytes_per_stream

    columns = ["streams"] + [f"{m}_us{q}" for m in MEASURES for q in ("", "_p95")]
    print()
    print_table(rows, [*columns, "speedup_vs_c"])
    if variants:
        print()
        shown = [{**row, "pesq_wb": f"{row['pesq_wb']:.3f}"} for row in variants]
        print_table(shown, list(variants[0]))
    print(f"\nC library PESQ-WB {c_pesq}; bytes per stream: batched {batched_bytes}, "
          f"C {per_session_bytes}")  # fmt: skip
    results = write_results(
        "batching",
        {
            "benchmark": "batching",
            "command": " ".join(["python -m bench.batching", *sys.argv[1:]]),
            "machine": platform.platform(),
            "cores": os.cpu_count(),
            "hops_per_repeat": args.hops,
            "repeats": args.repeats,
            "clock": "time.process_time of this process, onnxruntime on one thread",
            "rows": rows,
            "variants": variants,
            "c_library_pesq_wb": c_pesq,
            "bytes_per_stream": {"batched": batched_bytes, "c_library": per_session_bytes},
        },
    )
    print(f"wrote {results}")
    try:
        plot(rows, RESULTS / "batching.png")
        print(f"wrote {RESULTS / 'batching.png'}")
    except ImportError:
        print("matplotlib is not installed: no plot")
    return 0


if __name__ == "__main__":
    sys.exit(main())
