"""The engines a server process loads at start-up, from its settings."""

from __future__ import annotations

from media.engines.registry import EngineRegistry, EngineSettingsError, UnknownEngine, plan
from server.config import Settings, SettingsError

# Flags that predate engine settings, and the settings they are.
COSYVOICE_NAMESPACE = "cosyvoice"
# How long a worker waits at start-up for the model host to say which engines it serves.
HOST_HELLO_WAIT_S = 60.0


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


def model_host_path(settings: Settings) -> str | None:
    """The socket of the model host this process uses, or None to load every engine."""
    if settings.model_host.startswith("unix:"):
        return settings.model_host.removeprefix("unix:")
    return None


def hostable_names(settings: Settings) -> list[str]:
    """The chosen engines a model host would load: those ``--host-engines`` names, or the
    hostable ones hosted by default (``EnginePlugin.hostable``, ``hosted_by_default``).

    Raises :class:`SettingsError` for a ``--host-engines`` name that cannot be hosted.
    """
    try:
        chosen = plan(settings.engines or None, engine_settings(settings))
    except (UnknownEngine, EngineSettingsError) as exc:
        raise _settings_error(exc) from exc
    if not settings.host_engines:
        return [plugin.name for plugin, _ in chosen if plugin.hostable and plugin.hosted_by_default]
    hostable = [plugin.name for plugin, _ in chosen if plugin.hostable]
    refused = [name for name in settings.host_engines if name not in hostable]
    if refused:
        raise SettingsError(
            f"--host-engines: {', '.join(refused)} cannot run in the model host "
            f"(of the engines loaded, these can: {', '.join(hostable) or 'none'})"
        )
    return [name for name in hostable if name in settings.host_engines]


def load_engines(settings: Settings, names: list[str] | None = None) -> EngineRegistry:
    """The engines ``--engines`` names (every installed one by default), with their settings;
    ``names`` instead, when given. With ``--model-host unix:PATH`` the hostable ones are the
    host's, served over its socket, and only the others load here.

    Raises :class:`SettingsError` naming the flag for an engine that is not installed or a
    setting an engine refuses.
    """
    host = model_host_path(settings) if names is None else None
    chosen = names if names is not None else list(settings.engines) or None
    hosted: list[str] = []
    if host is not None:
        hosted = hostable_names(settings)
        chosen = [name for name in _all_names(settings) if name not in hosted]
    try:
        registry = EngineRegistry.load(chosen, engine_settings(settings))
    except (UnknownEngine, EngineSettingsError) as exc:
        raise _settings_error(exc) from exc
    if host is not None and hosted:
        _add_hosted(registry, host, hosted)
    return registry


def _all_names(settings: Settings) -> list[str]:
    return [plugin.name for plugin, _ in plan(settings.engines or None, engine_settings(settings))]


def _add_hosted(registry: EngineRegistry, path: str, names: list[str]) -> None:
    from media.engines.hosted.catalog import hosted_engines
    from media.engines.hosted.link import HostLink

    link = HostLink(path)
    engines, unavailable = hosted_engines(link, names, HOST_HELLO_WAIT_S)
    for engine in engines:
        registry.add(engine)
    for name, reason in unavailable.items():
        registry.add_unavailable(name, reason)
    if not engines:
        link.close()


def check_engines(settings: Settings) -> None:
    """What ``load_engines`` would refuse, refused without loading anything.

    The front loads no engines itself: it checks this way before starting any worker.
    """
    if settings.engines and settings.engine not in settings.engines:
        raise SettingsError(
            f"--engine {settings.engine!r} is not among --engines ({', '.join(settings.engines)})"
        )
    hostable_names(settings)


def _settings_error(exc: Exception) -> SettingsError:
    if isinstance(exc, UnknownEngine):
        return SettingsError(f"--engines (COSYRTC_ENGINES): {exc}")
    return SettingsError(f"--engine-setting (COSYRTC_ENGINE_...): {exc}")
