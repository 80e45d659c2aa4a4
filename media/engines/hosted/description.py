"""How the host describes an engine in its hello, and what a worker reads back of it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from media.engines.base import Engine, OptionSpec


def describe_for_host(engine: Engine[Any]) -> dict[str, Any]:
    """What a hosted engine needs of ``engine`` to serve as it does (the hello's entry)."""
    return {
        "name": engine.name,
        "kind": engine.kind.value,
        "sample_rate": engine.sample_rate,
        "hop_size": engine.hop_size,
        "delay_ms": engine.delay_ms,
        "description": engine.description,
        "voice_prompt": engine.capabilities.voice_prompt,
        "languages": list(engine.capabilities.languages),
        "options": [
            {
                "name": spec.name,
                "type": spec.type,
                "default": spec.default,
                "description": spec.description,
                "minimum": spec.minimum,
                "maximum": spec.maximum,
                "choices": list(spec.choices) if spec.choices is not None else None,
            }
            for spec in engine.option_specs
        ],
    }


def option_spec(described: Mapping[str, Any]) -> OptionSpec:
    """An option as the host describes it (the fields of :class:`OptionSpec`)."""
    choices = described.get("choices")
    return OptionSpec(
        name=str(described["name"]),
        type=str(described["type"]),
        default=described["default"],
        description=str(described["description"]),
        minimum=described.get("minimum"),
        maximum=described.get("maximum"),
        choices=tuple(choices) if choices is not None else None,
    )
