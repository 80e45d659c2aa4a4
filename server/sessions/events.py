"""Session events fanned out to every listener: the data channel and server-sent event streams.

Events are small JSON objects (``speech_started``, ``speech_finished``, ``error``, ``stats``).
Each SSE listener has a bounded queue: a listener that stops reading loses its oldest
events (counted), it never makes the session hold memory without bound.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from media.audio.queues import DropOldestQueue

log = logging.getLogger(__name__)

Event = dict[str, Any]
LISTENER_QUEUE_EVENTS = 256


class EventHub:
    """Publishes a session's events to its data channel (when open) and its SSE listeners."""

    def __init__(self) -> None:
        self._channel_send: Callable[[str], None] | None = None
        self._listeners: set[DropOldestQueue[Event | None]] = set()
        self.published = 0

    def attach_channel(self, send: Callable[[str], None]) -> None:
        self._channel_send = send

    def detach_channel(self) -> None:
        self._channel_send = None

    def publish(self, event: Event) -> None:
        self.published += 1
        if self._channel_send is not None:
            try:
                self._channel_send(json.dumps(event))
            except Exception:  # a closing channel raises; the event still reaches SSE
                log.debug("data channel send failed", exc_info=True)
        for queue in self._listeners:
            queue.put(event)

    def subscribe(self) -> DropOldestQueue[Event | None]:
        queue: DropOldestQueue[Event | None] = DropOldestQueue(LISTENER_QUEUE_EVENTS)
        self._listeners.add(queue)
        return queue

    def unsubscribe(self, queue: DropOldestQueue[Event | None]) -> None:
        self._listeners.discard(queue)

    def close(self) -> None:
        """End every listener's stream (a ``None`` tells it the session is over)."""
        for queue in self._listeners:
            queue.put(None)
        self._listeners.clear()
        self._channel_send = None

    @property
    def heard(self) -> bool:
        """Whether anyone takes the events now (the data channel or an SSE stream)."""
        return self._channel_send is not None or bool(self._listeners)

    @property
    def listeners(self) -> int:
        return len(self._listeners)
