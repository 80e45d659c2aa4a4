"""One gRPC channel to one Triton server, on an event loop thread of its own.

Why a loop of its own: ``grpc.aio`` objects belong to the loop that made them, and the
engine is called from the speak pipeline's engine threads (``synthesize`` is a blocking
generator), never from the server's loop; engines know nothing about the server, and the
server's loop carries signaling and RTP, where decoding seconds of audio from protobuf
would be a stall. So the link runs one loop in one daemon thread for all the engine's
streams. Engine threads hand it work with ``asyncio.run_coroutine_threadsafe`` and read the
audio from a :class:`~media.engines.streamed_frames.FrameQueue`; nothing they do blocks the
link's loop, and nothing the link does runs on the server's.

Health: the link probes the server (server ready, model ready, model config checked
against the contract) and, while those pass, takes new streams. It notices a loss when a
stream fails with ``UNAVAILABLE``, when the channel leaves ``READY`` (a server that exits
closes its connections), or at the next periodic probe; it then refuses new streams with a
sentence saying why, and probes again with a doubling delay (``RETRY_FIRST_S`` up to the
``reconnect_max`` setting) until the server is back. gRPC's own reconnection backoff is set
to the same bounds, so a server that comes back is connected to within one delay.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from media.engines.cosyvoice_triton.contract import ContractError, ServedModel, served_model
from media.engines.loop_thread import LoopThread

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRY_FIRST_S = 0.25
HEALTH_CHECK_S = 5.0  # a ready server is probed again this often (model unloaded, ...)
CLOSE_JOIN_S = 5.0
# As tritonclient's own client: responses carry seconds of audio, a prompt up to 30 s.
MAX_MESSAGE_BYTES = 2**31 - 1


@dataclass(frozen=True)
class LinkSettings:
    url: str  # HOST:PORT of the gRPC endpoint
    model: str
    tls: bool = False
    tls_ca: Path | None = None  # PEM roots; None: the system's
    connect_timeout: float = 5.0
    reconnect_max: float = 5.0


def _status(error: grpc.aio.AioRpcError) -> str:
    details = (error.details() or "").strip()
    return f"{error.code().name}: {details}" if details else error.code().name


class TritonLink:
    """The channel, its health, and the loop thread that runs every stream."""

    def __init__(self, settings: LinkSettings) -> None:
        self.settings = settings
        self._thread = LoopThread("triton-link")
        self._loop = self._thread.loop
        self._ready = threading.Event()
        self._probed = threading.Event()  # the first probe has an answer, good or bad
        self._reason: str | None = f"not connected to the Triton server at {settings.url} yet"
        self._served: ServedModel | None = None
        self._channel: grpc.aio.Channel | None = None
        self._stub: service_pb2_grpc.GRPCInferenceServiceStub | None = None
        self._lost: asyncio.Event | None = None
        self._closing = False
        self.losses = 0  # times the server was lost after being ready (stats, tests)
        self.submit(self._watch())

    # --- what the engine reads (any thread) ------------------------------------------------

    @property
    def unavailable_reason(self) -> str | None:
        """None while the server takes streams; otherwise a sentence saying why not."""
        return None if self._ready.is_set() else self._reason

    @property
    def served(self) -> ServedModel | None:
        return self._served

    def wait_until_ready(self, timeout: float) -> bool:
        return self._ready.wait(timeout)

    def wait_for_first_probe(self, timeout: float) -> bool:
        return self._probed.wait(timeout)

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> Future[T]:
        """Run ``coroutine`` on the link's loop; the future is for the calling thread."""
        return self._thread.submit(coroutine)

    def call_soon(self, callback: Any, *args: Any) -> None:
        """Run ``callback(*args)`` on the link's loop (from any thread; a no-op once closed)."""
        self._thread.call_soon(callback, *args)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    # --- what streams use (on the loop) ----------------------------------------------------

    def stub(self) -> service_pb2_grpc.GRPCInferenceServiceStub:
        """The stub of the live channel; raises ``ConnectionError`` while there is none."""
        if self._stub is None or not self._ready.is_set():
            raise ConnectionError(self._reason or "the Triton server is not connected")
        return self._stub

    def lost(self, reason: str) -> None:
        """A stream found the server gone: refuse new streams and start probing."""
        if self._ready.is_set():
            self._down(f"lost the Triton server at {self.settings.url} ({reason})")
        if self._lost is not None:
            self._lost.set()

    # --- health ----------------------------------------------------------------------------

    def _new_channel(self) -> grpc.aio.Channel:
        retry_ms = int(RETRY_FIRST_S * 1000)
        options = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.initial_reconnect_backoff_ms", retry_ms),
            ("grpc.min_reconnect_backoff_ms", retry_ms),
            ("grpc.max_reconnect_backoff_ms", int(self.settings.reconnect_max * 1000)),
        ]
        if not self.settings.tls:
            return grpc.aio.insecure_channel(self.settings.url, options=options)
        roots = self.settings.tls_ca.read_bytes() if self.settings.tls_ca else None
        credentials = grpc.ssl_channel_credentials(root_certificates=roots)
        return grpc.aio.secure_channel(self.settings.url, credentials, options=options)

    async def _probe(self, stub: service_pb2_grpc.GRPCInferenceServiceStub) -> str | None:
        """None when the server and the model are ready and the model fits the contract."""
        url, model, timeout = self.settings.url, self.settings.model, self.settings.connect_timeout
        try:
            server = await stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=timeout)
            if not server.ready:
                return f"the Triton server at {url} is not ready"
            ready = await stub.ModelReady(
                service_pb2.ModelReadyRequest(name=model), timeout=timeout
            )
            if not ready.ready:
                return f"the Triton server at {url} has no ready model '{model}'"
            config = await stub.ModelConfig(
                service_pb2.ModelConfigRequest(name=model), timeout=timeout
            )
            self._served = served_model(config.config)
        except grpc.aio.AioRpcError as exc:
            return f"the Triton server at {url} does not answer ({_status(exc)})"
        except ContractError as exc:
            return f"the Triton server at {url} serves an unexpected model: {exc}"
        return None

    async def _watch(self) -> None:
        """Probe until ready, watch while ready, and start over when the server is lost."""
        self._lost = asyncio.Event()
        self._channel = self._new_channel()
        stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        delay = RETRY_FIRST_S
        while not self._closing:
            reason = await self._probe(stub)
            if reason is None:
                delay = RETRY_FIRST_S
                self._up(stub)
                self._probed.set()
                await self._until_lost()
                continue
            self._down(reason)
            self._probed.set()
            await asyncio.sleep(delay)
            delay = min(2 * delay, self.settings.reconnect_max)

    async def _until_lost(self) -> None:
        """Return when the channel leaves READY, a stream reports a loss, or it is time to
        probe again."""
        assert self._channel is not None and self._lost is not None
        self._lost.clear()
        state = self._channel.get_state(try_to_connect=False)
        changed = asyncio.ensure_future(self._channel.wait_for_state_change(state))
        lost = asyncio.ensure_future(self._lost.wait())
        try:
            await asyncio.wait(
                {changed, lost}, timeout=HEALTH_CHECK_S, return_when="FIRST_COMPLETED"
            )
        finally:
            changed.cancel()
            lost.cancel()
            await asyncio.gather(changed, lost, return_exceptions=True)

    def _up(self, stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
        self._stub = stub
        if not self._ready.is_set():
            log.info("Triton server at %s ready (model %s)", self.settings.url, self.settings.model)
        self._reason = None
        self._ready.set()

    def _down(self, reason: str) -> None:
        if self._ready.is_set():
            self.losses += 1
            log.warning("%s; reconnecting", reason)
        elif reason != self._reason:
            log.warning("%s; retrying", reason)
        self._reason = reason
        self._ready.clear()

    # --- the end ---------------------------------------------------------------------------

    def close(self) -> None:
        """Cancel every stream, close the channel and stop the loop thread."""
        if self._closing:
            return
        self._closing = True
        self._ready.clear()
        self._reason = "the engine is closed"
        try:
            self._thread.stop(self._shutdown())
        except Exception:  # a loop that cannot finish in time is left to the daemon thread
            log.exception("the Triton link did not close cleanly")

    async def _shutdown(self) -> None:
        """Close the channel (which cancels the streams still open), then end every task."""
        if self._channel is not None:
            await self._channel.close(grace=None)
        current = asyncio.current_task()
        tasks = [task for task in asyncio.all_tasks() if task is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
