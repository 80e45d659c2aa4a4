"""The pipeline for an engine: a transform or a speak session, by what the engine does."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Executor
from typing import Any

from media.audio.opus import OpusEncoder
from media.engines.base import Engine, SpeakEngine, TransformEngine
from media.pipeline.base import Pipeline
from media.pipeline.events import EventSink
from media.pipeline.shared_vad import SharedVad
from media.pipeline.speak import SpeakPipeline
from media.pipeline.transform import TransformPipeline


async def create_pipeline(
    engine: Engine[Any],
    options: Mapping[str, Any],
    executor: Executor,
    encoder: OpusEncoder,
    emit: EventSink,
    session_id: str,
    vad: SharedVad | None = None,
) -> Pipeline:
    """A ready pipeline for one session of ``engine`` (its state made off the loop)."""
    if isinstance(engine, SpeakEngine):
        return await SpeakPipeline.create(engine, options, executor, encoder, emit, session_id, vad)
    if isinstance(engine, TransformEngine):
        return await TransformPipeline.create(engine, options, executor, encoder, session_id, emit)
    raise TypeError(f"engine {engine.name!r} is neither a transform nor a speak engine")
