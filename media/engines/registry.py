"""Engines by name: each name maps to a loader, and loading happens once per process.

Loaders import their libraries lazily, so a missing optional dependency makes that one
engine unavailable with a message naming what to install, instead of an ImportError deep
inside a call.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

from media.engines.base import Engine, EngineError, EngineUnavailable

log = logging.getLogger(__name__)

# name -> "module:function" returning a loaded Engine. Modules are imported on demand.
LOADERS: dict[str, str] = {
    "echo": "media.engines.echo:load",
    "denoise": "media.engines.deepfilter:load",
    "piper": "media.engines.piper:load",
    "cosyvoice": "media.engines.cosyvoice.loader:load_speak",
    "cosyvoice-vc": "media.engines.cosyvoice.loader:load_vc",
}


class UnknownEngine(EngineError):
    """A name no loader knows."""


def _resolve(spec: str) -> Callable[[], Engine[Any]]:
    module_name, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module_name), attr)


class EngineRegistry:
    """The engines this process has loaded, and why the others could not load."""

    def __init__(self) -> None:
        self._engines: dict[str, Engine[Any]] = {}
        self._unavailable: dict[str, str] = {}

    @classmethod
    def load(cls, names: Iterable[str] | None = None) -> EngineRegistry:
        """Load the named engines (all known ones by default), recording failures."""
        registry = cls()
        for name in names if names is not None else LOADERS:
            try:
                registry.load_one(name)
            except EngineUnavailable:
                continue  # recorded in registry.unavailable, served by GET /engines
        return registry

    def load_one(self, name: str) -> Engine[Any]:
        if name in self._engines:
            return self._engines[name]
        if name not in LOADERS:
            raise UnknownEngine(f"unknown engine '{name}' (known: {', '.join(LOADERS)})")
        try:
            engine = _resolve(LOADERS[name])()
        except ImportError as exc:
            missing = EngineUnavailable(f"missing Python module '{exc.name}': {exc}")
            self._unavailable[name] = str(missing)
            log.warning("engine %s unavailable: %s", name, missing)
            raise missing from exc
        except EngineUnavailable as exc:
            self._unavailable[name] = str(exc)
            log.warning("engine %s unavailable: %s", name, exc)
            raise
        self._engines[name] = engine
        self._unavailable.pop(name, None)
        return engine

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
    def unavailable(self) -> dict[str, str]:
        return dict(self._unavailable)

    def close(self) -> None:
        for engine in self._engines.values():
            closer = getattr(engine, "close", None)
            if closer is not None:
                closer()
        self._engines.clear()
