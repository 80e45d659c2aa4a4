"""The engines a server process loads at start-up, from its settings."""

from __future__ import annotations

from media.engines.registry import EngineRegistry
from server.config import Settings


def load_engines(settings: Settings) -> EngineRegistry:
    """Every engine this installation can run, with optional ones pointed at their files."""
    from media.engines.cosyvoice.loader import configure

    configure(model_dir=settings.cosyvoice_model, src_path=settings.cosyvoice_src)
    return EngineRegistry.load()
