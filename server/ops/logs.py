"""Process logging: plain text, or one JSON object per line for a log pipeline to index.

A JSON line has ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``, and when known
``session_id`` and ``worker``; a failure adds ``exception`` (the traceback). The session id
comes from, in order: ``extra={"session_id": ...}``, the request being handled (a route
with ``{session_id}`` in its path), or the "session %s: ..." form most session log lines
already use, so existing lines gain the field without being rewritten.

Secrets never reach the output in either format: the configured tokens and ICE server
credentials are replaced wherever they appear, and so is any value that looks like one
(``Bearer ...``, ``token=...``, ``"password": ...``). Messages are cut at
``MAX_MESSAGE_CHARS``, so nothing large (an SDP, a buffer of samples) floods the log.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Iterable
from contextvars import ContextVar
from datetime import UTC, datetime

from aiohttp import web
from aiohttp.typedefs import Handler

from server.config import Settings

SESSION_ID: ContextVar[str | None] = ContextVar("session_id", default=None)
MAX_MESSAGE_CHARS = 4000
REDACTED = "[redacted]"
TEXT_FORMAT = "%(asctime)s %(levelname)s {worker}%(name)s: %(message)s"
_SECRET_SHAPES = (
    re.compile(r"(?i)\b(bearer)\s+[^\s\"',]+"),
    re.compile(r"(?i)\b(\w*(?:token|password|credential|secret))(\"?\s*[:=]\s*\"?)[^\s\"'&,;}]+"),
)


class Redactor:
    """Replaces known secrets, and anything shaped like a credential, in a line of text."""

    def __init__(self, secrets: Iterable[str]) -> None:
        # Longest first, so a secret that contains another is replaced whole.
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        text = _SECRET_SHAPES[0].sub(lambda m: f"{m.group(1)} {REDACTED}", text)
        text = _SECRET_SHAPES[1].sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
        if len(text) > MAX_MESSAGE_CHARS:
            text = text[:MAX_MESSAGE_CHARS] + f"... [{len(text) - MAX_MESSAGE_CHARS} more]"
        return text


def settings_secrets(settings: Settings) -> list[str]:
    """Every secret a setting holds: the tokens and the ICE servers' credentials."""
    secrets = [settings.auth_token, settings.admin_token]
    secrets += [server.credential for server in settings.ice_servers]
    return [secret for secret in secrets if secret]


class SessionFilter(logging.Filter):
    """Gives every record a ``session_id`` attribute (None when it concerns no session)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "session_id", None) is None:
            record.session_id = SESSION_ID.get() or _session_in_message(record)
        return True


def _session_in_message(record: logging.LogRecord) -> str | None:
    if (
        isinstance(record.msg, str)
        and record.msg.startswith("session %s")
        and isinstance(record.args, tuple)
        and record.args
    ):
        return str(record.args[0])
    return None


class TextFormatter(logging.Formatter):
    def __init__(self, redact: Redactor, worker: int | None = None) -> None:
        tag = "" if worker is None else f"worker{worker} "
        super().__init__(TEXT_FORMAT.format(worker=tag))
        self._redact = redact

    def format(self, record: logging.LogRecord) -> str:
        return self._redact(super().format(record))


class JsonFormatter(logging.Formatter):
    def __init__(self, redact: Redactor, worker: int | None = None) -> None:
        super().__init__()
        self._redact = redact
        self._worker = worker

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.fromtimestamp(record.created, UTC)
        entry: dict[str, object] = {
            "time": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": self._redact(record.getMessage()),
        }
        session_id = getattr(record, "session_id", None)
        if session_id is not None:
            entry["session_id"] = session_id
        if self._worker is not None:
            entry["worker"] = self._worker
        if record.exc_info:
            entry["exception"] = self._redact(self.formatException(record.exc_info))
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(settings: Settings, worker: int | None = None) -> None:
    """Send this process's logs to stderr in ``settings.log_format``, at its level."""
    redact = Redactor(settings_secrets(settings))
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(SessionFilter())
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter(redact, worker))
    else:
        handler.setFormatter(TextFormatter(redact, worker))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level.upper())


@web.middleware
async def session_context(request: web.Request, handler: Handler) -> web.StreamResponse:
    """While a request for a session is handled, its log lines carry that session's id."""
    session_id = request.match_info.get("session_id")
    if session_id is None:
        return await handler(request)
    token = SESSION_ID.set(session_id)
    try:
        return await handler(request)
    finally:
        SESSION_ID.reset(token)
