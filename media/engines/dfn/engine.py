"""``denoise``: DeepFilterNet3 for every session of the worker in one model call per hop.

Sessions hand their audio to a tick scheduler (``media.engines.batching``) that runs the
hops of every session with audio waiting as one :class:`BatchedDeepFilter` step. The model
is the one libDF runs (``denoise-libdf``), to 132 dB SNR of the difference; a session's
state is a slot of the batch arrays (~46 kB), so opening one takes microseconds and needs no
warm pool, and its memory is a tiny fraction of a native state's ~10 MB.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from media.engines.base import (
    BatchedTransformEngine,
    Capabilities,
    EngineKind,
    EngineUnavailable,
)
from media.engines.batching import DEFAULT_MAX_WAIT_S, TickScheduler
from media.engines.deepfilter import DELAY_MS, DENOISE_OPTIONS, SAMPLE_RATE
from media.engines.dfn.batch import DEFAULT_MAX_CAPACITY, BatchedDeepFilter
from media.engines.plugin import EnginePlugin, EngineSetting

NAME = "denoise"


@dataclass(eq=False)
class DenoiseState:
    slot: int
    options: dict[str, Any]
    pending: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))


class _Steps:
    """The model as the scheduler drives it: ``hop`` and ``process``."""

    def __init__(self, model: BatchedDeepFilter) -> None:
        self.hop = model.hop_size
        self.process = model.process


class BatchedDenoiseEngine(BatchedTransformEngine[DenoiseState]):
    def __init__(self, model: BatchedDeepFilter, max_wait_s: float = DEFAULT_MAX_WAIT_S):
        self._model = model
        self._scheduler = TickScheduler(_Steps(model), max_wait_s=max_wait_s, name="denoise")
        super().__init__(
            name=NAME,
            kind=EngineKind.TRANSFORM,
            sample_rate=SAMPLE_RATE,
            hop_size=model.hop_size,
            delay_ms=DELAY_MS,
            description=(
                "DeepFilterNet3 noise suppression (full band, 48 kHz, 30 ms delay), every "
                "session in one model call per 10 ms hop."
            ),
            option_specs=DENOISE_OPTIONS,
            capabilities=Capabilities(batched=True),
        )

    @property
    def scheduler(self) -> TickScheduler:
        return self._scheduler

    def describe(self) -> dict[str, Any]:
        """The base description plus the memory one more session costs."""
        return {**super().describe(), "per_session_bytes": self._model.bytes_per_stream}

    def new_state(self, options: Mapping[str, Any]) -> DenoiseState:
        slot = self._model.open_slot(options["atten_lim_db"], options["post_filter_beta"])
        self._scheduler.join(slot)
        return DenoiseState(slot, dict(options))

    def submit(self, state: DenoiseState, chunk: np.ndarray) -> Future[np.ndarray]:
        samples = np.concatenate([state.pending, np.asarray(chunk, np.float32)])
        whole = len(samples) // self.hop_size * self.hop_size
        state.pending = samples[whole:].copy()
        hops = samples[:whole].reshape(-1, self.hop_size)
        return self._scheduler.submit(state.slot, hops)

    def flush(self, state: DenoiseState) -> np.ndarray:
        """What is short of a hop is not enough for the model; the stream ends there."""
        state.pending = np.zeros(0, np.float32)
        return np.zeros(0, np.float32)

    def reset_state(self, state: DenoiseState, options: Mapping[str, Any]) -> DenoiseState:
        """The same slot, fresh: the other sessions' rows are not touched."""
        with self._scheduler.model_lock:
            self._model.reset_slot(state.slot)
        state.pending = np.zeros(0, np.float32)
        return state

    def close_state(self, state: DenoiseState) -> None:
        """Rounds stop taking the slot's hops, then the slot is freed between two steps
        (a step already under way for it ends first, at most one batch call)."""
        self._scheduler.leave(state.slot)
        with self._scheduler.model_lock:
            self._model.close_slot(state.slot)

    def close(self) -> None:
        self._scheduler.close()


def load(settings: Mapping[str, Any]) -> BatchedDenoiseEngine:
    try:
        model = BatchedDeepFilter(max_capacity=settings["max_streams"], threads=settings["threads"])
    except (ImportError, OSError, RuntimeError, ValueError) as exc:
        # ValueError: a graph that cannot be edited for explicit state (another model).
        raise EngineUnavailable(f"DeepFilterNet3's ONNX graphs did not load ({exc})") from exc
    return BatchedDenoiseEngine(model, max_wait_s=settings["max_wait_ms"] / 1000)


def _positive_int(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise ValueError("must be at least 1")
    return value


def _wait_ms(raw: str) -> float:
    value = float(raw)
    if not 0 <= value <= 20:
        raise ValueError("0-20 ms: longer than two hops would make every session late")
    return value


PLUGIN = EnginePlugin(
    NAME,
    load,
    hostable=True,
    # On a CPU one host's batch loop (one thread, one interpreter lock for every worker's
    # sessions) held no more calls than a loop per worker, at more CPU per call (the frame
    # to another process and back): bench.capacity --servers workers workers-hosted, two
    # workers on two cores, held 20 / 12 in one run and 12 / 12 in a slower one; so it is
    # hosted when asked (--host-engines denoise), where one copy for all workers pays.
    hosted_by_default=False,
    settings=(
        EngineSetting(
            "max_wait_ms",
            "how long a session's hop may wait for other sessions' to share a step",
            DEFAULT_MAX_WAIT_S * 1000,
            _wait_ms,
        ),
        EngineSetting("threads", "onnxruntime threads per model call", 1, _positive_int),
        EngineSetting(
            "max_streams",
            "sessions the batch arrays may grow to",
            DEFAULT_MAX_CAPACITY,
            _positive_int,
        ),
    ),
)
