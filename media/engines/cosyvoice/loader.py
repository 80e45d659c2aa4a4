"""Settings and loading for the CosyVoice engines: one model per process, shared by both.

Both engines read the ``cosyvoice`` settings namespace (``--engine-setting
cosyvoice.model=DIR``, ``COSYRTC_ENGINE_COSYVOICE_MODEL``; ``--cosyvoice-model`` is the
same setting). The first of them to load reads the model directory, the second reuses it,
and each engine gives it back on ``close``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from media.engines.base import EngineUnavailable
from media.engines.plugin import EnginePlugin, EngineSetting, parse_switch

log = logging.getLogger(__name__)

ENABLE_HINT = (
    "install it with `make cosyvoice` and point --cosyvoice-model (or --engine-setting "
    "cosyvoice.model=DIR, COSYRTC_ENGINE_COSYVOICE_MODEL) at a CosyVoice2 model directory"
)
WARM_UP_TEXT = "Hi."


@dataclass(frozen=True)
class CosyVoiceSettings:
    """Where the model and (optionally) an upstream checkout are, and how to run them."""

    model_dir: Path | None = None
    src_path: Path | None = None  # an upstream CosyVoice checkout instead of the package
    device: str = "cpu"
    # Left context of each flow call, in speech tokens; None re-runs the flow over the whole
    # utterance for every chunk, as upstream does (see flow_window.py).
    flow_context_tokens: int | None = 100
    # One worker per model runs every utterance's LLM steps and hops in batches (batcher.py);
    # off: each utterance runs alone in its own threads.
    batching: bool = True
    # torch's intra-op threads for the process (0: torch's default, one per core). One: the
    # sessions (or the batch worker) already keep the cores busy, and splitting the small
    # ops of a step across threads costs more than it saves (tiny model, 2 cores: an LLM
    # step for 8 utterances 0.9 ms on one thread, 2.7 ms on two).
    threads: int = 1
    # Which convolution kernels torch runs on a CPU (``use_cpu_convolutions``).
    cpu_convolutions: str = "native"
    # How the batched LLM step runs (batch_llm.py): dynamic (a CPU's fastest), static, or
    # graph (the static step as a CUDA graph: a CUDA device only).
    llm_step: str = "dynamic"
    # What the LLM and the flow compute in (modeldir.LoadedModel.precision): float32, or
    # bfloat16 / float16 (the LLM's weights in it, the flow under autocast), as CosyVoice's
    # own runtime runs them on a GPU.
    precision: str = "float32"
    # Batch loops on a CPU device: the first in this process, each further one in a process
    # of its own (loop_process.py), utterances placed on the least-loaded.
    batch_loops: int = 1


CPU_CONVOLUTIONS = ("native", "onednn")
LLM_STEPS = ("dynamic", "static", "graph")
PRECISIONS = ("float32", "bfloat16", "float16")
_lock = threading.Lock()
_shared: dict[CosyVoiceSettings, tuple[Any, int]] = {}  # settings -> (LoadedModel, users)


def _context_tokens(raw: str) -> int | None:
    if raw.lower() == "none":
        return None
    tokens = int(raw)
    if tokens < 1:
        raise ValueError("a number of speech tokens (at least 1), or none")
    return tokens


def _one_of(choices: tuple[str, ...]) -> Callable[[str], str]:
    """A setting's parser that takes one of ``choices``, as written."""

    def parse(raw: str) -> str:
        if raw not in choices:
            raise ValueError(f"one of {', '.join(choices)}")
        return raw

    return parse


def _loops(raw: str) -> int:
    loops = int(raw)
    if loops < 1:
        raise ValueError("a number of batch loops, at least 1")
    return loops


def _threads(raw: str) -> int:
    threads = int(raw)
    if threads < 0:
        raise ValueError("a number of threads, or 0 for one per core")
    return threads


SETTINGS = (
    EngineSetting("model", "CosyVoice2 model directory (enables the engines)", None, Path),
    EngineSetting(
        "src", "upstream CosyVoice checkout to import instead of the package", None, Path
    ),
    EngineSetting("device", "torch device: cpu, cuda, cuda:1, ...", "cpu", str),
    EngineSetting(
        "flow_context_tokens",
        "left context of each flow call in speech tokens, or none (whole utterance)",
        100,
        _context_tokens,
    ),
    EngineSetting("threads", "torch intra-op threads (0: one per core)", 1, _threads),
    EngineSetting(
        "cpu_convolutions",
        "convolution kernels on a CPU: native (torch's own) or onednn",
        "native",
        _one_of(CPU_CONVOLUTIONS),
    ),
    EngineSetting(
        "llm_step",
        "the batched LLM step: dynamic, static (constant shapes) or graph (a CUDA graph)",
        "dynamic",
        _one_of(LLM_STEPS),
    ),
    EngineSetting(
        "precision",
        "what the LLM and flow compute in: float32, bfloat16 or float16",
        "float32",
        _one_of(PRECISIONS),
    ),
    EngineSetting(
        "batch_loops",
        "batch loops on a CPU, each after the first in a process of its own",
        1,
        _loops,
    ),
    EngineSetting(
        "batching",
        "run all utterances in one batched worker (on) or each alone (off)",
        True,
        parse_switch,
    ),
)


def settings_from(values: Mapping[str, Any]) -> CosyVoiceSettings:
    """The parsed ``cosyvoice`` namespace as the loader's settings."""
    return CosyVoiceSettings(
        model_dir=values.get("model"),
        src_path=values.get("src"),
        device=values.get("device", "cpu"),
        flow_context_tokens=values.get("flow_context_tokens", 100),
        batching=values.get("batching", True),
        threads=values.get("threads", 1),
        cpu_convolutions=values.get("cpu_convolutions", "native"),
        llm_step=values.get("llm_step", "dynamic"),
        precision=values.get("precision", "float32"),
        batch_loops=values.get("batch_loops", 1),
    )


def acquire(settings: CosyVoiceSettings) -> Any:
    """The loaded model for ``settings``, loading it on first use."""
    from media.engines.cosyvoice.modeldir import load_model, missing_files
    from media.engines.cosyvoice.upstream import UpstreamMissing, import_upstream

    if settings.model_dir is None:
        raise EngineUnavailable(f"CosyVoice has no model directory: {ENABLE_HINT}")
    missing = missing_files(settings.model_dir)
    if missing:
        raise EngineUnavailable(
            f"{settings.model_dir} is not a CosyVoice2 model directory (missing "
            f"{', '.join(missing)}): {ENABLE_HINT}"
        )
    with _lock:
        if settings in _shared:
            model, users = _shared[settings]
            _shared[settings] = (model, users + 1)
            return model
        try:
            upstream = import_upstream(settings.src_path)
        except UpstreamMissing as exc:
            raise EngineUnavailable(f"{exc}; {ENABLE_HINT}") from exc
        if settings.threads:
            upstream.torch.set_num_threads(settings.threads)
        if settings.device == "cpu":
            use_cpu_convolutions(upstream.torch, settings.cpu_convolutions)
        precision = None
        if settings.precision != "float32":
            precision = getattr(upstream.torch, settings.precision)
        model = load_model(upstream, settings.model_dir, settings.device, precision)
        log.info(
            "CosyVoice model %s loaded on %s (modules from %s)",
            settings.model_dir,
            settings.device,
            upstream.source,
        )
        _shared[settings] = (model, 1)
        return model


def use_cpu_convolutions(torch: Any, kernels: str) -> None:
    """Pick the convolution kernels torch runs on a CPU, for the whole process.

    torch's default on x86 is oneDNN, which compiles a kernel for every new input shape and
    keeps ~1000 of them. The flow and HiFT see a new shape for every batch size, window
    length and final hop, and a HiFT call holds ~40 convolutions, so a busy server keeps
    evicting and recompiling: a HiFT call on the tiny model costs 16 ms warm and 24-28 ms
    with its shape new or evicted (after 120 other shapes). torch's own kernels (im2col and
    a matrix product) have no per-shape cost and, for these small convolutions, less per
    call: first audio of one utterance 72 -> 58 ms, eight at once ~190 -> 168 ms
    (``bench/cosyvoice.py``). NNPACK, which torch picks from a batch of 16, is off too: it
    made the flow's 16-row convolutions (8 hops, both guidance halves) 2.5x slower.
    These switches are process-wide; the CosyVoice engines are the server's only torch users.
    """
    enabled = kernels == "onednn"
    torch.backends.mkldnn.enabled = enabled
    torch.backends.nnpack.set_flags(enabled)


def release(settings: CosyVoiceSettings) -> None:
    """Give back a model from ``acquire``; the last user's release frees it."""
    with _lock:
        model, users = _shared.get(settings, (None, 0))
        if users <= 1:
            _shared.pop(settings, None)
        else:
            _shared[settings] = (model, users - 1)


def _chunk_tokens(model: Any) -> int:
    """The decoder's attention chunk in speech tokens (the hop grid), 25 when unset."""
    from media.engines.cosyvoice.schedule import CHUNK_TOKENS

    frames = getattr(model.flow.decoder.estimator, "static_chunk_size", 0)
    return max(1, frames // model.flow.token_mel_ratio) if frames else CHUNK_TOKENS


def load_speak(values: Mapping[str, Any]) -> Any:
    """The ``cosyvoice`` speak engine, warmed up with one short utterance; with
    ``batch_loops`` above 1, its further loops' processes loading beside it."""
    settings = settings_from(values)
    if settings.llm_step == "graph" and not settings.device.startswith("cuda"):
        raise EngineUnavailable(
            f"cosyvoice.llm_step=graph needs a CUDA device (cosyvoice.device is {settings.device})"
        )
    if settings.batch_loops > 1 and (settings.device != "cpu" or not settings.batching):
        raise EngineUnavailable(
            "cosyvoice.batch_loops above 1 is for batching on a CPU device (one loop per GPU)"
        )
    from media.engines.cosyvoice.loop_process import LoopProcess

    loops = [LoopProcess(values) for _ in range(settings.batch_loops - 1)]
    try:
        engine = load_batched_engine(values)
        for loop in loops:
            loop.wait_ready()
    except BaseException:
        for loop in loops:
            loop.close()
        raise
    engine.add_loops(loops)
    return engine


def load_batched_engine(values: Mapping[str, Any]) -> Any:
    """The engine with its model and (unless batching is off) one batch loop, warmed up."""
    settings = settings_from(values)
    model = acquire(settings)
    from media.engines.cosyvoice.batcher import CosyVoiceBatcher
    from media.engines.cosyvoice.speak import CosyVoiceEngine

    chunk, context = _chunk_tokens(model), settings.flow_context_tokens
    batcher = (
        CosyVoiceBatcher(model, context, chunk, llm_step=settings.llm_step)
        if settings.batching
        else None
    )
    engine = CosyVoiceEngine(model, context, chunk, batcher)

    def close() -> None:
        engine.shutdown()
        release(settings)

    engine.close = close  # type: ignore[method-assign]
    state = engine.new_state(engine.validate_options({"seed": 0}))
    for _ in engine.synthesize(state, WARM_UP_TEXT, threading.Event()):
        pass
    return engine


def load_vc(values: Mapping[str, Any]) -> Any:
    """The ``cosyvoice-vc`` transform engine."""
    settings = settings_from(values)
    model = acquire(settings)
    from media.engines.cosyvoice.vc import CosyVoiceVcEngine

    engine = CosyVoiceVcEngine(model)

    def close() -> None:
        engine.shutdown()
        release(settings)

    engine.close = close  # type: ignore[method-assign]
    return engine


SPEAK_PLUGIN = EnginePlugin("cosyvoice", load_speak, SETTINGS, namespace="cosyvoice", hostable=True)
VC_PLUGIN = EnginePlugin("cosyvoice-vc", load_vc, SETTINGS, namespace="cosyvoice")
