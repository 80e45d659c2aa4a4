"""What pipelines tell their session: events as JSON-ready dicts, sent to the client."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Event = dict[str, Any]
EventSink = Callable[[Event], None]

# Error codes of the events that report an engine exception (the session goes on).
ENGINE_FAILED = "engine_failed"  # a transform call
SYNTHESIS_FAILED = "synthesis_failed"  # a speak call
ENGINE_FAILURES = frozenset({ENGINE_FAILED, SYNTHESIS_FAILED})
