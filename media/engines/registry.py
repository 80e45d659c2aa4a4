"""Engines by name, from plugins: every package that declares one in ``cosyrtc.engines``.

An engine ships as an entry point of the ``cosyrtc.engines`` group naming an
:class:`EnginePlugin`: its name, its settings (each filled from ``--engine-setting
NAMESPACE.KEY=VALUE`` or ``COSYRTC_ENGINE_<NAMESPACE>_<KEY>``) and how to load it. The
built-in engines register the same way, in this project's ``pyproject.toml``; installing a
package adds its engines, uninstalling it removes them, and no code here changes.

Loading happens once per process. A plugin that cannot load here (a missing optional
dependency, a model directory not set) is recorded as unavailable with a message saying
what to install or set, instead of failing the server; a setting that is wrong (an unknown
key, a value that does not parse) fails start-up with a message naming it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any

from media.engines.base import Engine, EngineError, EngineUnavailable
from media.engines.plugin import EnginePlugin, EngineSettingsError

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "cosyrtc.engines"

EngineSettings = Mapping[str, Mapping[str, str]]  # namespace -> key -> raw value

__all__ = ["EnginePlugin", "EngineRegistry", "EngineSettingsError", "UnknownEngine"]


class UnknownEngine(EngineError):
    """A name no installed plugin has."""


def installed_plugins() -> dict[str, EnginePlugin]:
    """Every plugin the installed packages declare, by engine name (import failures too).

    A plugin whose module cannot be imported is represented by one that, when loaded,
    reports the engine unavailable with the import error.
    """
    plugins: dict[str, EnginePlugin] = {}
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            plugin = entry.load()
        except ImportError as exc:
            plugins[entry.name] = _unimportable(entry.name, exc)
            continue
        if not isinstance(plugin, EnginePlugin) or plugin.name != entry.name:
            raise EngineError(
                f"entry point {entry.name} = {entry.value} of {ENTRY_POINT_GROUP} must name an "
                f"EnginePlugin called {entry.name!r}"
            )
        plugins[entry.name] = plugin
    return plugins


def _unimportable(name: str, error: ImportError) -> EnginePlugin:
    def load(settings: Mapping[str, Any]) -> Engine[Any]:
        raise EngineUnavailable(f"missing Python module '{error.name}': {error}")

    return EnginePlugin(name, load)


def settings_namespaces(plugins: Iterable[EnginePlugin] | None = None) -> set[str]:
    """The settings namespaces of the installed (or given) plugins."""
    chosen = installed_plugins().values() if plugins is None else plugins
    return {plugin.settings_namespace for plugin in chosen}


def plan(
    names: Iterable[str] | None = None,
    settings: EngineSettings | None = None,
    extra: Sequence[EnginePlugin] = (),
) -> list[tuple[EnginePlugin, dict[str, Any]]]:
    """The plugins to load and their parsed settings; checks everything but the loading.

    A front process, which loads no engines itself, checks this way before it starts any
    worker, so a wrong name or setting fails start-up with its message.
    """
    plugins = {**installed_plugins(), **{plugin.name: plugin for plugin in extra}}
    chosen = list(dict.fromkeys(names)) if names is not None else list(plugins)
    missing = [name for name in chosen if name not in plugins]
    if missing:
        raise UnknownEngine(
            f"unknown engine '{missing[0]}' (installed: {', '.join(plugins) or 'none'})"
        )
    settings = settings or {}
    namespaces = settings_namespaces(plugins.values())
    stray = sorted(set(settings) - namespaces)
    if stray:
        raise EngineSettingsError(
            f"engine settings for '{stray[0]}', which no installed engine reads "
            f"(namespaces: {', '.join(sorted(namespaces)) or 'none'})"
        )
    return [
        (
            plugins[name],
            plugins[name].parse_settings(settings.get(plugins[name].settings_namespace, {})),
        )
        for name in chosen
    ]


class EngineRegistry:
    """The engines this process has loaded, and why the others could not load."""

    def __init__(self) -> None:
        self._engines: dict[str, Engine[Any]] = {}
        self._unavailable: dict[str, str] = {}

    @classmethod
    def load(
        cls,
        names: Iterable[str] | None = None,
        settings: EngineSettings | None = None,
        extra: Sequence[EnginePlugin] = (),
    ) -> EngineRegistry:
        """Load the named engines (every installed one by default), recording failures.

        ``extra`` adds plugins that no installed package declares (tests, benchmarks).
        Raises :class:`UnknownEngine` for a name no plugin has and
        :class:`EngineSettingsError` for settings no chosen engine takes or accepts.
        """
        registry = cls()
        for plugin, parsed in plan(names, settings, extra):
            registry._load_one(plugin, parsed)
        return registry

    def _load_one(self, plugin: EnginePlugin, settings: Mapping[str, Any]) -> None:
        try:
            engine = plugin.load(settings)
        except ImportError as exc:
            self._unavailable[plugin.name] = f"missing Python module '{exc.name}': {exc}"
        except EngineUnavailable as exc:
            self._unavailable[plugin.name] = str(exc)
        else:
            self._engines[plugin.name] = engine
            return
        log.warning("engine %s unavailable: %s", plugin.name, self._unavailable[plugin.name])

    def add(self, engine: Engine[Any]) -> None:
        """An engine loaded another way (a model host's, served over its link)."""
        self._engines[engine.name] = engine
        self._unavailable.pop(engine.name, None)

    def add_unavailable(self, name: str, reason: str) -> None:
        self._unavailable[name] = reason
        log.warning("engine %s unavailable: %s", name, reason)

    def get(self, name: str) -> Engine[Any]:
        """The loaded engine called ``name``, or an error saying why there is none."""
        if name in self._engines:
            return self._engines[name]
        if name in self._unavailable:
            raise EngineUnavailable(f"engine '{name}' is not available: {self._unavailable[name]}")
        raise UnknownEngine(
            f"unknown engine '{name}' (available: {', '.join(self._engines) or 'none'})"
        )

    @property
    def names(self) -> list[str]:
        return list(self._engines)

    @property
    def engines(self) -> list[Engine[Any]]:
        return list(self._engines.values())

    @property
    def unavailable(self) -> dict[str, str]:
        return dict(self._unavailable)

    def close(self) -> None:
        for engine in self._engines.values():
            engine.close()
        self._engines.clear()
