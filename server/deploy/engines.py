"""The engines a server process loads at start-up, from its settings."""

from __future__ import annotations

from media.engines.registry import EngineRegistry, EngineSettingsError, UnknownEngine, plan
from server.config import Settings, SettingsError

# Flags that predate engine settings, and the settings they are.
COSYVOICE_NAMESPACE = "cosyvoice"


def engine_settings(settings: Settings) -> dict[str, dict[str, str]]:
    """Each namespace's raw settings; ``--cosyvoice-model``/``-src`` fill cosyvoice's."""
    grouped: dict[str, dict[str, str]] = {}
    aliases = {"model": settings.cosyvoice_model, "src": settings.cosyvoice_src}
    for key, value in aliases.items():
        if value is not None:
            grouped.setdefault(COSYVOICE_NAMESPACE, {})[key] = value
    for namespace, key, value in settings.engine_settings:
        grouped.setdefault(namespace, {})[key] = value
    return grouped


def load_engines(settings: Settings) -> EngineRegistry:
    """The engines ``--engines`` names (every installed one by default), with their settings.

    Raises :class:`SettingsError` naming the flag for an engine that is not installed or a
    setting an engine refuses.
    """
    try:
        return EngineRegistry.load(settings.engines or None, engine_settings(settings))
    except (UnknownEngine, EngineSettingsError) as exc:
        raise _settings_error(exc) from exc


def check_engines(settings: Settings) -> None:
    """What ``load_engines`` would refuse, refused without loading anything.

    The front loads no engines itself: it checks this way before starting any worker.
    """
    if settings.engines and settings.engine not in settings.engines:
        raise SettingsError(
            f"--engine {settings.engine!r} is not among --engines ({', '.join(settings.engines)})"
        )
    try:
        plan(settings.engines or None, engine_settings(settings))
    except (UnknownEngine, EngineSettingsError) as exc:
        raise _settings_error(exc) from exc


def _settings_error(exc: Exception) -> SettingsError:
    if isinstance(exc, UnknownEngine):
        return SettingsError(f"--engines (COSYRTC_ENGINES): {exc}")
    return SettingsError(f"--engine-setting (COSYRTC_ENGINE_...): {exc}")
