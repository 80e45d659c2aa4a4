"""How a package ships an engine: an :class:`EnginePlugin` named by a ``cosyrtc.engines``
entry point.

    # pyproject.toml of the package
    [project.entry-points."cosyrtc.engines"]
    pitch = "cosyrtc_pitch:PLUGIN"

    # cosyrtc_pitch/__init__.py
    PLUGIN = EnginePlugin("pitch", load=lambda settings: PitchEngine(settings["semitones"]),
                          settings=(EngineSetting("semitones", "shift", 0.0, float),))

The server loads every installed plugin at start-up (or those ``--engines`` names), each
with the settings of its namespace: ``--engine-setting pitch.semitones=3`` or
``COSYRTC_ENGINE_PITCH_SEMITONES=3``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from media.engines.base import Engine, EngineError


class EngineSettingsError(EngineError):
    """A setting for an engine that it does not have, or whose value it refuses."""


def parse_switch(raw: str) -> bool:
    """An on/off setting as operators write it (true/false, on/off, yes/no, 1/0)."""
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError("true or false")


@dataclass(frozen=True)
class EngineSetting:
    """One setting an engine takes at load time, as the operator writes it (a string)."""

    key: str
    description: str
    default: Any = None
    parse: Callable[[str], Any] = str  # raises ValueError saying what a good value is


@dataclass(frozen=True)
class EnginePlugin:
    """What an entry point of ``cosyrtc.engines`` names: how to load one engine."""

    name: str
    load: Callable[[Mapping[str, Any]], Engine[Any]]  # the parsed settings -> the engine
    settings: tuple[EngineSetting, ...] = ()
    # Engines of one package may share a namespace (``cosyvoice`` and ``cosyvoice-vc``
    # read the same model directory); None: the engine's name.
    namespace: str | None = None
    # An engine (speak, or a batched transform) whose model may live in a model host
    # process, served to the media workers through ``media.engines.hosted``; the others
    # load in every worker.
    hostable: bool = False
    # A hostable engine the host runs unless ``--host-engines`` says otherwise.
    hosted_by_default: bool = True

    @property
    def settings_namespace(self) -> str:
        return self.namespace or self.name

    def parse_settings(self, raw: Mapping[str, str]) -> dict[str, Any]:
        """Defaults overlaid with ``raw``, each value parsed; unknown keys are refused."""
        known = {setting.key: setting for setting in self.settings}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise EngineSettingsError(
                f"engine setting {self.settings_namespace}.{unknown[0]} does not exist "
                f"(engine {self.name} takes: {', '.join(known) or 'none'})"
            )
        parsed = {key: setting.default for key, setting in known.items()}
        for key, value in raw.items():
            try:
                parsed[key] = known[key].parse(value)
            except ValueError as exc:
                raise EngineSettingsError(
                    f"engine setting {self.settings_namespace}.{key}={value!r}: {exc}"
                ) from exc
        return parsed
