"""A tiny random CosyVoice2 model directory, built once per run, and the engines on it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="run `make cosyvoice` for the CosyVoice tests")
pytest.importorskip("cosyvoice", reason="run `make cosyvoice` for the CosyVoice tests")

from media.engines.cosyvoice.speak import CosyVoiceEngine
from media.engines.cosyvoice.vc import CosyVoiceVcEngine
from media.engines.registry import EngineRegistry
from scripts.make_tiny_cosyvoice import build

# ~30 text tokens: ~60 speech tokens (2.4 s of audio), three or four chunks.
SENTENCE = "Hello there, this is a longer sentence to check streaming of chunks."


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("tiny-cosyvoice"))


@pytest.fixture(scope="session")
def cosyvoice_registry(tiny_model_dir: Path) -> Iterator[EngineRegistry]:
    """The registry the server gets, with the CosyVoice loaders pointed at the tiny model."""
    settings = {"cosyvoice": {"model": str(tiny_model_dir)}}
    registry = EngineRegistry.load(["echo", "cosyvoice", "cosyvoice-vc"], settings=settings)
    assert not registry.unavailable, registry.unavailable
    yield registry
    registry.close()


@pytest.fixture(scope="session")
def speak_engine(cosyvoice_registry: EngineRegistry) -> CosyVoiceEngine:
    engine = cosyvoice_registry.get("cosyvoice")
    assert isinstance(engine, CosyVoiceEngine)
    return engine


@pytest.fixture(scope="session")
def sequential_engine(speak_engine: CosyVoiceEngine) -> CosyVoiceEngine:
    """The same model with each utterance alone in its own threads (batching off)."""
    return CosyVoiceEngine(speak_engine.model, speak_engine.context_tokens, speak_engine.chunk)


@pytest.fixture(params=["batched", "sequential"])
def either_engine(
    request: pytest.FixtureRequest,
    speak_engine: CosyVoiceEngine,
    sequential_engine: CosyVoiceEngine,
) -> CosyVoiceEngine:
    """The registry's engine (batched, the default) and the sequential one, in turn."""
    assert speak_engine.batcher is not None
    return speak_engine if request.param == "batched" else sequential_engine


@pytest.fixture(scope="session")
def vc_engine(cosyvoice_registry: EngineRegistry) -> CosyVoiceVcEngine:
    engine = cosyvoice_registry.get("cosyvoice-vc")
    assert isinstance(engine, CosyVoiceVcEngine)
    return engine
