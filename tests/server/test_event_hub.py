"""The event hub: who hears a session's events, and what a listener that stops reading costs."""

from __future__ import annotations

import json

from server.sessions.events import LISTENER_QUEUE_EVENTS, EventHub


def test_nobody_hears_a_hub_without_a_channel_or_stream() -> None:
    hub = EventHub()
    assert not hub.heard
    sent: list[str] = []
    hub.attach_channel(sent.append)
    assert hub.heard
    hub.publish({"type": "stats"})
    assert [json.loads(s) for s in sent] == [{"type": "stats"}]
    hub.detach_channel()
    assert not hub.heard
    queue = hub.subscribe()
    assert hub.heard
    hub.unsubscribe(queue)
    assert not hub.heard


def test_a_listener_that_stops_reading_loses_its_oldest_events() -> None:
    hub = EventHub()
    queue = hub.subscribe()
    for k in range(LISTENER_QUEUE_EVENTS + 3):
        hub.publish({"type": "stats", "k": k})
    assert len(queue) == LISTENER_QUEUE_EVENTS
    assert queue.dropped == 3
    assert queue.pop() == {"type": "stats", "k": 3}
