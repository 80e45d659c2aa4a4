"""The engines a model host serves, as a worker's engines: one per entry of its hello."""

from __future__ import annotations

from typing import Any

from media.engines.base import Engine, EngineKind
from media.engines.hosted.engine import HostedSpeakEngine
from media.engines.hosted.link import HostLink
from media.engines.hosted.transform import HostedTransformEngine


def hosted_engines(
    link: HostLink, names: list[str], wait: float, chunk_timeout: float = 15.0
) -> tuple[list[Engine[Any]], dict[str, str]]:
    """The engines of ``names`` the host at the end of ``link`` serves, and why the others
    are unavailable (the host's own reason, or that it did not answer within ``wait``)."""
    if not link.wait_for_hello(wait):
        reason = link.unavailable_reason or "the model host did not answer"
        return [], {name: f"{reason} (waited {wait:g} s at start-up)" for name in names}
    served = {str(entry["name"]): entry for entry in link.hello.get("engines", [])}
    refused = dict(link.hello.get("unavailable", {}))
    engines: list[Engine[Any]] = []
    for name in names:
        if name not in served:
            continue
        entry = served[name]
        if entry.get("kind") == EngineKind.TRANSFORM.value:
            engines.append(HostedTransformEngine(link, entry))
        else:
            engines.append(HostedSpeakEngine(link, entry, chunk_timeout))
    unavailable = {
        name: f"on the model host: {refused.get(name, 'not loaded there')}"
        for name in names
        if name not in served
    }
    return engines, unavailable
