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
import logging

import numpy as np

from media.engines.base import EngineUnavailable
from media.engines.hosted.hops import HopsInFlight
from media.engines.hosted.link import HostLink
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
        self._hops = HopsInFlight(loop)
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
        hop = self._hops.add(future)
        self.sent += 1
        payload = np.ascontiguousarray(chunk, np.float32).tobytes()
        transport.write(encode({"t": "hop", "h": hop, "state": state}, payload))
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
                self._hops.answer(int(header["h"]), header, payload)
        except (ProtocolError, KeyError, TypeError, ValueError) as exc:
            log.warning("the model host's hop channel broke (%s); it is closed", exc)
            if self._transport is not None:
                self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self.generation = 0
        self._hops.fail_all(
            EngineUnavailable(self._link.unavailable_reason or "lost the model host")
        )
