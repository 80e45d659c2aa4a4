"""The model host's socket: every worker connects here and is served by one connection.

The host loads the hostable engines once (one copy of each model per host, whatever the
number of workers) and runs every engine call of every worker's sessions on one pool of
compute threads (``host_loops``), most urgent first across all of them (see
``server.host.utterance``). Its event loop only moves messages and copies audio into the
rings; the engines' work runs on the pool's threads and in the engines' own batch loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from pathlib import Path
from typing import Any

from media.engines.base import Engine, SpeakEngine, TransformEngine
from media.engines.hosted.description import describe_for_host
from media.engines.registry import EngineRegistry
from media.pipeline.executor import PriorityPool
from server.host.connection import WorkerConnection

log = logging.getLogger(__name__)


class ModelHost:
    """The loaded engines, the compute threads, and the workers' connections."""

    def __init__(self, registry: EngineRegistry, loops: int) -> None:
        self.registry = registry
        self.engines: dict[str, Engine[Any]] = {
            engine.name: engine
            for engine in registry.engines
            if isinstance(engine, (SpeakEngine, TransformEngine))
        }
        self.loops = loops or os.cpu_count() or 1
        self.pool = PriorityPool(self.loops, thread_name_prefix="host")
        self.connections: dict[int, WorkerConnection] = {}  # by number
        self._numbers = itertools.count(1)
        self._server: asyncio.AbstractServer | None = None

    @property
    def hello(self) -> dict[str, Any]:
        return {
            "t": "hello",
            "pid": os.getpid(),
            "engines": [describe_for_host(engine) for engine in self.engines.values()],
            "unavailable": self.registry.unavailable,
        }

    async def start(self, path: str) -> None:
        """Listen on ``path`` (a stale socket of an earlier host is replaced)."""
        with contextlib.suppress(FileNotFoundError):
            Path(path).unlink()
        self._server = await asyncio.start_unix_server(self._accept, path)
        log.info(
            "model host on %s: %s, %d compute threads",
            path,
            ", ".join(self.engines) or "no engines",
            self.loops,
        )

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = next(self._numbers)
        connection = WorkerConnection(
            self.engines, self.pool, reader, writer, number, self.connections
        )
        self.connections[number] = connection
        try:
            await connection.serve(self.hello)
        finally:
            del self.connections[number]

    @property
    def live_utterances(self) -> int:
        return sum(len(connection.utterances) for connection in self.connections.values())

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections.values()):
            connection.close()
        while self.connections:
            await asyncio.sleep(0.01)
        self.pool.shutdown(wait=False, cancel_futures=True)
