"""The model host process (``python -m server host``): the hostable engines, loaded once,
served to every media worker over a Unix socket.

The front starts one beside its workers (``--model-host auto``) and restarts it when it
exits; an operator may run one alone and point workers, or single-process servers, at it
(``--model-host unix:PATH``). It loads only the engines that declare they can be hosted
(``EnginePlugin.hostable``); the others stay in the workers.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from media.engines.registry import EngineRegistry
from server.config import Settings
from server.deploy.engines import hostable_names, load_engines
from server.deploy.parent import die_with_parent
from server.host.service import ModelHost

log = logging.getLogger(__name__)


def run_host(settings: Settings, socket_path: str, with_parent: bool) -> int:
    if with_parent:
        die_with_parent()
    names = hostable_names(settings)
    registry = load_engines(settings, names) if names else EngineRegistry()
    try:
        asyncio.run(_serve(ModelHost(registry, settings.host_loops), socket_path))
    finally:
        registry.close()
    return 0


async def _serve(host: ModelHost, socket_path: str) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await host.start(socket_path)
    print(f"cosyrtc model host is running on {socket_path}", flush=True)
    await stop.wait()
    log.info("model host: stopping")
    await host.close()
