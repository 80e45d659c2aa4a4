"""The front's worker processes: started, supervised, loaded, placed on, drained, stopped.

Each worker is ``python -m server worker`` on a Unix socket of its own. With hostable
engines chosen and ``--model-host auto``, one model host (``python -m server host``) is
started first and the workers use its engines; it is restarted at once when it exits,
and the workers reconnect to the new one. The front polls
every worker's ``/internal/load`` twice a second; placement takes the serving worker with
the fewest sessions (counting offers still being answered), then the least CPU.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from server.config import Settings
from server.deploy.engines import hostable_names
from server.http.routes import worker_prefix
from server.sessions import refusals
from signaling.errors import ApiError

log = logging.getLogger(__name__)

LOAD_POLL_SECONDS = 0.5
HOST_POLL_SECONDS = 0.05  # a host that exits is restarted within this (its load is ~1 s)
WORKER_EXIT_MARGIN_S = 10.0
WORKER_START_TIMEOUT_S = 120.0
# A worker that keeps dying is restarted after a growing pause: this many deaths within the
# window are normal (an out-of-memory kill, a crash); past them each restart waits twice as
# long, up to the cap.
DEATHS_BEFORE_BACKOFF = 3
DEATH_WINDOW_S = 60.0
MAX_RESTART_DELAY_S = 30.0
# The front sees each client's address and limits new sessions per address; every request a
# worker gets comes from the front's socket, so a limit there would count all clients as one.
# The same goes for the per-client session limit: the front enforces it across the workers
# and tells each worker who asked, in a header only the front's socket can send.
CLIENT_HEADER = "X-Cosyrtc-Client"
WORKER_OVERRIDES = (
    "--rate-limit", "0", "--max-client-sessions", "0", "--client-address-header", CLIENT_HEADER,
)  # fmt: skip


@dataclass
class Worker:
    index: int  # never reused: a replacement gets a new index, so a new session id prefix
    socket_path: str
    process: subprocess.Popen[bytes]
    serving: bool  # takes sessions; a spare waits, loaded, to replace one that dies
    http: aiohttp.ClientSession | None = None
    ready: bool = False  # its socket answers
    sessions: int = 0
    cpu: float = 0.0
    placing: int = 0  # offers forwarded and not answered yet
    clients: Counter[str] = field(default_factory=Counter)  # sessions by client, with placing

    @property
    def alive(self) -> bool:
        return self.ready and self.process.poll() is None

    @property
    def load(self) -> tuple[int, float]:
        return (self.sessions + self.placing, self.cpu)


@dataclass
class Front:
    """The worker processes: started, watched, replaced when they die, placed on, drained.

    ``settings.workers`` serve; ``settings.spare_workers`` more wait with their engines
    loaded. A worker that exits is replaced at the next load poll (<= 0.5 s): by a spare at
    once when one is ready (loading engines takes seconds), else by a new process, and a new
    spare is started in the background. A worker that keeps dying is restarted after a
    growing pause. The sessions of a worker that died are gone with its media; requests for
    them get 404 ``session_not_found``.
    """

    settings: Settings
    worker_args: Sequence[str]
    workers: list[Worker] = field(default_factory=list)
    draining: bool = False  # shutting down: /readyz answers 503 so no new sessions come
    refusing: bool = False  # drained by an operator (POST /admin/drain): no new sessions
    engine_names: tuple[str, ...] = ()  # what the workers serve, read from one at start
    restarts: int = 0
    on_restart: Callable[[], None] | None = None
    host: subprocess.Popen[bytes] | None = None  # the model host, when the front runs one
    spare_host: subprocess.Popen[bytes] | None = None  # loaded, on ``spare_host_socket``
    host_restarts: int = 0
    _poller: asyncio.Task[None] | None = None
    _host_watch: asyncio.Task[None] | None = None
    _tmp: tempfile.TemporaryDirectory[str] | None = None
    _indexes: Iterator[int] = field(default_factory=itertools.count)
    _deaths: deque[float] = field(default_factory=deque)
    _starting: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="cosyrtc-")
        if self.settings.model_host == "auto" and hostable_names(self.settings):
            self._spawn_host()
            await self._wait_for_host()
            if self.settings.spare_host:  # it loads while the workers do
                self.spare_host = self._host_process(self.spare_host_socket)
        for _ in range(self.settings.workers):
            self._spawn(serving=True)
        for _ in range(self.spares_wanted):
            self._spawn(serving=False)
        await asyncio.gather(*(self._connect(worker) for worker in self.workers))
        await self._wait_for_spare_host()
        await self._read_engines(self.workers[0])
        self._poller = asyncio.create_task(self._poll_load())
        if self.host is not None:
            self._host_watch = asyncio.create_task(self._watch_host())
        log.info("front: %d workers ready (%d spare)", self.settings.workers, self.spares_wanted)

    @property
    def spares_wanted(self) -> int:
        return self.settings.spare_workers if self.settings.workers > 1 else 0

    # --- the model host ------------------------------------------------------------------

    @property
    def host_socket(self) -> str:
        assert self._tmp is not None
        return os.path.join(self._tmp.name, "host.sock")

    @property
    def spare_host_socket(self) -> str:
        return self.host_socket + ".spare"

    @property
    def host_down(self) -> bool:
        """The front runs a model host and it is not serving (exited, or still loading)."""
        if self.host is None:
            return False
        return self.host.poll() is not None or not Path(self.host_socket).exists()

    def _spawn_host(self) -> None:
        self.host = self._host_process(self.host_socket)

    def _host_process(self, socket_path: str) -> subprocess.Popen[bytes]:
        # A socket left by a host that was killed would look like a host that serves.
        Path(socket_path).unlink(missing_ok=True)
        command = [sys.executable, "-m", "server", "host", "--socket", socket_path]
        return subprocess.Popen([*command, "--with-parent", *self.worker_args])

    async def _wait_for_host(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WORKER_START_TIMEOUT_S
        while self.host_down:
            assert self.host is not None
            if self.host.poll() is not None:
                raise RuntimeError(f"the model host exited while starting ({self.host.returncode})")
            if loop.time() > deadline:
                raise RuntimeError("the model host did not start")
            await asyncio.sleep(0.05)
        log.info("front: model host ready on %s", self.host_socket)

    async def _wait_for_spare_host(self) -> None:
        """Ready means ready to take over: a spare that fails to start is only logged (the
        host is then restarted the slow way, and the spare tried again)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WORKER_START_TIMEOUT_S
        while self.spare_host is not None and not Path(self.spare_host_socket).exists():
            if self.spare_host.poll() is not None or loop.time() > deadline:
                log.warning("front: the spare model host did not start")
                return
            await asyncio.sleep(0.05)

    async def _watch_host(self) -> None:
        while not self.draining:
            self._supervise_host()
            await asyncio.sleep(HOST_POLL_SECONDS)

    def _supervise_host(self) -> None:
        """When the host exited, the spare takes over at once if it is up (its socket is
        renamed into the host's place: a listening Unix socket keeps its connections and
        is found under its new name), else a new host starts; the workers' links reconnect
        to whichever it is. A spare is kept loaded beside it."""
        if self.host is None:
            return
        if self.host.poll() is not None:
            log.error("front: the model host exited with %s", self.host.returncode)
            self.host_restarts += 1
            spare = self.spare_host
            if spare is not None and spare.poll() is None and Path(self.spare_host_socket).exists():
                os.replace(self.spare_host_socket, self.host_socket)
                self.host, self.spare_host = spare, None
                log.info("front: the spare model host (pid %d) serves now", spare.pid)
            else:
                self._spawn_host()
        if self.settings.spare_host and (
            self.spare_host is None or self.spare_host.poll() is not None
        ):
            self.spare_host = self._host_process(self.spare_host_socket)

    # --- workers ---------------------------------------------------------------------------

    def _spawn(self, serving: bool) -> Worker:
        assert self._tmp is not None
        index = next(self._indexes)
        path = os.path.join(self._tmp.name, f"worker{index}.sock")
        command = [sys.executable, "-m", "server", "worker", "--index", str(index)]
        command += ["--socket", path, *self.worker_args, *WORKER_OVERRIDES]
        command += ["--model-host", f"unix:{self.host_socket}" if self.host else "none"]
        worker = Worker(index, path, subprocess.Popen(command), serving)
        self.workers.append(worker)
        return worker

    async def _connect(self, worker: Worker) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WORKER_START_TIMEOUT_S
        while not Path(worker.socket_path).exists():
            if worker.process.poll() is not None:
                raise RuntimeError(f"worker {worker.index} exited while starting")
            if loop.time() > deadline:
                raise RuntimeError(f"worker {worker.index} did not start")
            await asyncio.sleep(0.1)  # engines take seconds to load
        connector = aiohttp.UnixConnector(path=worker.socket_path)
        worker.http = aiohttp.ClientSession(connector=connector)
        worker.ready = True

    # --- supervision ---------------------------------------------------------------------

    async def _poll_load(self) -> None:
        while True:
            await self._supervise()
            await asyncio.gather(*(self._read_load(w) for w in self.workers if w.alive))
            await asyncio.sleep(LOAD_POLL_SECONDS)

    async def _supervise(self) -> None:
        """Replace every worker that exited (not while draining: then exiting is the plan)."""
        if self.draining:
            return
        for worker in [w for w in self.workers if w.process.poll() is not None]:
            self.workers.remove(worker)
            if worker.http is not None:
                await worker.http.close()
            log.error(
                "front: worker %d exited with %s; replacing it",
                worker.index,
                worker.process.returncode,
            )
            self.restarts += 1
            if self.on_restart is not None:
                self.on_restart()
            self._record_death()
            if worker.serving:
                spare = next((w for w in self.workers if not w.serving and w.alive), None)
                if spare is not None:
                    spare.serving = True  # at once: it has its engines loaded
                    log.info("front: spare worker %d now serves", spare.index)
                    self._replace(serving=False)
                else:
                    self._replace(serving=True)
            else:
                self._replace(serving=False)

    def _record_death(self) -> None:
        now = time.monotonic()
        self._deaths.append(now)
        while self._deaths and now - self._deaths[0] > DEATH_WINDOW_S:
            self._deaths.popleft()

    def _restart_delay(self) -> float:
        excess = len(self._deaths) - DEATHS_BEFORE_BACKOFF
        return 0.0 if excess <= 0 else min(MAX_RESTART_DELAY_S, 2.0 ** (excess - 1))

    def _replace(self, serving: bool) -> None:
        task = asyncio.create_task(self._start_replacement(serving, self._restart_delay()))
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    async def _start_replacement(self, serving: bool, delay: float) -> None:
        if delay:
            log.warning("front: workers keep dying; next one starts in %.0f s", delay)
            await asyncio.sleep(delay)
        worker = self._spawn(serving)
        try:
            await self._connect(worker)
        except RuntimeError as exc:
            log.error("front: %s", exc)  # the next poll sees it exited and tries again
        else:
            log.info(
                "front: worker %d started (%s)", worker.index, "serving" if serving else "spare"
            )

    async def _read_engines(self, worker: Worker) -> None:
        assert worker.http is not None
        async with worker.http.get("http://worker/engines", headers=self._own_headers()) as r:
            document = await r.json()
        self.engine_names = tuple(engine["name"] for engine in document["engines"])

    async def _read_load(self, worker: Worker) -> None:
        assert worker.http is not None
        try:
            async with worker.http.get(
                "http://worker/internal/load", headers=self._own_headers()
            ) as response:
                load = await response.json()
        except (aiohttp.ClientError, TimeoutError):
            return
        worker.sessions, worker.cpu = load["sessions"], load["cpu"]
        worker.clients = Counter(load["clients"])

    def _own_headers(self) -> dict[str, str]:
        """Credentials for the front's own requests: workers check the same token."""
        token = self.settings.auth_token
        return {"Authorization": f"Bearer {token}"} if token else {}

    # --- placement -----------------------------------------------------------------------

    @property
    def serving(self) -> list[Worker]:
        return [w for w in self.workers if w.serving and w.alive]

    @property
    def capacity(self) -> int:
        """``--max-sessions``, in proportion to the workers serving now (one down: less)."""
        serving = min(len(self.serving), self.settings.workers)
        return self.settings.max_sessions * serving // self.settings.workers

    @property
    def load(self) -> int:
        return sum(w.sessions + w.placing for w in self.serving)

    def place(self, client: str = "") -> Worker:
        """The least-loaded serving worker, or 503 when the server is full, or 429 when
        ``client`` holds its share of sessions across the workers."""
        if self.draining or self.refusing:
            raise refusals.draining()
        serving = self.serving
        if not serving or self.load >= self.capacity:
            raise refusals.at_capacity()
        limit = self.settings.max_client_sessions
        if limit and client and sum(w.clients[client] for w in self.workers) >= limit:
            raise refusals.client_limit(limit)
        return min(serving, key=lambda w: w.load)

    def owner(self, session_id: str) -> Worker:
        for worker in self.workers:
            if (
                session_id.startswith(worker_prefix(worker.index, self.settings.node_id))
                and worker.alive
            ):
                return worker
        raise ApiError(404, "session_not_found", "No live session has that id.")

    # --- the end -------------------------------------------------------------------------

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
        await self._stop_host()

    async def _stop_host(self) -> None:
        """After the workers: their last utterances were spoken by it."""
        hosts = [host for host in (self.host, self.spare_host) if host is not None]
        for host in hosts:
            if host.poll() is None:
                host.terminate()
        for host in hosts:
            try:
                await asyncio.to_thread(host.wait, 15)
            except subprocess.TimeoutExpired:
                host.kill()

    def _wait_exit(self, worker: Worker) -> None:
        """Runs in a thread: a worker gets its drain timeout, plus time to close up."""
        try:
            worker.process.wait(self.settings.drain_timeout + WORKER_EXIT_MARGIN_S)
        except subprocess.TimeoutExpired:
            log.warning("front: worker %d still draining; it will be stopped", worker.index)

    async def close(self) -> None:
        self.draining = True
        for task in (self._poller, self._host_watch):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        for task in self._starting:
            task.cancel()
        await asyncio.gather(*self._starting, return_exceptions=True)
        for worker in self.workers:
            if worker.http is not None:
                await worker.http.close()
            worker.process.terminate()
        for worker in self.workers:
            try:
                await asyncio.to_thread(worker.process.wait, 15)
            except subprocess.TimeoutExpired:
                worker.process.kill()
        await self._stop_host()
        if self._tmp is not None:
            self._tmp.cleanup()
