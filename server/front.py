"""The front process: one public HTTP endpoint in front of one worker process per core.

A Python process saturates one core with aiortc's per-packet work, so the server runs N
workers, each with its own event loop, aiortc stack and engines. The front owns no media:
it serves the page, places each new session on the least-loaded worker (live sessions,
then measured CPU), forwards every later request for that session to its worker (the
worker's prefix is part of the session id, so routing needs no shared state), and refuses
new sessions with 503 at once when the whole server is at capacity.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

from server.app import register_page
from server.config import Settings
from server.sessions import RETRY_AFTER_SECONDS
from server.worker import session_prefix
from signaling.errors import ApiError, json_errors

log = logging.getLogger(__name__)

LOAD_POLL_SECONDS = 0.5
WORKER_START_TIMEOUT_S = 120.0
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "upgrade", "host", "content-length"}
)
FRONT_KEY: web.AppKey[Front] = web.AppKey("front")


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
    _poller: asyncio.Task[None] | None = None
    _tmp: tempfile.TemporaryDirectory[str] | None = None

    async def start(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="cosyrtc-")
        for index in range(self.settings.workers):
            path = os.path.join(self._tmp.name, f"worker{index}.sock")
            command = [sys.executable, "-m", "server", "worker", "--index", str(index)]
            command += ["--socket", path, *self.worker_args]
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
            async with worker.http.get("http://worker/internal/load") as response:
                load = await response.json()
        except (aiohttp.ClientError, TimeoutError):
            return
        worker.sessions, worker.cpu = load["sessions"], load["cpu"]

    def place(self) -> Worker:
        """The least-loaded live worker, or 503 when the server is full."""
        live = [w for w in self.workers if w.alive]
        total = sum(w.sessions + w.placing for w in live)
        if not live or total >= self.settings.max_sessions:
            raise ApiError(
                503,
                "at_capacity",
                "The server is at capacity; retry shortly.",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        return min(live, key=lambda w: w.load)

    def owner(self, session_id: str) -> Worker:
        for worker in self.workers:
            if session_id.startswith(session_prefix(worker.index)) and worker.alive:
                return worker
        raise ApiError(404, "session_not_found", "No live session has that id.")

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


async def forward(request: web.Request, worker: Worker) -> web.StreamResponse:
    """Send ``request`` to ``worker`` and relay its answer, streaming event streams."""
    assert worker.http is not None
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
    body = await request.read() if request.can_read_body else None
    try:
        upstream = await worker.http.request(
            request.method, f"http://worker{request.path_qs}", headers=headers, data=body
        )
    except aiohttp.ClientError as exc:
        raise ApiError(502, "worker_unavailable", "The session's worker did not answer.") from exc
    async with upstream:
        reply_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
        if upstream.content_type == "text/event-stream":
            response = web.StreamResponse(status=upstream.status, headers=reply_headers)
            await response.prepare(request)
            with contextlib.suppress(ConnectionResetError, aiohttp.ClientPayloadError):
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
            return response
        return web.Response(
            status=upstream.status, body=await upstream.read(), headers=reply_headers
        )


async def _place_and_forward(request: web.Request) -> web.StreamResponse:
    front = request.app[FRONT_KEY]
    worker = front.place()
    worker.placing += 1
    try:
        response = await forward(request, worker)
    finally:
        worker.placing -= 1
    if response.status in (200, 201):
        worker.sessions += 1  # counted now; the next load reading confirms it
    return response


async def _to_owner(request: web.Request) -> web.StreamResponse:
    front = request.app[FRONT_KEY]
    return await forward(request, front.owner(request.match_info["session_id"]))


async def _to_any(request: web.Request) -> web.StreamResponse:
    front = request.app[FRONT_KEY]
    live = [w for w in front.workers if w.alive]
    if not live:
        raise ApiError(503, "no_workers", "No worker process is running.")
    return await forward(request, live[0])


def create_front_app(settings: Settings, worker_args: Sequence[str]) -> web.Application:
    app = web.Application(middlewares=[json_errors], client_max_size=settings.max_body_bytes)
    front = Front(settings, worker_args)
    app[FRONT_KEY] = front
    app.router.add_get("/engines", _to_any)
    for path in ("/offer", "/whip", "/whip/{engine}"):
        app.router.add_post(path, _place_and_forward)
    for path in ("/whip", "/whip/{engine}"):
        app.router.add_route("OPTIONS", path, _to_any)
    session_paths = (
        "/sessions/{session_id}",
        "/sessions/{session_id}/{action}",
        "/whip/sessions/{session_id}",
    )
    for path in session_paths:
        app.router.add_route("*", path, _to_owner)
    register_page(app)

    async def on_startup(app: web.Application) -> None:
        await front.start()

    async def on_cleanup(app: web.Application) -> None:
        await front.close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
