"""One media worker's connection to the host: its sessions' states and utterances.

Messages (``media.engines.hosted.wire``), worker to host:

- ``open {req, engine, options}`` -> ``opened {req, state}``: a session's state;
- ``prompt {req, state, rate, transcript}`` + float32 samples -> ``done {req}``: a voice;
- ``close {state}``: the session ended;
- ``speak {s, state, text}``: an utterance, answered by ``audio {s, at, n}`` messages (the
  chunk's place in the ring) and one ``end {s, error?}``;
- ``cancel {s}``, ``took {s, n}`` (samples of ``s`` taken), ``read {at}`` (ring consumed);
- ``hop {h, state}`` + float32 samples (a transform session's chunk, at most a second) ->
  ``out {h}`` + the engine's float32 output, or ``out {h, error, code}``: a batched engine
  takes it on this loop into its batch loop, which every worker's sessions share; another
  engine runs it on the session's serial queue of the compute threads;
- ``reset {req, state}`` -> ``done {req}``: a transform state after a failed chunk;
- ``join {connection}``: this connection carries chunks (``hop``) for the states of the
  worker's connection of that number (the hello's ``connection``); a worker sends its
  transform chunks from its server loop on such a connection of their own, so they are
  not handed to and from the thread that reads its main connection.

A request that cannot be served is answered ``refused {req, error, code}``; a message
that is not one of these is logged and dropped; one that breaks the wire format ends this
connection only. When the connection ends, however it ends (the worker exited or was
killed: the kernel closes its socket), every utterance is cancelled and every state is
closed at once, so a worker that dies frees its rows in the host's batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from media.engines.base import (
    BatchedTransformEngine,
    ChunkFuture,
    Engine,
    EngineError,
    SpeakEngine,
    TransformEngine,
)
from media.engines.hosted.ring import AudioRing
from media.engines.hosted.wire import Header, ProtocolError, encode, read_message
from media.pipeline.executor import SerialExecutor
from server.host.utterance import HostedUtterance

log = logging.getLogger(__name__)

RING_BYTES = 4 * 1024 * 1024  # 43 s of 24 kHz float32: far more than credit lets out
MAX_HOP_BYTES = 48_000 * 4  # a second of 48 kHz float32: a chunk is one 20 ms frame
MAX_HOPS_IN_FLIGHT = 2  # a session's pipeline waits for each chunk before the next


class Refused(Exception):
    """A request the host does not serve; ``code`` names the kind for the worker."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(eq=False)
class HostedSession:
    engine: Engine[Any]
    state: Any
    calls: SerialExecutor
    options: dict[str, Any] = field(default_factory=dict)
    utterances: set[int] = field(default_factory=set)
    hops_in_flight: int = 0


class WorkerConnection:
    """The sessions of one worker, served until its connection ends."""

    def __init__(
        self,
        engines: dict[str, Engine[Any]],
        pool: Executor,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        number: int = 0,
        peers: Mapping[int, WorkerConnection] | None = None,
    ) -> None:
        self.number = number  # the hello's ``connection``: what a ``join`` names
        self._peers = peers if peers is not None else {}
        self._joined: WorkerConnection | None = None  # the connection whose states these are
        self._engines = engines
        self._pool = pool
        self._reader = reader
        self._writer = writer
        self.ring = AudioRing.create(RING_BYTES)
        self._ring_room = asyncio.Event()
        self._sending = asyncio.Lock()  # ring writes and their messages stay in order
        self.sessions: dict[int, HostedSession] = {}
        self.utterances: dict[int, tuple[HostedUtterance, asyncio.Task[None]]] = {}
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ended = False
        # Chunks an engine's thread finished, for this loop to answer: one wake-up of the
        # loop for all the chunks of a batch step, not one each.
        self._finished: deque[tuple[int, HostedSession, ChunkFuture]] = deque()
        self._finished_lock = threading.Lock()
        self._answering = False

    def send(self, header: Header) -> None:
        if not self._writer.is_closing():
            self._writer.write(encode(header))

    async def serve(self, hello: Header) -> None:
        """Greet, then serve messages until the worker goes; then free everything."""
        try:
            self.send({**hello, "ring": self.ring.name, "connection": self.number})
            while (message := await read_message(self._reader)) is not None:
                self._dispatch(*message)
        except (ProtocolError, ConnectionError) as exc:
            log.warning("model host: a worker's connection ended: %s", exc)
        finally:
            await self._free()

    # --- messages --------------------------------------------------------------------------

    def _dispatch(self, header: Header, payload: bytes) -> None:
        kind = header["t"]
        try:
            if kind == "hop":
                self._hop(int(header["h"]), int(header["state"]), payload)
            elif kind in ("open", "prompt", "reset"):
                self._start(self._answer(header, payload))
            elif kind == "speak":
                self._speak(int(header["s"]), int(header["state"]), str(header["text"]))
            elif kind == "cancel":
                self._stop(int(header["s"]))
            elif kind == "took":
                entry = self.utterances.get(int(header["s"]))
                if entry is not None:
                    entry[0].took(int(header["n"]))
            elif kind == "read":
                self._ring_room.set()
            elif kind == "close":
                self._start(self._close_session(int(header["state"])))
            elif kind == "join":
                self._join(int(header["connection"]))
            else:
                raise ValueError(f"unknown message type {kind!r}")
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("model host: dropped a bad %r message from a worker: %s", kind, exc)

    async def _answer(self, header: Header, payload: bytes) -> None:
        request = header.get("req")
        try:
            if header["t"] == "open":
                state = await self._open(str(header["engine"]), header.get("options") or {})
                self.send({"t": "opened", "req": request, "state": state})
            elif header["t"] == "reset":
                await self._reset(header)
                self.send({"t": "done", "req": request})
            else:
                await self._prompt(header, payload)
                self.send({"t": "done", "req": request})
        except Refused as exc:
            self.send({"t": "refused", "req": request, "error": str(exc), "code": exc.code})
        except (KeyError, TypeError, ValueError) as exc:
            error = f"a malformed {header['t']} request ({type(exc).__name__}: {exc})"
            self.send({"t": "refused", "req": request, "error": error, "code": "bad_request"})

    async def _open(self, name: str, options: Any) -> int:
        engine = self._engines.get(name)
        if engine is None:
            served = ", ".join(self._engines) or "none"
            raise Refused(f"the host serves no engine '{name}' (it serves: {served})", "engine")
        if not isinstance(options, dict):
            raise Refused("options must be an object", "bad_options")
        try:
            options = engine.validate_options(options)
        except EngineError as exc:
            raise Refused(str(exc), "bad_options") from exc
        calls = SerialExecutor(self._pool)
        try:
            state = await asyncio.wrap_future(calls.submit(engine.new_state, options))
        except Exception as exc:  # the engine is full, or failed: the worker hears why
            log.warning("model host: a %s state could not be opened: %s", name, exc)
            raise Refused(f"{name} could not open a state ({exc})", "engine_failed") from exc
        session = next(self._ids)
        self.sessions[session] = HostedSession(engine, state, calls, dict(options))
        return session

    def _session(self, header: Header) -> HostedSession:
        session = self.sessions.get(int(header["state"]))
        if session is None:
            raise Refused(f"no session state {header['state']} on this host", "unknown_state")
        return session

    async def _reset(self, header: Header) -> None:
        session = self._session(header)
        engine = session.engine
        if not isinstance(engine, TransformEngine):
            raise Refused(f"state {header['state']} is not a transform's", "unknown_state")
        call = session.calls.submit(engine.reset_state, session.state, session.options)
        try:
            session.state = await asyncio.wrap_future(call)
        except Exception as exc:
            raise Refused(
                f"{engine.name} could not reset the state ({exc})", "engine_failed"
            ) from exc

    async def _prompt(self, header: Header, payload: bytes) -> None:
        session = self._session(header)
        rate, transcript = int(header["rate"]), str(header["transcript"])
        if len(payload) % 4:
            raise Refused("the prompt's samples are not float32", "bad_prompt")
        audio = np.frombuffer(payload, np.float32).copy()
        engine = session.engine
        if not isinstance(engine, SpeakEngine):
            raise Refused(f"state {header['state']} is not a speak engine's", "bad_prompt")
        call = session.calls.submit(engine.set_prompt, session.state, audio, rate, transcript)
        try:
            await asyncio.wrap_future(call)
        except (ValueError, EngineError) as exc:
            raise Refused(str(exc), "bad_prompt") from exc

    def _speak(self, stream: int, state: int, text: str) -> None:
        session = self.sessions.get(state)
        if session is None or stream in self.utterances:
            self.send({"t": "end", "s": stream, "error": f"no session state {state} here"})
            return
        if not isinstance(session.engine, SpeakEngine):
            self.send({"t": "end", "s": stream, "error": f"state {state} does not speak"})
            return
        utterance = HostedUtterance(
            session.engine, session.state, session.calls, text, self._send_audio_of(stream)
        )
        task = asyncio.create_task(self._run(stream, state, utterance))
        self.utterances[stream] = (utterance, task)
        session.utterances.add(stream)

    def _hop(self, hop: int, state: int, payload: bytes) -> None:
        """Hand a transform session's chunk to its engine; ``out`` goes back when it is done."""
        session = self.sessions.get(state)
        if session is None or not isinstance(session.engine, TransformEngine):
            self._hop_refused(hop, f"no transform state {state} on this host", "unknown_state")
        elif len(payload) % 4 or len(payload) > MAX_HOP_BYTES:
            self._hop_refused(hop, f"a chunk of {len(payload)} bytes is not one", "bad_hop")
        elif session.hops_in_flight >= MAX_HOPS_IN_FLIGHT:
            self._hop_refused(hop, f"{MAX_HOPS_IN_FLIGHT} chunks of the state wait already", "busy")
        else:
            chunk = np.frombuffer(payload, np.float32)
            try:
                future = self._submit_hop(session, session.engine, chunk)
            except Exception as exc:  # full, or closing: this chunk fails, the host goes on
                self._hop_refused(hop, str(exc) or type(exc).__name__, "engine_failed")
                return
            session.hops_in_flight += 1
            if isinstance(future, asyncio.Future):  # answered on this loop
                future.add_done_callback(lambda done: self._hop_done(hop, session, done))
            else:
                loop = asyncio.get_running_loop()
                future.add_done_callback(lambda done: self._hop_finished(loop, hop, session, done))

    def _hop_finished(
        self, loop: asyncio.AbstractEventLoop, hop: int, session: HostedSession, done: ChunkFuture
    ) -> None:
        """On the engine's thread: queue the answer; wake the loop if it is not already."""
        with self._finished_lock:
            self._finished.append((hop, session, done))
            if self._answering:
                return
            self._answering = True
        with contextlib.suppress(RuntimeError):  # the host is stopping
            loop.call_soon_threadsafe(self._answer_finished)

    def _answer_finished(self) -> None:
        with self._finished_lock:
            finished, self._finished = self._finished, deque()
            self._answering = False
        for hop, session, done in finished:
            self._hop_done(hop, session, done)

    def _join(self, number: int) -> None:
        target = self._peers.get(number)
        if target is None or target is self or target._joined is not None or self.sessions:
            log.warning("model host: a worker joined connection %d, which it cannot", number)
            self._writer.close()
            return
        self._joined = target
        self.sessions = target.sessions  # the chunks name the states opened there

    def _submit_hop(
        self, session: HostedSession, engine: TransformEngine[Any], chunk: np.ndarray
    ) -> ChunkFuture:
        if isinstance(engine, BatchedTransformEngine):
            return engine.submit(session.state, chunk)  # its batch loop's thread runs it

        def process() -> np.ndarray:
            out, session.state = engine.process(session.state, chunk)
            return out

        return session.calls.submit(process)

    def _hop_done(self, hop: int, session: HostedSession, done: ChunkFuture) -> None:
        session.hops_in_flight -= 1
        if done.cancelled():
            self._hop_refused(hop, "the state was closed", "closed")
        elif (error := done.exception()) is not None:
            log.warning("model host: a %s chunk failed: %s", session.engine.name, error)
            self._hop_refused(hop, str(error) or type(error).__name__, "engine_failed")
        elif not self._writer.is_closing():
            out = np.ascontiguousarray(done.result(), np.float32)
            self._writer.write(encode({"t": "out", "h": hop}, out.tobytes()))

    def _hop_refused(self, hop: int, error: str, code: str) -> None:
        self.send({"t": "out", "h": hop, "error": error, "code": code})

    def _send_audio_of(self, stream: int) -> Any:
        async def send(chunk: np.ndarray) -> None:
            await self._send_audio(stream, chunk)

        return send

    async def _run(self, stream: int, state: int, utterance: HostedUtterance) -> None:
        error: str | None = None
        try:
            await utterance.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the engine's failure ends this utterance only
            log.warning(
                "model host: an utterance failed: %s",
                exc,
                exc_info=not isinstance(exc, EngineError),
            )
            error = str(exc) or type(exc).__name__
        finally:
            self.utterances.pop(stream, None)
            session = self.sessions.get(state)
            if session is not None:
                session.utterances.discard(stream)
        self.send({"t": "end", "s": stream, **({"error": error} if error else {})})

    def _stop(self, stream: int) -> None:
        entry = self.utterances.get(stream)
        if entry is not None:
            entry[0].stop()

    async def _send_audio(self, stream: int, chunk: np.ndarray) -> None:
        """Put ``chunk`` in the ring (waiting for the reader while it is full) and say where."""
        most = self.ring.capacity // 2 // 4
        async with self._sending:
            for start in range(0, len(chunk), most):
                part = chunk[start : start + most]
                while (placed := self.ring.write(part)) is None:
                    if self._ended:
                        return
                    self._ring_room.clear()
                    await self._ring_room.wait()
                self.send({"t": "audio", "s": stream, "at": placed[0], "n": placed[1]})

    async def _close_session(self, state: int) -> None:
        session = self.sessions.pop(state, None)
        if session is None:
            return
        for stream in list(session.utterances):
            self._stop(stream)
        await asyncio.wrap_future(session.calls.submit(session.engine.close_state, session.state))

    # --- the end ---------------------------------------------------------------------------

    def close(self) -> None:
        """End the connection (the host is stopping); ``serve`` then frees everything."""
        self._writer.close()

    def _start(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _free(self) -> None:
        """Cancel every utterance, close every state (those of the connection it joined
        stay: they are that one's to close), remove the ring."""
        self._ended = True
        if self._joined is not None:
            self.sessions = {}
        for utterance, _ in self.utterances.values():
            utterance.stop()
        self._ring_room.set()
        running = [task for _, task in self.utterances.values()]
        await asyncio.gather(*running, *self._tasks, return_exceptions=True)
        for state in list(self.sessions):
            with contextlib.suppress(Exception):
                await self._close_session(state)
        self._writer.close()
        self.ring.close()
