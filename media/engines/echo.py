"""``echo``: the identity transform, for diagnostics and latency baselines."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from media.engines.base import EngineKind, TransformEngine
from media.engines.plugin import EnginePlugin

ECHO_RATE = 48_000


class EchoEngine(TransformEngine[None]):
    """Returns every chunk unchanged, so a call measures the media path and nothing else."""

    def __init__(self) -> None:
        super().__init__(
            name="echo",
            kind=EngineKind.TRANSFORM,
            sample_rate=ECHO_RATE,
            hop_size=1,
            delay_ms=0.0,
            description="Returns the caller's audio unchanged (diagnostics, latency baseline).",
            runs_inline=True,
        )

    def new_state(self, options: Mapping[str, Any]) -> None:
        return None

    def process(self, state: None, chunk: np.ndarray) -> tuple[np.ndarray, None]:
        return chunk, state

    def flush(self, state: None) -> np.ndarray:
        return np.zeros(0, dtype=np.float32)


PLUGIN = EnginePlugin("echo", load=lambda settings: EchoEngine())
