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
import json
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

from server import observability, refusals
from server.app import register_page
from server.config import Settings
from server.prompt_routes import MAX_PROMPT_BYTES
from server.security import protect
from server.worker import session_prefix
from signaling.bodies import read_body
from signaling.errors import ApiError, json_errors

log = logging.getLogger(__name__)

LOAD_POLL_SECONDS = 0.5
WORKER_EXIT_MARGIN_S = 10.0
WORKER_START_TIMEOUT_S = 120.0
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "upgrade", "host", "content-length"}
)
FRONT_KEY: web.AppKey[Front] = web.AppKey("front")
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
            if session_id.startswith(session_prefix(worker.index)) and worker.alive:
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


def _body_limit(request: web.Request) -> int:
    """The most the front buffers of a body: the worker applies each route's own cap, and a
    voice prompt clip is far larger than the offers and text every other route takes."""
    if request.match_info.get("action") == "prompt":
        return MAX_PROMPT_BYTES
    return request.app[FRONT_KEY].settings.max_body_bytes


async def forward(
    request: web.Request, worker: Worker, body: bytes | None = None
) -> web.StreamResponse:
    """Send ``request`` (with ``body`` when already read) to ``worker`` and relay its answer,
    streaming event streams."""
    assert worker.http is not None
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
    if body is None and request.can_read_body:
        body = await read_body(request, _body_limit(request))
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


def _resumed_session(body: bytes) -> str | None:
    """The session id an offer asks to resume, if it does; the worker checks the rest."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None  # the worker gives the precise error
    resume = payload.get("resume") if isinstance(payload, dict) else None
    session_id = resume.get("session_id") if isinstance(resume, dict) else None
    return session_id if isinstance(session_id, str) else None


async def _place_and_forward(request: web.Request) -> web.StreamResponse:
    """A new session goes to the least-loaded worker; a resumed one to the worker that has it
    (it holds its slot already, so capacity does not apply)."""
    front = request.app[FRONT_KEY]
    body = await read_body(request, _body_limit(request))
    resumed = _resumed_session(body) if request.content_type == "application/json" else None
    if resumed is not None:
        return await forward(request, front.owner(resumed), body)
    worker = front.place()
    worker.placing += 1
    try:
        response = await forward(request, worker, body)
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


async def drain_front(app: web.Application) -> None:
    """On SIGTERM: refuse new sessions while the workers drain theirs."""
    await app[FRONT_KEY].drain()


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
    protect(app, settings, register_page(app))
    observability.register_front(app, front)

    async def on_startup(app: web.Application) -> None:
        await front.start()

    async def on_cleanup(app: web.Application) -> None:
        await front.close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
