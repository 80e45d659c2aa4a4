"""The events a call receives from the server, kept in order and waited on by type.

Both the WebRTC call (data channel) and the socket call hand every JSON message here.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any


class EventLog:
    """Every JSON object the server sent, stamped with its arrival (``received_at``)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._event_arrived = asyncio.Event()

    def _record_event(self, raw: str | bytes) -> None:
        try:
            event = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return
        if isinstance(event, dict):
            event["received_at"] = time.monotonic()
            self.events.append(event)
            self._event_arrived.set()

    async def wait_for(
        self, kind: str, timeout: float = 10.0, since: int = 0, **match: Any
    ) -> dict[str, Any]:
        """The first event of type ``kind`` matching ``match``, among events ``since`` on.

        ``since`` is an index into ``events`` (e.g. ``len(call.events)`` taken before a
        request), so earlier events of the same type are not mistaken for the answer.
        """
        async with asyncio.timeout(timeout):
            while True:
                for event in self.events[since:]:
                    if event.get("type") == kind and all(
                        event.get(k) == v for k, v in match.items()
                    ):
                        return event
                self._event_arrived.clear()
                await self._event_arrived.wait()
