"""A worker loop's own connection to the model host for its transform sessions' chunks.

Through the link (``link.HostLink.hop``) a chunk is handed to the link's thread to be sent,
and its output handed back from that thread to the server's loop: two thread switches a
way, each waiting for the interpreter lock, which under load the server's loop holds for
milliseconds. This connection belongs to the server's loop instead: a chunk is written
by the call that submits it and its output read by the loop's own protocol callback, which
resolves the future the pipeline awaits. It ``join`` s the link's current connection on the
host (the states are that connection's), and lives for one link generation: when the host
goes, its chunks in flight fail with ``EngineUnavailable``, and the engine sends through
the link until a new channel has joined the next generation.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

import numpy as np

from media.engines.base import EngineUnavailable
from media.engines.hosted.link import HOP_TIMEOUT_S, HostFailed, HostLink, HostRefused
from media.engines.hosted.wire import MessageReader, ProtocolError, encode

log = logging.getLogger(__name__)

RETRY_S = 0.5  # a channel that could not connect is tried again after this long


class HopChannel(asyncio.Protocol):
    """The chunks of one loop's transform sessions, to the host and back."""

    def __init__(self, link: HostLink, loop: asyncio.AbstractEventLoop) -> None:
        self._link = link
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self.generation = 0  # the link generation joined (0: none yet)
        self._connecting: asyncio.Task[None] | None = None
        self._tried_at = -RETRY_S
        self._reader = MessageReader()
        self._greeted = False
        # Chunks sent and not answered, oldest first: (future, when sent).
        self._hops: dict[int, tuple[asyncio.Future[np.ndarray], float]] = {}
        self._sweep: asyncio.TimerHandle | None = None
        self._ids = itertools.count(1)
        self.sent = 0  # chunks sent this way (stats, tests)

    def ready(self, generation: int) -> bool:
        """Whether chunks of a state of link generation ``generation`` can go this way; if
        not, a channel for the link's current generation is started (once)."""
        if self._transport is not None and self.generation == generation:
            return True
        now = self._loop.time()
        if (
            self._connecting is None
            and self._link.unavailable_reason is None
            and now - self._tried_at >= RETRY_S
        ):
            self._tried_at = now
            self._connecting = self._loop.create_task(self._connect())
        return False

    def hop(self, state: int, chunk: np.ndarray) -> asyncio.Future[np.ndarray]:
        """Send one chunk for host state ``state``; the future gets the engine's output."""
        future: asyncio.Future[np.ndarray] = self._loop.create_future()
        transport = self._transport
        if transport is None:
            future.set_exception(EngineUnavailable("the model host's channel closed"))
            return future
        hop = next(self._ids)
        self._hops[hop] = (future, self._loop.time())
        self.sent += 1
        payload = np.ascontiguousarray(chunk, np.float32).tobytes()
        transport.write(encode({"t": "hop", "h": hop, "state": state}, payload))
        if self._sweep is None:
            self._sweep = self._loop.call_later(HOP_TIMEOUT_S, self._sweep_hops)
        return future

    def close(self) -> None:
        if self._connecting is not None:
            self._connecting.cancel()
        if self._transport is not None:
            self._transport.close()

    # --- the connection ------------------------------------------------------------------

    async def _connect(self) -> None:
        generation, number = self._link.generation, self._link.connection
        try:
            transport, _ = await self._loop.create_unix_connection(lambda: self, self._link.path)
        except OSError as exc:
            log.info("no channel to the model host yet (%s): chunks go through the link", exc)
            return
        finally:
            self._connecting = None
        if generation != self._link.generation:  # the host went meanwhile: try again later
            transport.close()
            return
        transport.write(encode({"t": "join", "connection": number}))
        self.generation = generation

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._reader = MessageReader()
        self._greeted = False

    def data_received(self, data: bytes) -> None:
        try:
            for header, payload in self._reader.feed(data):
                if not self._greeted:  # the host greets every connection: not this one's news
                    self._greeted = header["t"] == "hello"
                    continue
                if header["t"] != "out":
                    raise ProtocolError(f"unexpected {header['t']!r} on a hop channel")
                self._out(int(header["h"]), header, payload)
        except (ProtocolError, KeyError, TypeError, ValueError) as exc:
            log.warning("the model host's hop channel broke (%s); it is closed", exc)
            if self._transport is not None:
                self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self.generation = 0
        reason = EngineUnavailable(self._link.unavailable_reason or "lost the model host")
        for future, _ in self._hops.values():
            if not future.done():
                future.set_exception(reason)
        self._hops.clear()
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None

    def _out(self, hop: int, header: dict[str, Any], payload: bytes) -> None:
        entry = self._hops.pop(hop, None)
        if entry is None or entry[0].done():
            return  # it timed out, or its session gave up on it
        future = entry[0]
        if "error" in header:
            future.set_exception(
                HostRefused(str(header["error"]), str(header.get("code", "refused")))
            )
        elif len(payload) % 4:
            future.set_exception(HostFailed("the host sent a chunk's output that is not float32"))
        else:
            future.set_result(np.frombuffer(payload, np.float32).copy())

    def _sweep_hops(self) -> None:
        """Fail the chunks unanswered for ``HOP_TIMEOUT_S`` (a host that hangs)."""
        self._sweep = None
        now = self._loop.time()
        while self._hops:
            hop, (future, sent) = next(iter(self._hops.items()))
            if now - sent < HOP_TIMEOUT_S:
                self._sweep = self._loop.call_later(sent + HOP_TIMEOUT_S - now, self._sweep_hops)
                return
            del self._hops[hop]
            if not future.done():
                future.set_exception(
                    EngineUnavailable(
                        f"the model host did not answer a chunk in {HOP_TIMEOUT_S:g} s"
                    )
                )
