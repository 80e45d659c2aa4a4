"""Settings from flags and ``COSYRTC_*`` variables: precedence, coverage and error messages."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from server.config import SERVE_FLAGS, Settings, SettingsError, settings_from
from server.deploy.cli import build_parser
from signaling.ice import IceServer


def serve_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


def test_defaults_without_flags_or_environment():
    assert settings_from(serve_args(), {}) == Settings()


def test_environment_is_read_and_unrelated_variables_ignored():
    env = {"COSYRTC_MAX_SESSIONS": "3", "MAX_SESSIONS": "9", "COSYRTC_UNKNOWN": "x"}
    assert settings_from(serve_args(), env).max_sessions == 3


def test_empty_variable_means_unset():
    assert settings_from(serve_args(), {"COSYRTC_PORT": ""}).port == Settings().port


# One valid value per flag, as a string the way the environment holds it.
ENV_VALUES = {
    "COSYRTC_HOST": "127.0.0.2",
    "COSYRTC_PORT": "9001",
    "COSYRTC_ENGINE": "echo",
    "COSYRTC_MAX_SESSIONS": "3",
    "COSYRTC_ICE_HOST": "127.0.0.1, ::1",
    "COSYRTC_ICE_SERVER": "stun:stun.example.net:3478,turn:alice:secret@turn.example.net:3478",
    "COSYRTC_ENGINE_THREADS": "2",
    "COSYRTC_ICE_TIMEOUT": "2.5",
    "COSYRTC_MAX_BODY_BYTES": "4096",
    "COSYRTC_LOG_LEVEL": "debug",
    "COSYRTC_WORKERS": "3",
    "COSYRTC_COSYVOICE_MODEL": "/models/CosyVoice2-0.5B",
    "COSYRTC_COSYVOICE_SRC": "/src/CosyVoice",
    "COSYRTC_AUTH_TOKEN": "user-secret",
    "COSYRTC_ADMIN_TOKEN": "admin-secret",
    "COSYRTC_TLS_CERT": "/etc/cosyrtc/cert.pem",
    "COSYRTC_TLS_KEY": "/etc/cosyrtc/key.pem",
    "COSYRTC_CORS_ORIGIN": "https://a.example, https://b.example",
    "COSYRTC_RATE_LIMIT": "10",
    "COSYRTC_MAX_SESSION_SECONDS": "60",
    "COSYRTC_DC_MAX_MESSAGE_BYTES": "2048",
    "COSYRTC_DC_MAX_MESSAGES": "5",
    "COSYRTC_RTP_TIMEOUT": "2",
    "COSYRTC_RESUME_GRACE": "8",
    "COSYRTC_DRAIN_TIMEOUT": "4",
    "COSYRTC_BREAKER_FAILURES": "3",
    "COSYRTC_BREAKER_COOLDOWN": "7",
    "COSYRTC_ANNOUNCE_IP": "203.0.113.7",
    "COSYRTC_RTP_PORT_RANGE": "40000-40099",
    "COSYRTC_LOG_FORMAT": "json",
    "COSYRTC_OPUS_COMPLEXITY": "9",
    "COSYRTC_SPARE_WORKERS": "2",
    "COSYRTC_MODEL_HOST": "unix:/run/cosyrtc/host.sock",
    "COSYRTC_HOST_LOOPS": "3",
    "COSYRTC_SPARE_HOST": "0",
    "COSYRTC_HOST_ENGINES": "piper denoise",
    "COSYRTC_MAX_CLIENT_SESSIONS": "4",
    "COSYRTC_CLIENT_ADDRESS_HEADER": "X-Real-IP",
    "COSYRTC_ENGINES": "echo, piper",
    "COSYRTC_REDIS": "redis://10.0.0.5:6379/0",
    "COSYRTC_NODE_ID": "node-7",
    "COSYRTC_ADVERTISE_URL": "http://10.0.0.7:8080/",
    "COSYRTC_TWILIO_AUTH_TOKEN": "twilio-secret",
    "COSYRTC_PUBLIC_URL": "https://voice.example.com",
    "COSYRTC_ENGINE_COSYVOICE_DEVICE": "cuda",
}
EXPECTED = Settings(
    host="127.0.0.2",
    port=9001,
    engine="echo",
    max_sessions=3,
    ice_hosts=("127.0.0.1", "::1"),
    ice_servers=(
        IceServer("stun:stun.example.net:3478"),
        IceServer("turn:turn.example.net:3478", "alice", "secret"),
    ),
    engine_threads=2,
    ice_timeout=2.5,
    max_body_bytes=4096,
    log_level="debug",
    workers=3,
    cosyvoice_model="/models/CosyVoice2-0.5B",
    cosyvoice_src="/src/CosyVoice",
    auth_token="user-secret",
    admin_token="admin-secret",
    tls_cert="/etc/cosyrtc/cert.pem",
    tls_key="/etc/cosyrtc/key.pem",
    cors_origins=("https://a.example", "https://b.example"),
    rate_limit=10,
    max_session_seconds=60.0,
    dc_max_message_bytes=2048,
    dc_max_messages=5,
    rtp_timeout=2.0,
    resume_grace=8.0,
    drain_timeout=4.0,
    breaker_failures=3,
    breaker_cooldown=7.0,
    announce_ip="203.0.113.7",
    rtp_port_range=(40000, 40099),
    log_format="json",
    opus_complexity=9,
    spare_workers=2,
    model_host="unix:/run/cosyrtc/host.sock",
    host_loops=3,
    spare_host=0,
    host_engines=("piper", "denoise"),
    max_client_sessions=4,
    client_address_header="X-Real-IP",
    engines=("echo", "piper"),
    redis="redis://10.0.0.5:6379/0",
    node_id="node-7",
    advertise_url="http://10.0.0.7:8080/",
    twilio_auth_token="twilio-secret",
    public_url="https://voice.example.com",
    engine_settings=(("cosyvoice", "device", "cuda"),),
)


def test_every_flag_has_a_variable(capsys: pytest.CaptureFixture[str]):
    named = [flag for flag in SERVE_FLAGS if flag.variables is None]
    assert {flag.env for flag in named} | {"COSYRTC_ENGINE_COSYVOICE_DEVICE"} == set(ENV_VALUES)
    for flag in named:
        assert flag.env == "COSYRTC_" + flag.name.replace("-", "_").upper()
    with pytest.raises(SystemExit):
        serve_args("--help")
    help_text = " ".join(capsys.readouterr().out.split())
    for flag in SERVE_FLAGS:
        assert f"--{flag.name}" in help_text
        assert flag.env in help_text


def test_every_variable_sets_its_setting():
    assert settings_from(serve_args(), ENV_VALUES) == EXPECTED


def test_every_flag_sets_its_setting():
    args = serve_args(
        "--host=127.0.0.2",
        "--port=9001",
        "--engine=echo",
        "--max-sessions=3",
        "--ice-host=127.0.0.1",
        "--ice-host=::1",
        "--ice-server=stun:stun.example.net:3478",
        "--ice-server=turn:alice:secret@turn.example.net:3478",
        "--engine-threads=2",
        "--ice-timeout=2.5",
        "--max-body-bytes=4096",
        "--log-level=debug",
        "--workers=3",
        "--model-host=unix:/run/cosyrtc/host.sock",
        "--host-loops=3",
        "--spare-host=0",
        "--host-engines",
        "piper",
        "denoise",
        "--cosyvoice-model=/models/CosyVoice2-0.5B",
        "--cosyvoice-src=/src/CosyVoice",
        "--auth-token=user-secret",
        "--admin-token=admin-secret",
        "--tls-cert=/etc/cosyrtc/cert.pem",
        "--tls-key=/etc/cosyrtc/key.pem",
        "--cors-origin=https://a.example",
        "--cors-origin=https://b.example",
        "--rate-limit=10",
        "--max-session-seconds=60",
        "--dc-max-message-bytes=2048",
        "--dc-max-messages=5",
        "--rtp-timeout=2",
        "--resume-grace=8",
        "--drain-timeout=4",
        "--breaker-failures=3",
        "--breaker-cooldown=7",
        "--announce-ip=203.0.113.7",
        "--rtp-port-range=40000-40099",
        "--log-format=json",
        "--opus-complexity=9",
        "--spare-workers=2",
        "--max-client-sessions=4",
        "--client-address-header=X-Real-IP",
        "--redis=redis://10.0.0.5:6379/0",
        "--node-id=node-7",
        "--advertise-url=http://10.0.0.7:8080/",
        "--twilio-auth-token=twilio-secret",
        "--public-url=https://voice.example.com",
        "--engines",
        "echo",
        "piper",
        "--engine-setting=cosyvoice.device=cuda",
    )
    assert settings_from(args, {}) == EXPECTED


def test_flags_override_environment():
    env = {
        "COSYRTC_MAX_SESSIONS": "3",
        "COSYRTC_PORT": "9001",
        "COSYRTC_ICE_HOST": "::1, 127.0.0.2",
        "COSYRTC_ENGINE": "denoise",
    }
    settings = settings_from(
        serve_args("--max-sessions", "5", "--ice-host", "127.0.0.1", "--engine", "echo"), env
    )
    assert settings.max_sessions == 5
    assert settings.ice_hosts == ("127.0.0.1",)  # the flag replaces the list, no merge
    assert settings.engine == "echo"
    assert settings.port == 9001  # no flag: the variable still applies


def test_repeatable_ice_host_keeps_order():
    args = serve_args("--ice-host", "::1", "--ice-host", "127.0.0.1", "--ice-host", "10.0.0.1")
    assert settings_from(args, {}).ice_hosts == ("::1", "127.0.0.1", "10.0.0.1")


@pytest.mark.parametrize(
    "value", ["127.0.0.1, ::1", "127.0.0.1,::1", "127.0.0.1 ::1", " 127.0.0.1 ,, ::1 "]
)
def test_ice_host_variable_separators(value: str):
    settings = settings_from(serve_args(), {"COSYRTC_ICE_HOST": value})
    assert settings.ice_hosts == ("127.0.0.1", "::1")


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--port", "http"], "--port"),
        (["--port", "0"], "--port"),
        (["--port", "65536"], "--port"),
        (["--port", "-1"], "--port"),
        (["--port", "80.5"], "--port"),
        (["--max-sessions", "many"], "--max-sessions"),
        (["--max-sessions", "2.5"], "--max-sessions"),
        (["--max-sessions", "0"], "--max-sessions"),
        (["--engine-threads", "x"], "--engine-threads"),
        (["--engine-threads", "0"], "--engine-threads"),
        (["--ice-timeout", "soon"], "--ice-timeout"),
        (["--ice-timeout", "0"], "--ice-timeout"),
        (["--ice-timeout", "-3"], "--ice-timeout"),
        (["--ice-timeout", "nan"], "--ice-timeout"),
        (["--ice-timeout", "inf"], "--ice-timeout"),
        (["--max-body-bytes", "64k"], "--max-body-bytes"),
        (["--max-body-bytes", "100"], "--max-body-bytes"),
        (["--log-level", "loud"], "--log-level"),
        (["--ice-host", "localhost"], "--ice-host"),
        (["--ice-host", "127.0.0.1", "--ice-host", "300.1.1.1"], "--ice-host"),
        (["--ice-server", "stun.example.net:3478"], "--ice-server"),
        (["--ice-server", "http://turn.example.net"], "--ice-server"),
        (["--ice-server", "stun:"], "--ice-server"),
        (["--tls-cert", "cert.pem"], "--tls-cert"),
        (["--cors-origin", "*", "--rate-limit", "-1"], "--rate-limit"),
        (["--max-session-seconds", "-5"], "--max-session-seconds"),
        (["--dc-max-message-bytes", "0"], "--dc-max-message-bytes"),
        (["--dc-max-messages", "0"], "--dc-max-messages"),
        (["--rtp-timeout", "nan"], "--rtp-timeout"),
        (["--resume-grace", "-1"], "--resume-grace"),
        (["--drain-timeout", "inf"], "--drain-timeout"),
        (["--breaker-failures", "-2"], "--breaker-failures"),
        (["--breaker-cooldown", "x"], "--breaker-cooldown"),
        (["--announce-ip", "public.example"], "--announce-ip"),
        (["--rtp-port-range", "40000"], "--rtp-port-range"),
        (["--rtp-port-range", "50000-40000"], "--rtp-port-range"),
        (["--rtp-port-range", "80-90"], "--rtp-port-range"),
        (["--log-format", "xml"], "--log-format"),
        (["--opus-complexity", "11"], "--opus-complexity"),
        (["--opus-complexity", "-1"], "--opus-complexity"),
        (["--spare-host", "2"], "--spare-host"),
        (["--cors-origin", "https://app.example/"], "--cors-origin"),
        (["--cors-origin", "app.example"], "--cors-origin"),
        (["--cors-origin", "ftp://app.example"], "--cors-origin"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_bad_flag_value_names_the_flag(argv: list[str], flag: str):
    with pytest.raises(SettingsError) as raised:
        settings_from(serve_args(*argv), {})
    message = str(raised.value)
    assert message.startswith(flag + " ")
    assert "COSYRTC_" + flag[2:].replace("-", "_").upper() in message


@pytest.mark.parametrize(
    ("variable", "value", "flag"),
    [
        ("COSYRTC_PORT", "http", "--port"),
        ("COSYRTC_MAX_SESSIONS", "lots", "--max-sessions"),
        ("COSYRTC_ICE_HOST", "127.0.0.1, nothost", "--ice-host"),
        ("COSYRTC_ICE_SERVER", "stun:ok.example.net, ftp://x", "--ice-server"),
    ],
)
def test_bad_variable_value_names_the_flag(variable: str, value: str, flag: str):
    with pytest.raises(SettingsError) as raised:
        settings_from(serve_args(), {variable: value})
    assert flag in str(raised.value) and variable in str(raised.value)


def test_valid_flag_overrides_bad_variable():
    settings = settings_from(serve_args("--port", "9002"), {"COSYRTC_PORT": "not a port"})
    assert settings.port == 9002


def test_settings_error_is_a_value_error():
    assert issubclass(SettingsError, ValueError)


def test_engine_settings_come_from_flags_over_their_variables():
    env = {"COSYRTC_ENGINE_COSYVOICE_MODEL": "/env", "COSYRTC_ENGINE_DENOISE_LIBDF_WARM_POOL": "4"}
    flagged = settings_from(serve_args("--engine-setting", "cosyvoice.model=/flag"), env)
    assert set(flagged.engine_settings) == {
        ("cosyvoice", "model", "/flag"),
        ("denoise-libdf", "warm_pool", "4"),
    }
    # --engine-threads' variable is not read as an engine called "threads".
    assert settings_from(serve_args(), {"COSYRTC_ENGINE_THREADS": "3"}).engine_settings == ()


@pytest.mark.parametrize("bad", ["cosyvoice.model", "model=/x", ".model=/x", "cosyvoice.=/x"])
def test_an_engine_setting_must_name_namespace_key_and_value(bad: str):
    with pytest.raises(SettingsError, match=r"NAMESPACE\.KEY=VALUE"):
        settings_from(serve_args("--engine-setting", bad), {})


def test_readme_lists_every_flag_in_the_usage_and_in_operating():
    """A flag nobody can find is a flag nobody uses; one the README invents misleads."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    usage_start = readme.index("python -m server serve [--host")
    usage = readme[usage_start : readme.index("```", usage_start)]
    operating = readme[readme.index("**Flags**, by group") : readme.index("**Health and")]
    for flag in SERVE_FLAGS:
        assert f"--{flag.name}" in usage, f"--{flag.name} missing from the README's usage"
        assert f"--{flag.name}" in operating, f"--{flag.name} missing from README Operating"
    named = set(re.findall(r"--([a-z][a-z0-9-]+)", usage))
    assert named <= {flag.name for flag in SERVE_FLAGS}, "the usage names a flag serve lacks"


def test_the_host_runs_the_speak_engines_unless_told_which():
    from server.deploy.engines import check_engines, hostable_names

    chosen = ("echo", "piper", "denoise")
    assert hostable_names(Settings(engines=chosen)) == ["piper"]
    told = Settings(engines=chosen, host_engines=("denoise", "piper"))
    assert sorted(hostable_names(told)) == ["denoise", "piper"]
    with pytest.raises(SettingsError, match="--host-engines: echo cannot run in the model host"):
        check_engines(Settings(engines=chosen, engine="echo", host_engines=("echo",)))
