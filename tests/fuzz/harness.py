"""The server under fuzzing and the client that feeds it, each on an event loop of its own.

The server runs on its own loop thread, as it would in its own process, so every error it
reports (an exception escaping a request handler, a coroutine that died, an error logged from
its threads) is told apart from anything the client side does; hypothesis drives plain
synchronous tests and hands each input to the client loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import threading
from collections import Counter
from collections.abc import AsyncIterable, Coroutine, Mapping
from contextlib import AsyncExitStack
from typing import Any, TypeVar

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError
from multidict import CIMultiDict

from media.engines.registry import EngineRegistry
from server.config import Settings
from tests.conftest import RunningServer, running_server
from tests.fuzz.expect import Reply

T = TypeVar("T")

# Inputs sent per family, across the whole run (printed in the terminal summary).
INPUTS: Counter[str] = Counter()
# Sessions that valid fuzzed inputs opened (and the suite closed again), per family.
OPENED: Counter[str] = Counter()
REQUEST_TIMEOUT_S = 30.0
# Limits for fuzzing: a small body cap (fast to cross, still above a 4000-character speak
# text), room for every session an input opens, no per-address or per-channel rate limit,
# and sessions that wait for their DELETE rather than for ICE.
FUZZ_SETTINGS: Mapping[str, Any] = {
    "max_body_bytes": 8192,
    "max_sessions": 10_000,
    "rate_limit": 0,
    "dc_max_messages": 10_000,
    "ice_timeout": 600.0,
}


class LoopThread:
    """An asyncio loop running forever on a daemon thread; ``run`` waits for a coroutine."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = REQUEST_TIMEOUT_S) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        async def cancel_the_rest() -> None:
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for coroutine in pending:
                coroutine.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            await self.loop.shutdown_asyncgens()

        self.run(cancel_the_rest())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class ErrorTrap(logging.Handler):
    """Collects every sign of a server crash: loop exception handler calls, ERROR logs from
    any thread but the client's, and exceptions that end a thread.

    aiohttp logs a request its HTTP parser refuses (400 to a client sending broken HTTP) at
    ERROR too; that is the protocol working, not a crash, and the one kind of record let through.
    """

    def __init__(self, client_thread: int | None) -> None:
        super().__init__(logging.ERROR)
        self._client_thread = client_thread
        self.errors: list[str] = []
        self._previous_hook = threading.excepthook

    def install(self, server_loop: asyncio.AbstractEventLoop) -> None:
        logging.getLogger().addHandler(self)
        server_loop.set_exception_handler(self._on_loop_error)
        threading.excepthook = self._on_thread_error

    def uninstall(self) -> None:
        logging.getLogger().removeHandler(self)
        threading.excepthook = self._previous_hook

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self._client_thread:
            return
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError) and exc.code < 500:
            return
        self.errors.append(f"log {record.name}: {record.getMessage()} ({exc!r})")

    def _on_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        self.errors.append(f"loop: {context.get('message')} ({context.get('exception')!r})")

    def _on_thread_error(self, args: threading.ExceptHookArgs) -> None:
        if args.thread is not None and args.thread.ident == self._client_thread:
            return
        self.errors.append(f"thread {args.thread}: {args.exc_value!r}")

    def check(self) -> None:
        """Fail on anything collected since the last check (and forget it)."""
        errors, self.errors = self.errors, []
        assert not errors, "the server reported errors:\n" + "\n".join(errors)


def rss_bytes() -> int:
    """This process's resident set size now (Linux), once the C heap has handed its free
    pages back: otherwise RSS depends as much on how fragmented glibc's heap happens to be
    (tens of MB either way) as on what is alive."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: measure as it is
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class FuzzServer:
    """A running server with fuzzing limits, an HTTP client for it, and its error trap."""

    def __init__(self, registry: EngineRegistry, **settings: Any) -> None:
        self._registry = registry
        self._settings = settings
        self.server_loop = LoopThread("fuzz-server")
        self.client = LoopThread("fuzz-client")
        self.trap = ErrorTrap(self.client.ident)
        self._stack = AsyncExitStack()
        self.running: RunningServer | None = None
        self.http: aiohttp.ClientSession | None = None

    def start(self) -> FuzzServer:
        self.trap.install(self.server_loop.loop)
        serving = running_server(self._registry, **self._settings)
        self.running = self.server_loop.run(self._stack.enter_async_context(serving))
        self.http = self.client.run(self._new_http())
        return self

    async def _new_http(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S))

    def stop(self) -> None:
        if self.http is not None:
            self.client.run(self.http.close())
        self.client.close()
        self.server_loop.run(self._stack.aclose())
        self.server_loop.close()
        self.trap.uninstall()

    @property
    def url(self) -> str:
        assert self.running is not None
        return self.running.url

    @property
    def settings(self) -> Settings:
        assert self.running is not None
        return self.running.server.settings

    @property
    def live_sessions(self) -> int:
        assert self.running is not None
        return len(self.running.server.sessions)

    def request(
        self,
        method: str,
        path: str,
        body: bytes | AsyncIterable[bytes] | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> Reply:
        """Send one request exactly as given: no Content-Type unless ``headers`` has one."""
        return self.client.run(self._request(method, path, body, headers, params))

    async def _request(
        self,
        method: str,
        path: str,
        body: bytes | AsyncIterable[bytes] | None,
        headers: Mapping[str, str] | None,
        params: Mapping[str, str] | None,
    ) -> Reply:
        assert self.http is not None
        skip = () if headers and "Content-Type" in headers else ("Content-Type",)
        async with self.http.request(
            method,
            self.url + path.lstrip("/"),
            data=body,
            headers=dict(headers or {}),
            params=params,
            skip_auto_headers=skip,
        ) as response:
            return Reply(
                method,
                path,
                response.status,
                CIMultiDict(response.headers),
                response.content_type,
                await response.read(),
            )

    def end_session(self, session_id: str) -> None:
        """DELETE a session an input opened (valid offers open real ones)."""
        reply = self.request("DELETE", f"sessions/{session_id}")
        assert reply.status == 200, reply.describe()
