"""Settings and loading of ``cosyvoice-triton`` (the ``cosyvoice-triton`` namespace).

    --engine-setting cosyvoice-triton.url=triton.internal:8001
    COSYRTC_ENGINE_COSYVOICE_TRITON_URL=triton.internal:8001

Without ``url`` the engine is listed as unavailable and the server starts normally. With it,
the engine loads even while the server is down (it says so and reconnects), so a node
started before its Triton server serves as soon as the server is up.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from media.engines.base import Engine, EngineUnavailable
from media.engines.plugin import (
    EnginePlugin,
    EngineSetting,
    EngineSettingsError,
    parse_switch,
)

log = logging.getLogger(__name__)

NAME = "cosyvoice-triton"
DEFAULT_MODEL = "cosyvoice2"  # contract.MODEL_NAME (this module imports no gRPC)
ENABLE_HINT = (
    f"set --engine-setting {NAME}.url=HOST:PORT (or COSYRTC_ENGINE_COSYVOICE_TRITON_URL) to the "
    "gRPC address of a Triton server running CosyVoice's runtime/triton_trtllm with "
    "decoupled_mode:True"
)


def _address(raw: str) -> str:
    host, colon, port = raw.strip().rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("the gRPC address as HOST:PORT, e.g. triton.internal:8001")
    return raw.strip()


def _seconds(raw: str) -> float:
    value = float(raw)
    if not math.isfinite(value) or value <= 0:
        raise ValueError("a number of seconds above 0")
    return value


def _file(raw: str) -> Path:
    path = Path(raw)
    if not path.is_file():
        raise ValueError("a PEM file of root certificates that exists")
    return path


SETTINGS = (
    EngineSetting("url", "gRPC address of the server, HOST:PORT (enables it)", None, _address),
    EngineSetting("model", "name of the streaming model", DEFAULT_MODEL, str),
    EngineSetting("tls", "connect with TLS (true/false)", False, parse_switch),
    EngineSetting("tls_ca", "PEM root certificates for TLS (implies tls)", None, _file),
    EngineSetting("connect_timeout", "seconds a health check may take", 5.0, _seconds),
    EngineSetting(
        "chunk_timeout", "seconds without audio before an utterance fails", 15.0, _seconds
    ),
    EngineSetting("reconnect_max", "longest wait between reconnection attempts", 5.0, _seconds),
    EngineSetting(
        "speakers", "directory of named voices: NAME.wav with its transcript NAME.txt", None, Path
    ),
)


def load(values: Mapping[str, Any]) -> Engine[Any]:
    """The engine, connected or connecting; unavailable (at load) only without ``url``."""
    if values["url"] is None:
        raise EngineUnavailable(f"no Triton server is set: {ENABLE_HINT}")
    from media.engines.cosyvoice_triton.voices import speakers_from

    try:
        speakers = speakers_from(values["speakers"])
    except ValueError as exc:
        raise EngineSettingsError(f"engine setting {NAME}.speakers: {exc}") from exc
    # gRPC and tritonclient are imported here: without them the engine is unavailable.
    from media.engines.cosyvoice_triton.engine import CosyVoiceTritonEngine
    from media.engines.cosyvoice_triton.link import LinkSettings, TritonLink

    link = TritonLink(
        LinkSettings(
            url=values["url"],
            model=values["model"],
            tls=values["tls"] or values["tls_ca"] is not None,
            tls_ca=values["tls_ca"],
            connect_timeout=values["connect_timeout"],
            reconnect_max=values["reconnect_max"],
        )
    )
    link.wait_for_first_probe(3 * values["connect_timeout"])
    reason = link.unavailable_reason
    if reason is not None:
        log.warning("engine %s starts unavailable: %s; it keeps reconnecting", NAME, reason)
    return CosyVoiceTritonEngine(link, speakers, values["chunk_timeout"])


PLUGIN = EnginePlugin(NAME, load, SETTINGS)
