"""Transform chunks sent to the model host and not answered yet, on one event loop.

The link's thread and a server loop's hop channel both send chunks (``hop``) and match the
host's answers (``out``) to them; each keeps one of these. A chunk the host leaves
unanswered for ``HOP_TIMEOUT_S`` (a host that hangs, not one that went: that ends the
connection and fails them all at once) fails with ``EngineUnavailable``.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import numpy as np

from media.engines.base import ChunkFuture, EngineError, EngineUnavailable

HOP_TIMEOUT_S = 1.0


class HostRefused(EngineError):
    """The host refused a request; the message is the host's, ``code`` says which kind."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class HostFailed(EngineError):
    """What the host could not do (its engine raised); the host's message."""


class HopsInFlight:
    """The chunks awaiting the host's answer, oldest first, each with its future."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiting: dict[int, tuple[ChunkFuture, float]] = {}  # hop -> (future, sent)
        self._ids = itertools.count(1)
        self._sweep: asyncio.TimerHandle | None = None

    def add(self, future: ChunkFuture) -> int:
        """The number of a chunk about to be sent, whose answer goes to ``future``."""
        hop = next(self._ids)
        self._waiting[hop] = (future, self._loop.time())
        if self._sweep is None:
            self._sweep = self._loop.call_later(HOP_TIMEOUT_S, self._expire)
        return hop

    def answer(self, hop: int, header: dict[str, Any], payload: bytes) -> None:
        """The host's ``out`` for ``hop``: its output, or why there is none.

        Raises ``ValueError`` for output that is not float32 (the connection is broken).
        """
        entry = self._waiting.pop(hop, None)
        if entry is None or entry[0].done():
            return  # it timed out, or its session gave up on it
        future = entry[0]
        if "error" in header:
            code = str(header.get("code", "refused"))
            future.set_exception(HostRefused(str(header["error"]), code))
        elif len(payload) % 4:
            future.set_exception(HostFailed("the host sent a chunk's output that is not float32"))
            raise ValueError("a chunk's output that is not float32")
        else:
            future.set_result(np.frombuffer(payload, np.float32).copy())

    def fail_all(self, error: Exception) -> None:
        for future, _ in self._waiting.values():
            if not future.done():
                future.set_exception(error)
        self._waiting.clear()
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None

    def _expire(self) -> None:
        self._sweep = None
        now = self._loop.time()
        while self._waiting:
            hop, (future, sent) = next(iter(self._waiting.items()))
            if now - sent < HOP_TIMEOUT_S:
                self._sweep = self._loop.call_later(sent + HOP_TIMEOUT_S - now, self._expire)
                return
            del self._waiting[hop]
            if not future.done():
                timeout = f"the model host did not answer a chunk in {HOP_TIMEOUT_S:g} s"
                future.set_exception(EngineUnavailable(timeout))
