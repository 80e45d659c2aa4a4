"""A media worker's one connection to the model host, on an event loop thread of its own.

Why a loop of its own, as ``cosyvoice_triton.link``: the hosted engines are called from the
speak pipeline's threads (``synthesize`` is a blocking generator), and reading the host's
messages on the server's loop would put every utterance's audio copies on the loop that
carries RTP. So one daemon thread reads the socket for every session of the worker; the
synthesis threads wait on their utterance's :class:`FrameQueue`, and hand the link what
they send with ``call_soon``.

A hosted transform engine's audio takes a shorter way: ``hop`` sends a chunk from the
server's loop without waiting (``call_soon``) and returns a future that this thread
resolves when the host's ``out`` comes, which the transform pipeline awaits on its own
loop; no thread waits per session.

The link connects at once and, while connected, takes requests; when the host goes away
(it exited, was killed, or sent something that breaks the protocol) every request waiting
fails, every hop waiting fails and every utterance in progress ends with
:class:`EngineUnavailable`, which the speak
pipeline reports to its caller as an ``error`` event, and the link tries again every
``RETRY_S``. Each connection is a new *generation*: the host's session states belong to
the host process that made them, so an engine re-opens its states after a reconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
from concurrent.futures import Future

import numpy as np

from media.engines.base import EngineUnavailable
from media.engines.hosted.hops import HopsInFlight, HostFailed, HostRefused
from media.engines.hosted.ring import AudioRing
from media.engines.hosted.wire import Header, ProtocolError, encode, read_message
from media.engines.loop_thread import LoopThread
from media.engines.streamed_frames import FrameQueue

log = logging.getLogger(__name__)


RETRY_S = 0.1  # a host restarted by the front is back within a second or two
HELLO_TIMEOUT_S = 5.0


class HostLink:
    """The socket to the host, its shared ring, and the loop thread that reads them."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._ready = threading.Event()
        self._greeted = threading.Event()  # the first hello came
        self.hello: Header = {}  # the first connection's hello: the engines the host serves
        self._reason = f"not connected to the model host at {path} yet"
        self.generation = 0  # connections made; a host state belongs to one of them
        self.connection = 0  # the host's number for the current one (what a hop channel joins)
        self.losses = 0  # connections lost (stats, tests)
        self._writer: asyncio.StreamWriter | None = None
        self._ring: AudioRing | None = None
        self._pending: dict[int, asyncio.Future[Header]] = {}
        self._streams: dict[int, FrameQueue] = {}
        self._ids = itertools.count(1)
        self._closing = False
        self._thread = LoopThread("host-link")
        self._loop = self._thread.loop
        self._hops = HopsInFlight(self._loop)
        self._watcher = self._thread.submit(self._watch())

    # --- any thread ------------------------------------------------------------------------

    @property
    def unavailable_reason(self) -> str | None:
        return None if self._ready.is_set() else self._reason

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def wait_for_hello(self, timeout: float) -> bool:
        return self._greeted.wait(timeout)

    def wait_until_ready(self, timeout: float) -> bool:
        return self._ready.wait(timeout)

    def request(
        self, header: Header, payload: bytes = b"", timeout: float = 30.0
    ) -> tuple[Header, int]:
        """Send a request and wait for its answer: (the answer, the connection's generation).

        Raises :class:`HostRefused` with the host's reason, or ``EngineUnavailable`` while
        (or when) the host is gone.
        """
        future = self._thread.submit(self._request(header, payload))
        try:
            return future.result(timeout)
        except TimeoutError as exc:
            future.cancel()
            raise EngineUnavailable(f"the model host did not answer in {timeout:g} s") from exc

    def request_soon(
        self, header: Header, payload: bytes = b"", timeout: float = 30.0
    ) -> Future[tuple[Header, int]]:
        """:meth:`request` without waiting for it: the future gets its answer or error."""
        return self._thread.submit(self._request(header, payload, timeout))

    def hop(self, state: int, generation: int, chunk: np.ndarray) -> Future[np.ndarray]:
        """Send one chunk of a transform session's audio (float32) to the host state
        ``state``; the future gets the engine's output. Never blocks. A hop for a
        generation that is over fails at once with ``EngineUnavailable``."""
        future: Future[np.ndarray] = Future()
        if self._closing:
            future.set_exception(EngineUnavailable(self._reason))
            return future
        payload = np.ascontiguousarray(chunk, np.float32).tobytes()
        self._thread.call_soon(self._send_hop, future, state, generation, payload)
        return future

    def open_stream(self, header: Header, frames: FrameQueue, generation: int) -> int:
        """Start an utterance whose audio goes to ``frames``; its stream id. An utterance for
        a generation that is over ends at once with ``EngineUnavailable``."""
        stream = next(self._ids)
        self._thread.call_soon(
            self._start_stream, stream, {**header, "s": stream}, frames, generation
        )
        return stream

    def took(self, stream: int, samples: int) -> None:
        """Tell the host how much of a stream its reader has taken (the host's credit)."""
        self._thread.call_soon(self._send, {"t": "took", "s": stream, "n": samples})

    def end_stream(self, stream: int) -> None:
        """Stop an utterance: the host is told to cancel it unless it had ended."""
        self._thread.call_soon(self._end_stream, stream)

    def send(self, header: Header) -> None:
        """A message that needs no answer (closing a state); dropped while disconnected."""
        self._thread.call_soon(self._send, header)

    def close(self) -> None:
        """Disconnect and stop the loop thread (the host frees this worker's states)."""
        if self._closing:
            return
        self._closing = True
        self._ready.clear()
        self._reason = "the engine is closed"
        self._watcher.cancel()
        with contextlib.suppress(Exception):  # a host that hangs is left behind
            self._thread.stop(self._shutdown())

    # --- the loop --------------------------------------------------------------------------

    async def _request(
        self, header: Header, payload: bytes, timeout: float | None = None
    ) -> tuple[Header, int]:
        writer = self._writer
        if writer is None or not self._ready.is_set():
            raise EngineUnavailable(self._reason)
        generation = self.generation
        request = next(self._ids)
        answer = self._loop.create_future()
        self._pending[request] = answer
        try:
            writer.write(encode({**header, "req": request}, payload))
            await writer.drain()
            reply = await asyncio.wait_for(answer, timeout)
        except ConnectionError as exc:
            raise EngineUnavailable(f"lost the model host at {self.path} ({exc})") from exc
        except TimeoutError as exc:
            raise EngineUnavailable(f"the model host did not answer in {timeout:g} s") from exc
        finally:
            self._pending.pop(request, None)
        if reply["t"] == "refused":
            raise HostRefused(str(reply.get("error")), str(reply.get("code", "refused")))
        return reply, generation

    def _start_stream(
        self, stream: int, header: Header, frames: FrameQueue, generation: int
    ) -> None:
        if self._writer is None or generation != self.generation or not self._ready.is_set():
            frames.end(EngineUnavailable(self._reason or "the model host restarted"))
            return
        self._streams[stream] = frames
        self._send(header)

    def _send_hop(
        self, future: Future[np.ndarray], state: int, generation: int, payload: bytes
    ) -> None:
        if not future.set_running_or_notify_cancel():
            return  # its session gave up on it
        writer = self._writer
        if writer is None or generation != self.generation or not self._ready.is_set():
            future.set_exception(EngineUnavailable(self._reason or "the model host restarted"))
            return
        hop = self._hops.add(future)
        writer.write(encode({"t": "hop", "h": hop, "state": state}, payload))

    def _end_stream(self, stream: int) -> None:
        frames = self._streams.pop(stream, None)
        if frames is not None:
            frames.end()
            self._send({"t": "cancel", "s": stream})

    def _send(self, header: Header) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(encode(header))

    async def _watch(self) -> None:
        while not self._closing:
            try:
                reader, writer = await asyncio.open_unix_connection(self.path)
            except OSError as exc:
                self._down(f"the model host at {self.path} does not answer ({exc.strerror})")
                await asyncio.sleep(RETRY_S)
                continue
            try:
                await self._serve(reader, writer)
                reason = "it closed the connection"
            except (OSError, ProtocolError, ValueError, KeyError, TypeError) as exc:
                reason = f"{type(exc).__name__}: {exc}"
            self._down(f"lost the model host at {self.path} ({reason})")
            await asyncio.sleep(RETRY_S)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            first = await asyncio.wait_for(read_message(reader), HELLO_TIMEOUT_S)
            if first is None or first[0]["t"] != "hello":
                raise ProtocolError("the host did not start with hello")
            hello = first[0]
            self._ring = AudioRing.attach(str(hello["ring"]))
            self._writer = writer
            self.connection = int(hello.get("connection", 0))
            self.generation += 1
            if not self._greeted.is_set():
                self.hello = hello
                self._greeted.set()
            self._reason = ""
            self._ready.set()
            log.info("connected to the model host at %s", self.path)
            while (message := await read_message(reader)) is not None:
                self._dispatch(*message)
        finally:
            writer.close()

    def _dispatch(self, header: Header, payload: bytes) -> None:
        kind = header["t"]
        if kind == "out":
            self._hops.answer(int(header["h"]), header, payload)
        elif kind in ("opened", "done", "refused"):
            answer = self._pending.get(int(header["req"]))
            if answer is not None and not answer.done():
                answer.set_result(header)
        elif kind == "audio":
            self._audio(int(header["s"]), int(header["at"]), int(header["n"]))
        elif kind == "end":
            frames = self._streams.pop(int(header["s"]), None)
            if frames is not None:
                error = header.get("error")
                frames.end(HostFailed(str(error)) if error else None)
        else:
            raise ProtocolError(f"unknown message {kind!r} from the host")

    def _audio(self, stream: int, position: int, size: int) -> None:
        """Copy a chunk out of the ring (even for a stream cancelled meanwhile: the ring is
        read in order) and report progress when due."""
        assert self._ring is not None
        samples = self._ring.read(position, size)
        frames = self._streams.get(stream)
        if frames is not None:
            frames.push(samples)
        if self._ring.report_due():
            self._send({"t": "read", "at": self._ring.consumed})

    def _down(self, reason: str) -> None:
        if self._ready.is_set():
            self.losses += 1
            log.warning("%s; reconnecting", reason)
        elif reason != self._reason:
            log.warning("%s; retrying", reason)
        self._ready.clear()
        self._reason = reason
        self._writer = None
        for answer in self._pending.values():
            if not answer.done():
                answer.set_exception(EngineUnavailable(reason))
        self._pending.clear()
        self._hops.fail_all(EngineUnavailable(reason))
        for frames in self._streams.values():
            frames.end(EngineUnavailable(f"{reason}; the utterance was cut short"))
        self._streams.clear()
        if self._ring is not None:
            self._ring.close()
            self._ring = None

    async def _shutdown(self) -> None:
        self._down("the engine is closed")
        current = asyncio.current_task()
        tasks = [task for task in asyncio.all_tasks() if task is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
