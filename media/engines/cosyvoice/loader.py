"""Settings and loading for the CosyVoice engines: one model per process, shared by both.

The server calls ``configure`` with its settings before loading engines (no module reads the
environment); the registry then calls ``load_speak`` and ``load_vc``. The first of them loads
the model directory, the second reuses it, and each engine gives it back on ``close``.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from media.engines.base import EngineUnavailable

log = logging.getLogger(__name__)

ENABLE_HINT = (
    "install it with `make cosyvoice` and point --cosyvoice-model (COSYRTC_COSYVOICE_MODEL) "
    "at a CosyVoice2 model directory"
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


_lock = threading.Lock()
_settings = CosyVoiceSettings()
_shared: dict[CosyVoiceSettings, tuple[Any, int]] = {}  # settings -> (LoadedModel, users)


def configure(
    model_dir: str | Path | None = None,
    src_path: str | Path | None = None,
    device: str = "cpu",
    flow_context_tokens: int | None = 100,
) -> CosyVoiceSettings:
    """Set what the next ``load_speak``/``load_vc`` load; returns the settings in force."""
    global _settings
    settings = CosyVoiceSettings(
        model_dir=Path(model_dir) if model_dir is not None else None,
        src_path=Path(src_path) if src_path is not None else None,
        device=device,
        flow_context_tokens=flow_context_tokens,
    )
    with _lock:
        _settings = settings
    return settings


def current_settings() -> CosyVoiceSettings:
    with _lock:
        return _settings


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
        model = load_model(upstream, settings.model_dir, settings.device)
        log.info(
            "CosyVoice model %s loaded on %s (modules from %s)",
            settings.model_dir,
            settings.device,
            upstream.source,
        )
        _shared[settings] = (model, 1)
        return model


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


def load_speak() -> Any:
    """The ``cosyvoice`` speak engine, warmed up with one short utterance."""
    settings = current_settings()
    model = acquire(settings)
    from media.engines.cosyvoice.speak import CosyVoiceEngine

    engine = CosyVoiceEngine(model, settings.flow_context_tokens, _chunk_tokens(model))
    engine.close = lambda: release(settings)  # type: ignore[method-assign]
    state = engine.new_state(engine.validate_options({"seed": 0}))
    for _ in engine.synthesize(state, WARM_UP_TEXT, threading.Event()):
        pass
    return engine


def load_vc() -> Any:
    """The ``cosyvoice-vc`` transform engine."""
    settings = current_settings()
    model = acquire(settings)
    from media.engines.cosyvoice.vc import CosyVoiceVcEngine

    engine = CosyVoiceVcEngine(model)
    engine.close = lambda: (engine.shutdown(), release(settings))  # type: ignore[method-assign]
    return engine
