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
import re
import urllib.parse
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
    # Warm workers (engines loaded) that replace a worker that dies at once (with --workers > 1).
    spare_workers: int = 1
    # Where hostable engines run: "auto" (a model host the front supervises, with --workers > 1),
    # "none" (each process loads its own) or "unix:PATH" (a host already running there).
    model_host: str = "auto"
    host_loops: int = 0  # the host's compute threads for engines without a batch loop; 0: cores
    # A second model host, loaded and listening, that takes over at once when the serving one
    # dies (a new host takes 1-3 s to load); 0: none (half the host memory, a slower restart).
    spare_host: int = 1
    # Which hostable engines the model host runs; empty: those hosted by default (the speak
    # engines; EnginePlugin.hosted_by_default).
    host_engines: tuple[str, ...] = ()
    cosyvoice_model: str | None = None  # the same as engine setting cosyvoice.model
    cosyvoice_src: str | None = None  # cosyvoice.src
    engines: tuple[str, ...] = ()  # which installed engines to load; empty: all of them
    # (namespace, key, value) from --engine-setting NS.KEY=VALUE and COSYRTC_ENGINE_NS_KEY.
    engine_settings: tuple[tuple[str, str, str], ...] = ()
    # Security and limits.
    auth_token: str | None = None
    admin_token: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    cors_origins: tuple[str, ...] = ("*",)
    rate_limit: int = 120
    # Live and not yet connected sessions one client address may hold (0: no limit).
    max_client_sessions: int = 8
    client_address_header: str | None = None  # behind a proxy: its client-address header
    max_session_seconds: float = 3600.0
    dc_max_message_bytes: int = 16 * 1024
    dc_max_messages: int = 50
    # Reliability.
    rtp_timeout: float = 5.0
    resume_grace: float = 20.0
    drain_timeout: float = 30.0
    breaker_failures: int = 5
    breaker_cooldown: float = 30.0
    # Deployment and operations.
    announce_ip: str | None = None
    rtp_port_range: tuple[int, int] | None = None
    log_format: str = "text"
    # A cluster of nodes (server/deploy/cluster.py); without --redis, one node on its own.
    redis: str | None = None
    node_id: str | None = None
    advertise_url: str | None = None  # where other nodes reach this node's HTTP API
    # 0-10. At the 96 kb/s mono the server sends, 4 costs ~40 % less encoding than 10 for
    # 0.1 less PESQ-WB (bench/opus_complexity.py, bench/results/opus_complexity.json).
    opus_complexity: int = 4
    # Phone calls (Twilio Media Streams): the account's auth token signs Twilio's requests,
    # over the URL Twilio was given, so the server must know its public URL.
    twilio_auth_token: str | None = None
    public_url: str | None = None  # e.g. https://voice.example.com, as callers reach it


@dataclass(frozen=True)
class _Flag:
    name: str
    help: str
    kind: type = str
    repeat: bool = False
    many: bool = False  # takes several values after one flag: --engines echo piper
    # A family of variables instead of one named after the flag (read by the flag's parser).
    variables: str | None = None

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    @property
    def env(self) -> str:
        return self.variables or ENV_PREFIX + self.dest.upper()


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
    _Flag(
        "spare-workers",
        "warm workers that replace one that dies at once (with --workers > 1; default 1)",
        int,
    ),
    _Flag(
        "model-host",
        "where models run: auto (one host process beside the workers, with --workers > 1), "
        "none (in every worker) or unix:PATH (a running host; default auto)",
    ),
    _Flag("host-loops", "the model host's compute threads (default 0: one per core)", int),
    _Flag(
        "spare-host",
        "1: a warm second model host takes over at once when the serving one dies; 0: none "
        "(default 1)",
        int,
    ),
    _Flag(
        "host-engines",
        "engines the model host runs (default: piper, cosyvoice; denoise can be added)",
        repeat=True,
        many=True,
    ),
    _Flag("cosyvoice-model", "CosyVoice2 model directory (enables cosyvoice, cosyvoice-vc)"),
    _Flag("cosyvoice-src", "upstream CosyVoice checkout to import instead of the package"),
    _Flag("engines", "installed engines to load (default: all of them)", repeat=True, many=True),
    _Flag(
        "engine-setting",
        "an engine's setting, NAMESPACE.KEY=VALUE, e.g. cosyvoice.model=DIR (repeatable)",
        repeat=True,
        variables="COSYRTC_ENGINE_<NAMESPACE>_<KEY>",
    ),
    _Flag("auth-token", "bearer token every signaling and session request must carry"),
    _Flag("admin-token", "bearer token for admin routes such as the session list"),
    _Flag("tls-cert", "PEM certificate chain: serve HTTPS (needs --tls-key)"),
    _Flag("tls-key", "PEM private key for --tls-cert"),
    _Flag(
        "cors-origin",
        "origin allowed cross-origin requests, or * (repeatable; default *)",
        repeat=True,
    ),
    _Flag(
        "rate-limit", "new sessions per client address per minute (0 = no limit; default 120)", int
    ),
    _Flag(
        "max-client-sessions",
        "sessions (live or connecting) one client address may hold (0 = no limit; default 8)",
        int,
    ),
    _Flag(
        "client-address-header",
        "behind a reverse proxy: the header it writes the client address into (default: none)",
    ),
    _Flag("max-session-seconds", "longest a session may last (0 = no limit; default 3600)", float),
    _Flag("dc-max-message-bytes", "largest data-channel message accepted (default 16384)", int),
    _Flag("dc-max-messages", "data-channel messages accepted per second (default 50)", int),
    _Flag(
        "rtp-timeout", "seconds without caller media before a session detaches (default 5)", float
    ),
    _Flag("resume-grace", "seconds a detached session waits to be resumed (default 20)", float),
    _Flag("drain-timeout", "seconds live sessions may go on after SIGTERM (default 30)", float),
    _Flag(
        "breaker-failures",
        "engine failures within a minute that stop new sessions (default 5)",
        int,
    ),
    _Flag("breaker-cooldown", "seconds an engine stays refused after that (default 30)", float),
    _Flag("announce-ip", "public address to put in ICE candidates (server behind 1:1 NAT)"),
    _Flag("rtp-port-range", "UDP ports for media, LO-HI (default: any)"),
    _Flag("log-format", "text or json (one JSON object per line) (default text)"),
    _Flag("redis", "redis://HOST:PORT/DB: join the cluster of nodes coordinated there"),
    _Flag("node-id", "this node's name in the cluster (letters, digits, -; default from host)"),
    _Flag("advertise-url", "the URL other nodes reach this node's API at (default: host:port)"),
    _Flag("opus-complexity", "Opus encoder complexity 0-10 for what is sent (default 4)", int),
    _Flag("twilio-auth-token", "Twilio account auth token: enables /twilio/voice, /twilio/media"),
    _Flag("public-url", "https://HOST the server is reached at (Twilio signs over it)"),
)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    for flag in SERVE_FLAGS:
        help_text = f"{flag.help} [env {flag.env}]"
        if flag.many:
            parser.add_argument(f"--{flag.name}", action="extend", nargs="+", help=help_text)
        elif flag.repeat:
            parser.add_argument(f"--{flag.name}", action="append", help=help_text)
        else:
            parser.add_argument(f"--{flag.name}", help=help_text)


def _from_env(flag: _Flag, env: Mapping[str, str]) -> Any:
    if flag.variables is not None:
        return None  # a family of variables, which the flag's own parser reads
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
    if "cors_origin" in values:
        values["cors_origins"] = values.pop("cors_origin")
    if "rtp_port_range" in values:
        values["rtp_port_range"] = _parse_port_range(values["rtp_port_range"])
    values["engine_settings"] = _engine_settings(values.pop("engine_setting", ()), env)
    settings = Settings(**values)
    _validate(settings)
    return settings


ENGINE_ENV_PREFIX = ENV_PREFIX + "ENGINE_"


def _engine_settings(
    flags: Sequence[str], env: Mapping[str, str]
) -> tuple[tuple[str, str, str], ...]:
    """Engine settings from flags over variables, as (namespace, key, value).

    A variable ``COSYRTC_ENGINE_<NAMESPACE>_<KEY>`` is read for every namespace an installed
    engine declares (``cosyvoice-vc`` is ``COSYVOICE_VC``), so ``COSYRTC_ENGINE_THREADS``
    (``--engine-threads``) is never mistaken for one. Whether a key exists and its value is
    good is for the engine to say when it loads.
    """
    from media.engines.registry import settings_namespaces

    found: dict[tuple[str, str], str] = {}
    claimed: set[str] = set()
    # Longest first: COSYRTC_ENGINE_DENOISE_LIBDF_X belongs to denoise-libdf, not denoise.
    for namespace in sorted(settings_namespaces(), key=len, reverse=True):
        prefix = ENGINE_ENV_PREFIX + namespace.upper().replace("-", "_") + "_"
        for variable, value in env.items():
            if variable.startswith(prefix) and value != "" and variable not in claimed:
                claimed.add(variable)
                found[(namespace, variable[len(prefix) :].lower())] = value
    for text in flags:
        name, equals, value = text.partition("=")
        namespace, dot, key = name.partition(".")
        if not equals or not dot or not namespace or not key:
            raise SettingsError(
                f"--engine-setting must be NAMESPACE.KEY=VALUE (e.g. cosyvoice.model=DIR), "
                f"got {text!r}"
            )
        found[(namespace, key)] = value
    return tuple((namespace, key, value) for (namespace, key), value in found.items())


def _parse_ice_servers(urls: Sequence[str]) -> tuple[IceServer, ...]:
    try:
        return tuple(IceServer.parse(url) for url in urls)
    except ValueError as exc:
        raise SettingsError(f"--ice-server ({ENV_PREFIX}ICE_SERVER): {exc}") from exc


def _parse_port_range(raw: str) -> tuple[int, int]:
    low, _, high = raw.partition("-")
    try:
        ports = int(low), int(high)
    except ValueError:
        ports = (0, 0)
    if not 1024 <= ports[0] <= ports[1] < 65536:
        raise SettingsError(
            f"--rtp-port-range ({ENV_PREFIX}RTP_PORT_RANGE) must be LO-HI within 1024-65535, "
            f"got {raw!r}"
        )
    return ports


def _validate(settings: Settings) -> None:
    if not 0 < settings.port < 65536:
        raise SettingsError(f"--port ({ENV_PREFIX}PORT) must be 1-65535, got {settings.port}")
    if settings.max_sessions < 1:
        raise SettingsError(f"--max-sessions ({ENV_PREFIX}MAX_SESSIONS) must be at least 1")
    if settings.workers < 1:
        raise SettingsError(f"--workers ({ENV_PREFIX}WORKERS) must be at least 1")
    if settings.spare_workers < 0:
        raise SettingsError(f"--spare-workers ({ENV_PREFIX}SPARE_WORKERS) must be >= 0")
    if settings.model_host not in ("auto", "none") and not (
        settings.model_host.startswith("unix:") and len(settings.model_host) > len("unix:")
    ):
        raise SettingsError(
            f"--model-host ({ENV_PREFIX}MODEL_HOST) must be auto, none or unix:PATH, "
            f"got {settings.model_host!r}"
        )
    if settings.spare_host not in (0, 1):
        raise SettingsError(f"--spare-host ({ENV_PREFIX}SPARE_HOST) must be 0 or 1")
    if settings.host_loops < 0:
        raise SettingsError(f"--host-loops ({ENV_PREFIX}HOST_LOOPS) must be >= 0")
    if settings.engine_threads < 1:
        raise SettingsError(f"--engine-threads ({ENV_PREFIX}ENGINE_THREADS) must be at least 1")
    if not 0 < settings.ice_timeout < math.inf:  # also refuses nan
        raise SettingsError(f"--ice-timeout ({ENV_PREFIX}ICE_TIMEOUT) must be positive and finite")
    if settings.max_body_bytes < 1024:
        raise SettingsError(f"--max-body-bytes ({ENV_PREFIX}MAX_BODY_BYTES) must be >= 1024")
    if settings.log_level.lower() not in ("debug", "info", "warning", "error"):
        raise SettingsError(f"--log-level ({ENV_PREFIX}LOG_LEVEL) must be debug/info/warning/error")
    if (settings.tls_cert is None) != (settings.tls_key is None):
        raise SettingsError(
            f"--tls-cert ({ENV_PREFIX}TLS_CERT) and --tls-key ({ENV_PREFIX}TLS_KEY) go "
            "together: give both or neither"
        )
    if not 0 <= settings.opus_complexity <= 10:
        raise SettingsError(f"--opus-complexity ({ENV_PREFIX}OPUS_COMPLEXITY) must be 0-10")
    if settings.log_format not in ("text", "json"):
        raise SettingsError(f"--log-format ({ENV_PREFIX}LOG_FORMAT) must be text or json")
    for name in ("rate_limit", "max_session_seconds", "breaker_failures", "max_client_sessions"):
        if getattr(settings, name) < 0:
            flag = name.replace("_", "-")
            raise SettingsError(f"--{flag} ({ENV_PREFIX}{name.upper()}) must be >= 0")
    for name in ("dc_max_message_bytes", "dc_max_messages"):
        if getattr(settings, name) < 1:
            flag = name.replace("_", "-")
            raise SettingsError(f"--{flag} ({ENV_PREFIX}{name.upper()}) must be at least 1")
    for name in ("rtp_timeout", "resume_grace", "drain_timeout", "breaker_cooldown"):
        if not 0 <= getattr(settings, name) < math.inf:
            flag = name.replace("_", "-")
            raise SettingsError(f"--{flag} ({ENV_PREFIX}{name.upper()}) must be >= 0 and finite")
    _validate_cluster(settings)
    _validate_telephony(settings)
    for origin in settings.cors_origins:
        _require_origin(origin)
    for address in settings.ice_hosts:
        _require_ip(address, "ice-host")
    if settings.announce_ip is not None:
        _require_ip(settings.announce_ip, "announce-ip")


NODE_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")


def _validate_cluster(settings: Settings) -> None:
    if settings.redis is not None:
        scheme = urllib.parse.urlsplit(settings.redis).scheme
        if scheme not in ("redis", "rediss", "unix"):
            raise SettingsError(
                f"--redis ({ENV_PREFIX}REDIS) must be redis://HOST:PORT/DB, got {settings.redis!r}"
            )
    if settings.node_id is not None and not NODE_ID.fullmatch(settings.node_id):
        raise SettingsError(
            f"--node-id ({ENV_PREFIX}NODE_ID) must be 1-32 lower-case letters, digits and -, "
            f"starting with a letter or digit, got {settings.node_id!r}"
        )
    if settings.advertise_url is not None:
        parsed = urllib.parse.urlsplit(settings.advertise_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise SettingsError(
                f"--advertise-url ({ENV_PREFIX}ADVERTISE_URL) must be http(s)://HOST:PORT/, "
                f"got {settings.advertise_url!r}"
            )


def _validate_telephony(settings: Settings) -> None:
    if settings.public_url is not None:
        parsed = urllib.parse.urlsplit(settings.public_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc or parsed.query:
            raise SettingsError(
                f"--public-url ({ENV_PREFIX}PUBLIC_URL) must be http(s)://HOST[:PORT][/PATH], "
                f"got {settings.public_url!r}"
            )
    if settings.twilio_auth_token is not None and settings.public_url is None:
        raise SettingsError(
            f"--twilio-auth-token ({ENV_PREFIX}TWILIO_AUTH_TOKEN) needs --public-url "
            f"({ENV_PREFIX}PUBLIC_URL): Twilio signs its requests over the URL it was given"
        )


def _require_origin(origin: str) -> None:
    """``*`` or an origin exactly as browsers send it: scheme://host[:port], no path."""
    parsed = urllib.parse.urlsplit(origin)
    exact = f"{parsed.scheme}://{parsed.netloc}"
    if origin != "*" and (
        parsed.scheme not in ("http", "https") or not parsed.netloc or origin != exact
    ):
        raise SettingsError(
            f"--cors-origin ({ENV_PREFIX}CORS_ORIGIN) must be * or scheme://host[:port] "
            f"with no path or trailing slash, got {origin!r}"
        )


def _require_ip(address: str, flag: str) -> None:
    try:
        ipaddress.ip_address(address)
    except ValueError as exc:
        variable = ENV_PREFIX + flag.replace("-", "_").upper()
        raise SettingsError(
            f"--{flag} ({variable}) must be an IP address, got {address!r}"
        ) from exc
