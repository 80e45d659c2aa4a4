"""One typed settings object, built from command-line flags and ``COSYRTC_*`` variables.

Every ``serve`` flag has an environment variable named after it (``--max-sessions`` ->
``COSYRTC_MAX_SESSIONS``); a flag given on the command line wins. Values are validated here,
at start-up, with messages that name the flag; no other module reads the environment.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from signaling.ice import IceServer

ENV_PREFIX = "COSYRTC_"


class SettingsError(ValueError):
    """A setting with a bad value; the message names the flag and its variable."""


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8080
    engine: str = "denoise"
    max_sessions: int = 64
    ice_hosts: tuple[str, ...] = ()
    ice_servers: tuple[IceServer, ...] = ()
    engine_threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    ice_timeout: float = 15.0
    max_body_bytes: int = 64 * 1024
    log_level: str = "info"
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    cosyvoice_model: str | None = None
    cosyvoice_src: str | None = None


@dataclass(frozen=True)
class _Flag:
    name: str
    help: str
    kind: type = str
    repeat: bool = False

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.dest.upper()


SERVE_FLAGS = (
    _Flag("host", "address to listen on (default 127.0.0.1)"),
    _Flag("port", "HTTP port (default 8080)", int),
    _Flag("engine", "engine for sessions that name none (default denoise)"),
    _Flag("max-sessions", "live sessions admitted at once (default 64)", int),
    _Flag("ice-host", "limit host ICE candidates to this address (repeatable)", repeat=True),
    _Flag("ice-server", "STUN/TURN URL, e.g. turn:user:pass@host:3478 (repeatable)", repeat=True),
    _Flag("engine-threads", "threads running engine calls (default: CPU count)", int),
    _Flag("ice-timeout", "seconds a new session may take to connect (default 15)", float),
    _Flag("max-body-bytes", "largest accepted request body (default 65536)", int),
    _Flag("log-level", "debug, info, warning or error (default info)"),
    _Flag("workers", "worker processes, each with its own event loop (default: CPU count)", int),
    _Flag("cosyvoice-model", "CosyVoice2 model directory (enables cosyvoice, cosyvoice-vc)"),
    _Flag("cosyvoice-src", "upstream CosyVoice checkout to import instead of the package"),
)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    for flag in SERVE_FLAGS:
        help_text = f"{flag.help} [env {flag.env}]"
        if flag.repeat:
            parser.add_argument(f"--{flag.name}", action="append", help=help_text)
        else:
            parser.add_argument(f"--{flag.name}", help=help_text)


def _from_env(flag: _Flag, env: Mapping[str, str]) -> Any:
    raw = env.get(flag.env)
    if raw is None or raw == "":
        return None
    return raw.replace(",", " ").split() if flag.repeat else raw


def _convert(flag: _Flag, raw: str) -> Any:
    try:
        return flag.kind(raw)
    except ValueError as exc:
        raise SettingsError(
            f"--{flag.name} ({flag.env}) must be {flag.kind.__name__}, got {raw!r}"
        ) from exc


def settings_from(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Settings:
    """Merge flags over environment over defaults, then validate."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for flag in SERVE_FLAGS:
        raw = getattr(args, flag.dest, None)
        if raw is None:
            raw = _from_env(flag, env)
        if raw is None:
            continue
        values[flag.dest] = tuple(raw) if flag.repeat else _convert(flag, raw)
    if "ice_host" in values:
        values["ice_hosts"] = values.pop("ice_host")
    if "ice_server" in values:
        values["ice_servers"] = _parse_ice_servers(values.pop("ice_server"))
    settings = Settings(**values)
    _validate(settings)
    return settings


def _parse_ice_servers(urls: Sequence[str]) -> tuple[IceServer, ...]:
    try:
        return tuple(IceServer.parse(url) for url in urls)
    except ValueError as exc:
        raise SettingsError(f"--ice-server ({ENV_PREFIX}ICE_SERVER): {exc}") from exc


def _validate(settings: Settings) -> None:
    if not 0 < settings.port < 65536:
        raise SettingsError(f"--port ({ENV_PREFIX}PORT) must be 1-65535, got {settings.port}")
    if settings.max_sessions < 1:
        raise SettingsError(f"--max-sessions ({ENV_PREFIX}MAX_SESSIONS) must be at least 1")
    if settings.workers < 1:
        raise SettingsError(f"--workers ({ENV_PREFIX}WORKERS) must be at least 1")
    if settings.engine_threads < 1:
        raise SettingsError(f"--engine-threads ({ENV_PREFIX}ENGINE_THREADS) must be at least 1")
    if not 0 < settings.ice_timeout < math.inf:  # also refuses nan
        raise SettingsError(f"--ice-timeout ({ENV_PREFIX}ICE_TIMEOUT) must be positive and finite")
    if settings.max_body_bytes < 1024:
        raise SettingsError(f"--max-body-bytes ({ENV_PREFIX}MAX_BODY_BYTES) must be >= 1024")
    if settings.log_level.lower() not in ("debug", "info", "warning", "error"):
        raise SettingsError(f"--log-level ({ENV_PREFIX}LOG_LEVEL) must be debug/info/warning/error")
    for address in settings.ice_hosts:
        try:
            ipaddress.ip_address(address)
        except ValueError as exc:
            raise SettingsError(
                f"--ice-host ({ENV_PREFIX}ICE_HOST) must be an IP address, got {address!r}"
            ) from exc
