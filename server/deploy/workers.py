"""The front's worker processes: started, watched, loaded, placed on, drained and stopped.

Each worker is ``python -m server worker`` on a Unix socket of its own. The front polls
every worker's ``/internal/load`` twice a second; placement takes the live worker with the
fewest sessions (counting offers still being answered), then the least CPU.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from server.config import Settings
from server.http.routes import worker_prefix
from server.sessions import refusals
from signaling.errors import ApiError

log = logging.getLogger(__name__)

LOAD_POLL_SECONDS = 0.5
WORKER_EXIT_MARGIN_S = 10.0
WORKER_START_TIMEOUT_S = 120.0
# The front sees each client's address and limits new sessions per address; every request a
# worker gets comes from the front's socket, so a limit there would count all clients as one.
WORKER_OVERRIDES = ("--rate-limit", "0")


@dataclass
class Worker:
    index: int
    socket_path: str
    process: subprocess.Popen[bytes]
    http: aiohttp.ClientSession | None = None
    sessions: int = 0
    cpu: float = 0.0
    placing: int = 0  # offers forwarded and not answered yet
    alive: bool = True

    @property
    def load(self) -> tuple[int, float]:
        return (self.sessions + self.placing, self.cpu)


@dataclass
class Front:
    settings: Settings
    worker_args: Sequence[str]
    workers: list[Worker] = field(default_factory=list)
    draining: bool = False  # shutting down: /readyz answers 503 so no new sessions come
    _poller: asyncio.Task[None] | None = None
    _tmp: tempfile.TemporaryDirectory[str] | None = None

    async def start(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="cosyrtc-")
        for index in range(self.settings.workers):
            path = os.path.join(self._tmp.name, f"worker{index}.sock")
            command = [sys.executable, "-m", "server", "worker", "--index", str(index)]
            command += ["--socket", path, *self.worker_args, *WORKER_OVERRIDES]
            process = subprocess.Popen(command)
            self.workers.append(Worker(index, path, process))
        await asyncio.gather(*(self._connect(worker) for worker in self.workers))
        self._poller = asyncio.create_task(self._poll_load())
        log.info("front: %d workers ready", len(self.workers))

    async def _connect(self, worker: Worker) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WORKER_START_TIMEOUT_S
        while not Path(worker.socket_path).exists():
            if worker.process.poll() is not None:
                raise RuntimeError(f"worker {worker.index} exited while starting")
            if loop.time() > deadline:
                raise RuntimeError(f"worker {worker.index} did not start")
            await asyncio.sleep(0.1)  # start-up only: engines take seconds to load
        connector = aiohttp.UnixConnector(path=worker.socket_path)
        worker.http = aiohttp.ClientSession(connector=connector)

    async def _poll_load(self) -> None:
        while True:
            await asyncio.gather(*(self._read_load(w) for w in self.workers if w.alive))
            await asyncio.sleep(LOAD_POLL_SECONDS)

    async def _read_load(self, worker: Worker) -> None:
        assert worker.http is not None
        if worker.process.poll() is not None:
            worker.alive = False
            log.error("front: worker %d exited with %s", worker.index, worker.process.returncode)
            return
        try:
            async with worker.http.get(
                "http://worker/internal/load", headers=self._own_headers()
            ) as response:
                load = await response.json()
        except (aiohttp.ClientError, TimeoutError):
            return
        worker.sessions, worker.cpu = load["sessions"], load["cpu"]

    def _own_headers(self) -> dict[str, str]:
        """Credentials for the front's own requests: workers check the same token."""
        token = self.settings.auth_token
        return {"Authorization": f"Bearer {token}"} if token else {}

    def place(self) -> Worker:
        """The least-loaded live worker, or 503 when the server is full."""
        if self.draining:
            raise refusals.draining()
        live = [w for w in self.workers if w.alive]
        total = sum(w.sessions + w.placing for w in live)
        if not live or total >= self.settings.max_sessions:
            raise refusals.at_capacity()
        return min(live, key=lambda w: w.load)

    def owner(self, session_id: str) -> Worker:
        for worker in self.workers:
            if session_id.startswith(worker_prefix(worker.index)) and worker.alive:
                return worker
        raise ApiError(404, "session_not_found", "No live session has that id.")

    async def drain(self) -> None:
        """Refuse new sessions; each worker drains its own (SIGTERM) and exits when done.

        The front keeps forwarding the live sessions' requests meanwhile.
        """
        self.draining = True
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.process.terminate()
        waits = [asyncio.to_thread(self._wait_exit, worker) for worker in self.workers]
        await asyncio.gather(*waits)

    def _wait_exit(self, worker: Worker) -> None:
        """Runs in a thread: a worker gets its drain timeout, plus time to close up."""
        try:
            worker.process.wait(self.settings.drain_timeout + WORKER_EXIT_MARGIN_S)
        except subprocess.TimeoutExpired:
            log.warning("front: worker %d still draining; it will be stopped", worker.index)

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        for worker in self.workers:
            if worker.http is not None:
                await worker.http.close()
            worker.process.terminate()
        for worker in self.workers:
            try:
                await asyncio.to_thread(worker.process.wait, 15)
            except subprocess.TimeoutExpired:
                worker.process.kill()
        if self._tmp is not None:
            self._tmp.cleanup()
