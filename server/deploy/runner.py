"""Serving an app until SIGTERM or SIGINT, draining live sessions before it stops.

aiohttp's ``run_app`` closes the listening socket first and then cancels what is running,
so a deploy would cut every call mid-sentence and new offers would meet a refused
connection instead of a clear 503. Here the first signal starts the app's drain (stop
admitting, let sessions finish up to the drain timeout) while the socket stays open for
the live sessions' requests; a second signal skips the rest of the wait.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import ssl
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web
from aiohttp.log import access_logger

log = logging.getLogger(__name__)

Drain = Callable[[web.Application], Coroutine[Any, Any, None]]
SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def _serve_until_signalled(
    app: web.Application,
    make_site: Callable[[web.AppRunner], web.BaseSite],
    drain: Drain,
    access_log: logging.Logger | None,
) -> None:
    loop = asyncio.get_running_loop()
    signalled = asyncio.Event()
    for signum in SHUTDOWN_SIGNALS:
        loop.add_signal_handler(signum, signalled.set)
    runner = web.AppRunner(app, handle_signals=False, access_log=access_log)
    await runner.setup()
    try:
        await make_site(runner).start()
        freeze_startup_objects()
        await signalled.wait()
        signalled.clear()
        log.info("shutting down: draining")
        draining = asyncio.create_task(drain(app))
        hurry = asyncio.create_task(signalled.wait())
        await asyncio.wait({draining, hurry}, return_when=asyncio.FIRST_COMPLETED)
        if not draining.done():
            log.info("second signal: not waiting for the drain")
            draining.cancel()
        hurry.cancel()
        await asyncio.gather(draining, hurry, return_exceptions=True)
    finally:
        for signum in SHUTDOWN_SIGNALS:
            loop.remove_signal_handler(signum)
        await runner.cleanup()


def freeze_startup_objects() -> None:
    """Keep what start-up built (modules, models, the app) out of every later collection.

    A closed session is freed by the cyclic garbage collector (aiortc's objects refer to
    one another), and a full collection walks every tracked object: with the engines
    loaded that took 80-150 ms on the event loop, a gap in every call. Frozen, start-up
    objects are skipped, so a collection walks little more than the live sessions.
    """
    gc.collect()
    gc.freeze()


def serve_tcp(
    app: web.Application,
    host: str,
    port: int,
    drain: Drain,
    ssl_context: ssl.SSLContext | None = None,
) -> None:
    """Serve on ``host:port`` (HTTPS with ``ssl_context``) until signalled, then drain."""

    def site(runner: web.AppRunner) -> web.BaseSite:
        return web.TCPSite(runner, host, port, ssl_context=ssl_context)

    asyncio.run(_serve_until_signalled(app, site, drain, access_logger))


def serve_unix(app: web.Application, path: str, drain: Drain) -> None:
    """Serve on a Unix socket (a worker behind the front) until signalled, then drain.

    No access log: the front logs every request it forwards.
    """
    asyncio.run(_serve_until_signalled(app, lambda runner: web.UnixSite(runner, path), drain, None))
