"""Import CosyVoice2's neural modules, from the installed package or from a checkout.

The modules come from ``cosyvoice-minicpmo`` (installed ``--no-deps`` by ``make cosyvoice``) or
from a checkout of the upstream repository (its ``cosyvoice/`` package and
``third_party/Matcha-TTS/matcha/``). A checkout is imported from its own folders through
explicit module specs, not by editing ``sys.path``.

Two upstream imports pull in far more than inference needs, and each gets a stand-in only when
the real one is missing:

- ``cosyvoice.utils.file_utils`` imports ``torchaudio`` at the top (for reading WAV files).
  Every module we use imports it, through ``llm.py`` or ``class_utils.py``. The registry's
  torchaudio wheel is a CUDA build whose loader needs FFmpeg, and we compute every audio feature
  ourselves (``features.py``), so a stub module stands in; any attribute read on it raises.
- ``matcha.models.components.flow_matching`` imports ``matcha.utils.pylogger``, and
  ``matcha/utils/__init__.py`` imports hydra, lightning, rich, matplotlib, gdown and wget. The
  flow needs ``get_pylogger`` alone, so ``matcha.utils`` becomes a package holding only that.

``file_utils`` also calls ``logging.basicConfig(level=DEBUG)`` on import, which would turn on
debug logging for the whole server when nothing had configured logging yet; the root logger's
level and handlers are put back afterwards.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import logging
import sys
import threading
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MATCHA_IN_CHECKOUT = Path("third_party") / "Matcha-TTS"
INSTALL_HINT = (
    "run `make cosyvoice` (torch, the upstream modules from cosyvoice-minicpmo and "
    "requirements/cosyvoice.txt), or point --cosyvoice-src at a checkout of the upstream "
    "CosyVoice repository"
)

_import_lock = threading.Lock()


class UpstreamMissing(ImportError):
    """The upstream modules or one of their dependencies cannot be imported."""


@dataclass(frozen=True)
class Upstream:
    """The upstream classes and functions the engines use."""

    torch: Any
    load_hyperpyyaml: Any
    source: str  # where the cosyvoice package was imported from


def _stub(name: str, reason: str) -> types.ModuleType:
    """A module that imports but fails loudly on any use."""
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)

    def missing(attribute: str) -> Any:
        if attribute.startswith("__"):
            # Introspection (``getattr(module, "__file__", None)``, as tools that walk
            # ``sys.modules`` do) expects AttributeError, not a failure.
            raise AttributeError(attribute)
        raise ImportError(f"{name}.{attribute} is not available here: {reason}")

    module.__getattr__ = missing  # type: ignore[method-assign]
    return module


def _install_torchaudio_stub() -> None:
    if "torchaudio" in sys.modules or importlib.util.find_spec("torchaudio") is not None:
        return
    sys.modules["torchaudio"] = _stub(
        "torchaudio", "cosyrtc computes audio features itself and does not install torchaudio"
    )


def _install_matcha_utils_stub() -> None:
    """Give ``matcha.utils`` only the logger helper when its real dependencies are missing."""
    try:
        importlib.import_module("matcha.utils.pylogger")
        return
    except ImportError:
        pass
    matcha = importlib.import_module("matcha")
    utils = types.ModuleType("matcha.utils")
    utils.__spec__ = importlib.machinery.ModuleSpec("matcha.utils", loader=None, is_package=True)
    utils.__path__ = []
    pylogger = types.ModuleType("matcha.utils.pylogger")
    pylogger.get_pylogger = logging.getLogger  # type: ignore[attr-defined]
    utils.pylogger = pylogger  # type: ignore[attr-defined]
    sys.modules["matcha.utils"] = utils
    sys.modules["matcha.utils.pylogger"] = pylogger
    matcha.utils = utils  # type: ignore[attr-defined]


def _import_package_from(name: str, directory: Path) -> None:
    """Import package ``name`` from ``directory`` (a checkout) ahead of any installed copy."""
    if not directory.is_dir():
        raise UpstreamMissing(f"{directory} does not exist (expected the '{name}' package there)")
    existing = sys.modules.get(name)
    if existing is not None:
        location = Path(getattr(existing, "__path__", [""])[0] or "")
        if location.resolve() != directory.resolve():
            raise UpstreamMissing(f"'{name}' was already imported from {location}")
        return
    init = directory / "__init__.py"
    if init.is_file():
        spec = importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[str(directory)]
        )
    else:  # a folder without __init__.py, as upstream's cosyvoice/ may be
        spec = importlib.machinery.ModuleSpec(name, loader=None, is_package=True)
        spec.submodule_search_locations = [str(directory)]
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        if spec.loader is not None:
            spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise


def import_upstream(src: Path | None = None) -> Upstream:
    """Import torch and the upstream modules; raise ``UpstreamMissing`` saying what to install."""
    with _import_lock:
        root = logging.getLogger()
        level, handlers = root.level, list(root.handlers)
        try:
            # Their import-time availability checks must run before the stub exists.
            import diffusers.models.attention  # noqa: F401
            import torch
            import transformers  # noqa: F401
            from hyperpyyaml import load_hyperpyyaml

            if src is not None:
                _import_package_from("cosyvoice", src / "cosyvoice")
                _import_package_from("matcha", src / MATCHA_IN_CHECKOUT / "matcha")
            _install_torchaudio_stub()
            _install_matcha_utils_stub()
            for module in (
                "cosyvoice.llm.llm",
                "cosyvoice.flow.flow",
                "cosyvoice.flow.flow_matching",
                "cosyvoice.flow.decoder",
                "cosyvoice.transformer.upsample_encoder",
                "cosyvoice.hifigan.generator",
                "cosyvoice.hifigan.f0_predictor",
            ):
                importlib.import_module(module)
        except ImportError as exc:
            raise UpstreamMissing(
                f"CosyVoice modules did not import ({exc}); {INSTALL_HINT}"
            ) from exc
        finally:
            root.setLevel(level)
            for handler in list(root.handlers):
                if handler not in handlers:
                    root.removeHandler(handler)
        source = str(Path(sys.modules["cosyvoice"].__path__[0]))
        return Upstream(torch=torch, load_hyperpyyaml=load_hyperpyyaml, source=source)
