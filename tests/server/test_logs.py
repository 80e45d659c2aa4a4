"""Structured logs: one JSON object per line, the session a line concerns, and no secrets."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.ops.logs import SESSION_ID, JsonFormatter, Redactor, SessionFilter, TextFormatter
from tests.server.test_cli import LOOPBACK, ROOT, clean_env, command, free_port

TOKEN = "s3cret-token-value"
START_TIMEOUT_S = 60.0


@pytest.fixture
def json_log() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(SessionFilter())
    handler.setFormatter(JsonFormatter(Redactor([TOKEN]), worker=3))
    logger = logging.getLogger("tests.logs.json")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield logger, stream
    logger.removeHandler(handler)


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_session_line_names_its_session_in_its_own_field(json_log):
    logger, stream = json_log
    logger.info("session %s: connection %s", "w3-abc", "connected")
    token = SESSION_ID.set("w3-def")
    try:
        logger.warning("speak request refused")
    finally:
        SESSION_ID.reset(token)
    logger.info("front: %d workers ready", 2)
    first, second, third = lines(stream)
    assert first["message"] == "session w3-abc: connection connected"
    assert first["session_id"] == "w3-abc"
    assert first["level"] == "INFO" and first["logger"] == "tests.logs.json"
    assert first["worker"] == 3
    assert str(first["time"]).endswith("Z")
    assert second["session_id"] == "w3-def" and second["level"] == "WARNING"
    assert "session_id" not in third


def test_secrets_and_credentials_never_reach_a_line(json_log):
    logger, stream = json_log
    logger.info("configured with %s", TOKEN)
    logger.info("header Authorization: Bearer abc.def.ghi")
    logger.info('GET /whip?token=xyz123&x=1 and {"resume_token": "rt-456"}')
    try:
        raise ValueError(f"bad password={TOKEN}")
    except ValueError:
        logger.exception("failed")
    text = stream.getvalue()
    for secret in (TOKEN, "abc.def.ghi", "xyz123", "rt-456"):
        assert secret not in text
    assert "exception" in lines(stream)[-1]


def test_text_lines_are_redacted_too():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "token=%s", (TOKEN,), None)
    assert TOKEN not in TextFormatter(Redactor([TOKEN]), worker=1).format(record)


def test_serve_with_json_logs_writes_only_json_lines_without_its_token(tmp_path: Path):
    """The real command: every stderr line of ``serve --log-format json`` is one JSON
    object, and the token it was given (and sent in requests) appears in none of them."""
    port = free_port()
    log = tmp_path / "stderr.log"
    argv = ["serve", "--port", str(port), "--engine", "echo", "--workers", "1"]
    argv += ["--ice-host", LOOPBACK, "--log-format", "json", "--auth-token", TOKEN]
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command(*argv),
            cwd=ROOT,
            env=clean_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
    url = f"http://{LOOPBACK}:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _answers(url + "/healthz"):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        authorized = {"Authorization": f"Bearer {TOKEN}"}
        assert _answers(url + "/engines", authorized)
        assert not _answers(url + f"/sessions/nope?token={TOKEN}", authorized)
    finally:
        process.terminate()
        process.wait(timeout=15)
    text = log.read_text()
    entries = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert entries, "serve wrote no log lines"
    assert TOKEN not in text
    for entry in entries:
        assert {"time", "level", "logger", "message"} <= set(entry)
    access = [e for e in entries if e["logger"] == "aiohttp.access"]
    assert any("/sessions/nope" in str(e["message"]) for e in access)


def _answers(url: str, headers: dict[str, str] | None = None) -> bool:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=1.0) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False
